"""Issue 25, point 5: the remaining bad inputs. Each is one line on stderr and exit 2 before anything is
built, or, where the input is legitimate but surprising, one honest line (a warning or a statement)."""

from __future__ import annotations

import json
import re

import pytest

from graphdiag.cli.main import main
from graphdiag.scenario import list_scenarios

from support.cli import QUICK, one_line


_one_line = one_line


def _warnings(err: str) -> list[str]:
    return [l for l in err.splitlines() if l.startswith("graphdiag: warning:")]


@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to build the model fails the test: these errors must come first."""
    import graphdiag.runner as runner
    monkeypatch.setattr(runner, "build_model", lambda *a, **kw: pytest.fail("a model was built"))


def _scenario(tmp_path, name: str, body: str):
    p = tmp_path / f"{name}.toml"
    p.write_text(f'name = "{name}"\ndescription = "a test scenario"\n{body}')
    return p


# -- scenarios ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e300", "86401"])
def test_an_absurd_idle_time_is_refused_at_load(capsys, tmp_path, no_model, value):
    p = _scenario(tmp_path, "idle", f"timeline = [ {{ at_step = 3, idle_s = {value} }} ]\n[run]\nsteps = 6\n")
    line = _one_line(capsys, ["run", *QUICK, "--scenario", str(p)])
    assert f"{p}:3:" in line and "idle_s" in line


def test_a_day_of_idle_time_is_accepted(tmp_path):
    from graphdiag.scenario import load_file
    p = _scenario(tmp_path, "idle", "timeline = [ { at_step = 3, idle_s = 86400 } ]\n[run]\nsteps = 6\n")
    assert load_file(p).timeline[0].idle_s == 86400.0


def test_a_scenario_without_expectations_says_so_instead_of_claiming_they_hold(capsys, tmp_path):
    p = _scenario(tmp_path, "noexp", "[run]\nsteps = 2\n")
    assert main(["run", *QUICK, "--scenario", str(p)]) == 0
    out = capsys.readouterr().out
    assert "scenario noexp: no expectations to check" in out and "every expectation holds" not in out


def test_an_unknown_refusal_reason_is_refused_at_load_listing_the_valid_ones(capsys, tmp_path, no_model):
    p = _scenario(tmp_path, "badreason", '[run]\nsteps = 2\n[expect]\nrefusal_reasons = ["TOPOLOGY_CHANGD"]\n')
    line = _one_line(capsys, ["run", *QUICK, "--scenario", str(p)])
    assert f"{p}:6:" in line and "'TOPOLOGY_CHANGD'" in line and "TOPOLOGY_CHANGED" in line
    assert "PARAMETERS_CHANGED" in line and "SUCCESS" not in line


def test_the_refusal_reasons_a_scenario_may_expect_are_the_drivers():
    from graphdiag.backends.drivers.base import UpdateResult
    from graphdiag.scenario import REFUSAL_REASONS
    assert REFUSAL_REASONS == tuple(r.name for r in UpdateResult if r is not UpdateResult.SUCCESS)


@pytest.mark.parametrize("a,b", [("batch = 2", "batch = 3"), ("batch = 2", "alternate_batches = [1, 2]"),
                                 ("prefill = 8", "batch = 2"), ("alternate_batches = [1, 2]", "prefill = 8"),
                                 ("idle_s = 11", "idle_s = 1"), ("new_arena_every = 2", "new_arena_every = 3")])
def test_two_timeline_entries_that_override_each_other_are_refused_naming_both_lines(capsys, tmp_path,
                                                                                     no_model, a, b):
    p = _scenario(tmp_path, "twice", f"timeline = [\n  {{ at_step = 3, {a} }},\n  {{ at_step = 4, batch = 1 }},\n"
                                     f"  {{ at_step = 3, {b} }},\n]\n[run]\nsteps = 6\n")
    line = _one_line(capsys, ["run", *QUICK, "--scenario", str(p)])
    assert f"{p}:6:" in line and "line 4" in line and "at_step 3" in line


def test_entries_of_different_kinds_may_share_a_step(tmp_path):
    from graphdiag.scenario import load_file
    p = _scenario(tmp_path, "shared", "timeline = [\n  { at_step = 3, batch = 2 },\n  { at_step = 3, idle_s = 11 },\n"
                                      "  { at_step = 3, separate_arena_batch = 2 },\n]\n[run]\nsteps = 6\n")
    assert len(load_file(p).timeline) == 3


def test_the_shipped_scenarios_still_load():
    assert len(list_scenarios()) >= 20


def test_two_scenario_flags_are_refused(capsys, no_model):
    line = _one_line(capsys, ["run", "--scenario", "batch-change", "--scenario", "steady-decode"])
    assert "--scenario" in line and "batch-change" in line and "steady-decode" in line


def test_batch_on_a_scenario_whose_timeline_sets_batches_is_refused(capsys, no_model):
    line = _one_line(capsys, ["run", "--scenario", "batch-change", "--batch", "2"])
    assert re.search(r"batch-change\.toml:\d+", line) and "--batch 2" in line


def test_a_flag_overriding_a_scenario_setting_is_named_in_one_warning(capsys):
    assert main(["run", "--backend", "sim", "--scenario", "steady-decode", "--steps", "3", "--json"]) in (0, 1)
    ws = _warnings(capsys.readouterr().err)
    assert len(ws) == 1 and "--steps 3" in ws[0] and re.search(r"steady-decode\.toml:\d+", ws[0]), ws


def test_a_flag_overriding_a_scenario_env_knob_is_named_in_one_warning(capsys, tmp_path):
    p = _scenario(tmp_path, "chunks", '[run]\nsteps = 2\n[env]\nGGML_CUDA_GRAPH_CHUNK_SIZE = "64"\n')
    assert main(["run", *QUICK, "--scenario", str(p), "--chunk-size", "0", "--json"]) == 0
    ws = _warnings(capsys.readouterr().err)
    assert len(ws) == 1 and "--chunk-size 0" in ws[0] and "GGML_CUDA_GRAPH_CHUNK_SIZE='64'" in ws[0], ws
    assert f"{p}:6" in ws[0]


def test_a_flag_the_scenario_does_not_set_is_no_warning(capsys):
    assert main(["run", "--scenario", "steady-decode", "--backend", "sim", "--json"]) == 0
    assert _warnings(capsys.readouterr().err) == []


# -- run settings -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("split", ["1e308,1e308", "3e38,3e38", "1e-50,1e-50"])
def test_a_tensor_split_a_float_cannot_hold_is_refused(capsys, no_model, split):
    line = _one_line(capsys, ["run", *QUICK, "--devices", "2", "--tensor-split", split])
    assert "tensor-split" in line and "32-bit float" in line


def test_concurrent_streams_on_several_devices_at_d99724f2_is_refused_with_the_reason(capsys, no_model):
    line = _one_line(capsys, ["run", *QUICK, "--devices", "2", "--concurrent-streams", "--upstream", "d99724f2"])
    assert "--concurrent-streams" in line and "one device" in line and "d99724f2" in line


def test_concurrent_streams_from_the_environment_on_several_devices_at_d99724f2_is_a_warning(capsys, monkeypatch):
    monkeypatch.setenv("GGML_CUDA_GRAPH_OPT", "1")
    assert main(["run", *QUICK, "--devices", "2", "--steps", "1", "--json", "--upstream", "d99724f2"]) == 0
    ws = _warnings(capsys.readouterr().err)
    assert len(ws) == 1 and "GGML_CUDA_GRAPH_OPT" in ws[0] and "one device" in ws[0], ws


def test_concurrent_streams_on_several_devices_at_0c1e57098_is_no_warning(capsys, monkeypatch):
    monkeypatch.setenv("GGML_CUDA_GRAPH_OPT", "1")
    assert main(["run", *QUICK, "--devices", "2", "--steps", "1", "--json"]) == 0
    assert _warnings(capsys.readouterr().err) == []


@pytest.mark.parametrize("value,read", [("yes", "off"), ("off", "off"), ("true", "off"), ("2", "on"),
                                        ("1x", "on")])
def test_a_pdl_value_atoi_reads_surprisingly_is_said_how_it_is_read(capsys, monkeypatch, value, read):
    monkeypatch.setenv("GGML_CUDA_PDL", value)
    assert main(["run", *QUICK, "--steps", "1", "--json"]) == 0
    captured = capsys.readouterr()
    ws = _warnings(captured.err)
    assert len(ws) == 1 and f"GGML_CUDA_PDL={value!r}" in ws[0] and f"PDL {read}" in ws[0], ws
    assert json.loads(captured.out)["header"]["settings"]["pdl"] is (read == "on")   # as llama.cpp reads it


@pytest.mark.parametrize("value", ["0", "1", " 1"])
def test_a_plain_pdl_value_is_no_warning(capsys, monkeypatch, value):
    monkeypatch.setenv("GGML_CUDA_PDL", value)
    assert main(["run", *QUICK, "--steps", "1", "--json"]) == 0
    assert _warnings(capsys.readouterr().err) == []


# -- bench ledger -------------------------------------------------------------------------------------------
@pytest.fixture
def no_ledger_bench(monkeypatch):
    import graphdiag.bench as bench
    monkeypatch.setattr(bench, "ledger_bench", lambda *a, **kw: pytest.fail("the benchmark ran"))


@pytest.mark.parametrize("argv,needle", [
    (["--reps", "1000000000"], "--reps"),
    (["--model", "tiny", "--batch", "100000000"], "--batch 100000000"),
    (["--model", "tiny", "--batch", "4097"], "n_ctx 4096"),
])
def test_bench_ledger_refuses_absurd_sizes_before_it_starts(capsys, no_ledger_bench, argv, needle):
    assert needle in _one_line(capsys, ["bench", "ledger", *argv])


# -- records: report, whatif, --plot ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The text of a real simulated run's record (whatif needs its fingerprints): steps 0-5."""
    path = tmp_path_factory.mktemp("rec") / "run.jsonl"
    assert main(["run", *QUICK, "--steps", "4", "--json", "--events", str(path)]) == 0
    return path.read_text()


@pytest.fixture
def record(recorded, tmp_path):
    """make(edit): the recorded run with `edit(objs)` applied to its event lines (JSON objects)."""
    def make(edit=None, name="r.jsonl"):
        head, *rest = recorded.splitlines()
        objs = [json.loads(l) for l in rest]
        if edit is not None:
            edit(objs)
        path = tmp_path / name
        path.write_text("\n".join([head, *(json.dumps(o) for o in objs)]) + "\n")
        return path
    return make


def _first(objs, kind):
    return next(o for o in objs if o["kind"] == kind)


def _swap_steps(objs):
    i = next(i for i, o in enumerate(objs) if o["step"] == 1)
    j = next(j for j, o in enumerate(objs) if o["step"] == 3)
    objs[i], objs[j] = objs[j], objs[i]


BAD_RECORDS = [
    (_swap_steps, r":\d+: step 1 comes after step 3"),
    (lambda objs: _first(objs, "uid_hit").update(step=-7), r":\d+: step -7 "),
    (lambda objs: _first(objs, "uid_hit").update(step=10**12), r":\d+: step 1000000000000 is beyond"),
    (lambda objs: _first(objs, "run_ended").update(status="exploded"), r":\d+: .*status 'exploded'.*complete"),
    (lambda objs: _first(objs, "run_ended").pop("status"), r":\d+: malformed run_ended event \(no status\)"),
    (lambda objs: _first(objs, "step_finished").pop("duration_ns"), r"malformed step_finished event \(no durat"),
    (lambda objs: _first(objs, "uid_hit").pop("step"), r"malformed uid_hit event \(no step\)"),
]


@pytest.mark.parametrize("edit,message", BAD_RECORDS)
@pytest.mark.parametrize("command", ["report", "whatif"])
def test_a_record_with_bad_steps_statuses_or_missing_fields_is_one_line(capsys, record, edit, message, command):
    path = record(edit)
    argv = [command, str(path)] + (["--key", "content-hash"] if command == "whatif" else [])
    line = _one_line(capsys, argv)
    assert str(path) in line and re.search(message, line), line


def test_a_record_older_fields_may_be_missing_from_still_reads(record):
    """Fields added to an event type after schema 1 was first written (device, uid_miss's fingerprints)
    read as their defaults, as before."""
    from graphdiag.report.record import read_record
    path = record(lambda objs: [o.pop("first_ne", None) for o in objs])
    read_record(path)


def test_whatif_on_a_record_with_no_steps_is_one_line(capsys, record):
    path = record(lambda objs: objs.clear())
    line = _one_line(capsys, ["whatif", str(path), "--key", "content-hash"])
    assert str(path) in line and "no graph_compute calls" in line


def test_whatif_on_a_record_with_no_end_says_so(capsys, record):
    path = record(lambda objs: objs.pop())
    assert main(["whatif", str(path), "--key", "content-hash"]) == 0
    captured = capsys.readouterr()
    ws = _warnings(captured.err)
    assert len(ws) == 1 and "no run end" in ws[0] and str(path) in ws[0], ws
    assert "replays" in captured.out


def test_plot_of_a_record_with_no_steps_is_one_line_and_draws_nothing(capsys, record, tmp_path):
    pytest.importorskip("matplotlib")
    path, out = record(lambda objs: objs.clear()), tmp_path / "p.png"
    line = _one_line(capsys, ["report", str(path), "--plot", str(out)])
    assert "nothing to plot" in line and str(path) in line and not out.exists()


def test_plot_says_which_file_it_wrote(capsys, record, tmp_path, recwarn):
    pytest.importorskip("matplotlib")
    path, out = record(), tmp_path / "p.svg"
    assert main(["report", str(path), "--plot", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)                          # --json stays JSON: the line goes to stderr
    assert re.search(rf"plot of {re.escape(str(path))} \(\d+ steps.*\) written to {re.escape(str(out))}",
                     captured.err), captured.err
    assert not [w for w in recwarn if "matplotlib" in str(w.filename) or "legend" in str(w.message)]

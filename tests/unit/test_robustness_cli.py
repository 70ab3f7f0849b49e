"""Issue 10, points 1-4 and 6: bad input is one line and exit 2, bugs exit 3 and ask for a report, every run's
end is recorded, the results users asked for are visible, and the README's test command shows its summary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.report.record import read_record, write_record
from support import synth

ROOT = Path(__file__).resolve().parents[2]
from support.cli import QUICK, one_line


_one_line = one_line


# -- 1. no traceback for bad input --------------------------------------------------------------------------
@pytest.mark.parametrize("argv,needle", [
    (["run", "--seed", "-1"], "seed must be between 0"),
    (["run", "--events", "/no/such/dir/run.jsonl", "--steps", "1"], "No such file or directory"),
    (["run", "--events", "/dev/full", "--steps", "1", "--prompt-tokens", "4"], "No space left on device"),
    (["run", "--events", "/dev/null/run.jsonl", "--steps", "1"], "cannot write the event record"),
    (["run", "--prompt-tokens", str(10**12)], "KV cells"),
    (["run", "--batch", str(10**12)], "KV cells"),
    (["run", "--steps", str(10**12)], "KV cells"),
    (["run", "--steps", str(10**7)], "KV cells"),
])
def test_bad_run_input_is_one_line_and_exit_2(capsys, argv, needle):
    assert needle in _one_line(capsys, argv)


def test_unwritable_events_directory_is_one_line(capsys, tmp_path, monkeypatch):
    real_open = Path.open

    def refuse(self, *a, **kw):
        if self.name == "run.jsonl":
            raise PermissionError(13, "Permission denied")
        return real_open(self, *a, **kw)
    monkeypatch.setattr(Path, "open", refuse)
    assert "Permission denied" in _one_line(capsys, ["run", "--events", str(tmp_path / "run.jsonl")])


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_directory_is_one_line(capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    assert "Permission denied" in _one_line(capsys, ["run", "--events", str(ro / "run.jsonl")])


@pytest.mark.parametrize("field,value", [("step", "abc"), ("duration_ns", "fast"), ("tokens", ["x"]),
                                         ("mode", 3)])
@pytest.mark.parametrize("command", ["report", "diff"])
def test_record_fields_of_the_wrong_type_are_one_line(capsys, tmp_path, field, value, command):
    path = tmp_path / "bad.jsonl"
    write_record(path, *synth.steady_decode(n_replays=1))
    lines = path.read_text().splitlines()
    i = next(i for i, l in enumerate(lines) if '"kind":"step_finished"' in l)
    obj = json.loads(lines[i])
    obj[field] = value
    lines[i] = json.dumps(obj)
    path.write_text("\n".join(lines) + "\n")
    argv = [command, str(path)] + ([str(path)] if command == "diff" else [])
    line = _one_line(capsys, argv)
    assert f"bad.jsonl:{i + 1}" in line and field in line


def test_memory_error_is_bad_input_not_a_traceback(capsys, monkeypatch):
    import graphdiag.runner as runner
    monkeypatch.setattr(runner, "build_model", lambda *a, **kw: (_ for _ in ()).throw(MemoryError()))
    assert "out of host memory" in _one_line(capsys, ["run", *QUICK, "--steps", "1"])


@pytest.mark.parametrize("module, package", [("nvtx", "nvtx"), ("cuda.bindings", "cuda-python")])
def test_a_required_dependency_missing_is_one_line_not_a_bug(capsys, monkeypatch, module, package):
    import graphdiag.runner as runner

    def missing(*a, **kw):
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    monkeypatch.setattr(runner, "make_header", missing)
    line = _one_line(capsys, ["run", *QUICK, "--steps", "1"])
    assert line.startswith(f"graphdiag: error: {package}, which graphdiag requires, is not installed")
    assert "bug" not in line


def test_a_missing_module_graphdiag_does_not_require_is_still_a_bug(capsys, monkeypatch):
    import graphdiag.runner as runner

    def missing(*a, **kw):
        raise ModuleNotFoundError("No module named 'graphdiag.nowhere'", name="graphdiag.nowhere")
    monkeypatch.setattr(runner, "make_header", missing)
    monkeypatch.delenv("GRAPHDIAG_DEBUG", raising=False)
    assert "internal error" in _one_line(capsys, ["run", *QUICK, "--steps", "1"], code=3,
                                         prefix="graphdiag: internal error:")


def _explode(monkeypatch):
    import graphdiag.runner as runner
    monkeypatch.setattr(runner, "make_header", lambda *a, **kw: 1 / 0)


def test_an_internal_error_exits_3_and_asks_for_a_report(capsys, monkeypatch):
    monkeypatch.delenv("GRAPHDIAG_DEBUG", raising=False)
    _explode(monkeypatch)
    line = _one_line(capsys, ["run", *QUICK, "--steps", "1"], code=3, prefix="graphdiag: internal error:")
    assert "ZeroDivisionError" in line and "bug" in line and "report" in line and "--debug" in line


@pytest.mark.parametrize("how", ["env", "flag"])
def test_the_traceback_only_when_debugging(capsys, monkeypatch, how):
    _explode(monkeypatch)
    if how == "env":
        monkeypatch.setenv("GRAPHDIAG_DEBUG", "1")
    argv = (["--debug"] if how == "flag" else []) + ["run", *QUICK, "--steps", "1"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err and "internal error" in err


# -- 2. validated up front, in one place, before any model is built ----------------------------------------
@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to build the model fails the test: these errors must come first."""
    import graphdiag.runner as runner
    monkeypatch.setattr(runner, "build_model", lambda *a, **kw: pytest.fail("a model was built"))


@pytest.mark.parametrize("argv,needle", [
    (["run", "--prompt-tokens", "4000", "--steps", "200"], "n_ctx 4096"),
    (["run", "--batch", "64", "--prompt-tokens", "64", "--steps", "8"], "n_ctx 4096"),
    (["run", "--pool-cap", "1000"], "smallest cap that can work for this run: 137728 bytes"),
    (["run", "--pool-max-buffers", "-1"], "pool-max-buffers must be >= 0"),
    (["run", "--pool-cap", "-5"], "pool-cap must be >= 0"),
    (["run", "--cc", "99.0"], "not a plausible CUDA device"),
    (["run", "--cc", "0.5"], "not a plausible CUDA device"),
    (["run", "--n-cpu-moe", "2"], "has no experts"),
    (["run", "--model", "moe-tiny", "--n-cpu-moe", "5"], "has 4 layers"),
    (["run", "--backend", "cpu", "--verify"], "--verify does nothing on --backend cpu"),
    (["run", "--backend", "cpu", "--chunk-size", "8"], "--chunk-size does nothing on --backend cpu"),
    (["run", "--backend", "cpu", "--cc", "8.0"], "--cc does nothing on --backend cpu"),
    (["run", "--backend", "cpu", "--concurrent-streams"], "--concurrent-streams does nothing"),
    (["run", "--backend", "cuda", "--cc", "6.1"], "SIMULATED GPU's compute capability"),
    (["run", "-v", "--json"], "-v prints the event log"),
    (["run", "--scenario", "batch-change", "--steps", "5"], "timeline entry 1 (at_step 12)"),
])
def test_impossible_settings_fail_before_any_model_is_built(capsys, no_model, argv, needle):
    assert needle in _one_line(capsys, argv)


def test_the_smallest_pool_cap_named_is_one_that_works(capsys):
    argv = ["run", *QUICK, "--steps", "3", "--json"]
    line = _one_line(capsys, argv + ["--pool-cap", "1"])
    cap = int(re.search(r"work for this run: (\d+) bytes", line).group(1))
    assert main(argv + ["--pool-cap", str(cap)]) == 0
    capsys.readouterr()
    assert "smallest cap" in _one_line(capsys, argv + ["--pool-cap", str(cap - 1)])


def test_the_timeline_error_names_the_scenario_line(capsys, no_model):
    line = _one_line(capsys, ["run", "--scenario", "batch-change", "--steps", "5"])
    assert re.search(r"batch-change\.toml:\d+: timeline entry 1", line) and "--steps 5" in line


def test_a_setting_from_the_environment_is_named_by_its_variable(capsys, monkeypatch):
    monkeypatch.setenv("GGML_CUDA_DISABLE_GRAPHS", "1")
    assert main(["run", *QUICK, "--steps", "1", "--verify"]) == 0
    assert "graphs_disabled (env GGML_CUDA_DISABLE_GRAPHS)" in capsys.readouterr().err


def test_a_setting_from_a_scenario_env_names_file_and_line(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("GGML_CUDA_DISABLE_GRAPHS", raising=False)
    sc = tmp_path / "envoff.toml"
    sc.write_text('name = "envoff"\ndescription = "graphs off from [env]"\n[run]\nsteps = 1\nprompt_tokens = 4\n'
                  '[env]\nGGML_CUDA_DISABLE_GRAPHS = "1"\n')
    assert main(["run", "--scenario", str(sc), "--backend", "sim", "--verify"]) == 0
    err = capsys.readouterr().err
    assert "env GGML_CUDA_DISABLE_GRAPHS, set in" in err and "envoff.toml:7" in err


def test_a_gpu_only_option_from_a_scenario_on_cpu_is_a_loud_warning(capsys, tmp_path):
    sc = tmp_path / "cpuchunk.toml"
    sc.write_text('name = "cpuchunk"\ndescription = "chunk size on the CPU"\n[run]\nsteps = 1\n'
                  'prompt_tokens = 4\nchunk_size = 8\n')
    assert main(["run", "--scenario", str(sc), "--backend", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "warning: chunk_size (" in err and "cpuchunk.toml:6" in err and "does nothing on --backend cpu" in err


def test_the_plan_is_lazy():
    from graphdiag.config import RunConfig
    from graphdiag.plan import plan_steps
    plan = plan_steps(RunConfig(steps=10_000_000, batch=4))
    assert len(plan) == 10_000_004 and not isinstance(plan, (list, tuple))
    first = [p.kind for _, p in zip(range(6), plan)]
    assert first == ["prefill"] * 4 + ["decode"] * 2


# -- 3. every run's end is recorded ------------------------------------------------------------------------
def _stop_at(monkeypatch, step: int, exc: BaseException):
    from graphdiag.runner import Stepper
    real = Stepper.step

    def step_or_stop(self, p):
        if self.s.ctx.step == step:
            raise exc
        return real(self, p)
    monkeypatch.setattr(Stepper, "step", step_or_stop)


def test_ctrl_c_prints_the_summary_so_far_records_it_and_exits_130(capsys, tmp_path, monkeypatch):
    _stop_at(monkeypatch, 4, KeyboardInterrupt())
    path = tmp_path / "run.jsonl"
    rc = main(["run", *QUICK, "--steps", "8", "--events", str(path)])
    cap = capsys.readouterr()
    assert rc == 130
    assert "interrupted at step 4" in cap.out and "graphs reused" in cap.out      # the summary so far
    assert cap.err.strip() == "graphdiag: interrupted at step 4"
    header, events = read_record(path)
    assert events[-1] == E.RunEnded(step=4, t_ns=events[-1].t_ns, status="interrupted", steps_done=4,
                                    reason="Ctrl-C")
    assert main(["report", str(path)]) == 0
    assert "run INTERRUPTED at step 4 (4 steps finished): Ctrl-C" in capsys.readouterr().out


def test_a_failed_run_writes_the_error_into_the_record(capsys, tmp_path, monkeypatch):
    # a sticky error ends the run (a recoverable one is rolled back and the run goes on: test_recovery.py)
    from graphdiag.errors import CudaError
    _stop_at(monkeypatch, 3, CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "cuGraphLaunch"))
    path = tmp_path / "run.jsonl"
    line = _one_line(capsys, ["run", *QUICK, "--steps", "6", "--events", str(path)])
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in line
    ended = read_record(path)[1][-1]
    assert ended.status == "failed" and ended.step == 3 and "CUDA_ERROR_ILLEGAL_ADDRESS" in ended.reason
    main(["report", str(path)])
    assert "run FAILED at step 3" in capsys.readouterr().out


def test_a_complete_run_says_so_and_a_cut_record_is_flagged(capsys, tmp_path):
    path = tmp_path / "run.jsonl"
    assert main(["run", *QUICK, "--steps", "2", "--events", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ended"]["status"] == "complete" and d["ended"]["steps_done"] == 3
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")                # as if the process had been killed
    main(["report", str(path)])
    assert "run end not recorded" in capsys.readouterr().out


def test_output_piped_into_head_ends_quietly(tmp_path):
    path = tmp_path / "run.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "graphdiag", "run", *QUICK, "--steps", "40", "-vv", "--events",
                          str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    p.stdout.readline()
    p.stdout.close()                                              # what `head -1` does
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err
    ended = read_record(path)[1][-1]
    assert ended.status == "interrupted" and "broken pipe" in ended.reason


# -- 4. results users asked for are visible ----------------------------------------------------------------
def test_oracle_checks_are_in_the_summary_and_the_json(capsys):
    assert main(["run", *QUICK, "--steps", "2", "--oracle"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"oracle: 3 checks, max relative error (\S+) \(bound 0.001\), 0 over the bound", out)
    assert m and float(m.group(1)) < 1e-3
    assert main(["run", *QUICK, "--steps", "2", "--oracle", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["oracle_checks"] == 3 and 0 < d["oracle_max_rel_err"] < d["oracle_bound"] == 1e-3


def test_no_graphs_names_the_command_line(capsys, monkeypatch):
    monkeypatch.delenv("GGML_CUDA_DISABLE_GRAPHS", raising=False)
    assert main(["run", *QUICK, "--steps", "2", "--no-graphs"]) == 0
    out = capsys.readouterr().out
    assert "graphs disabled: --no-graphs on the command line" in out and "GGML_CUDA_DISABLE_GRAPHS" not in out


def test_replay_speedup_compares_decode_steps_not_the_prefill():
    from graphdiag.report.analysis.summary import summarize
    from graphdiag.report.views.console import render_summary
    import io
    header, events = synth.batch_change()
    s = summarize(header, events)
    buf = io.StringIO()
    render_summary(s, file=buf)
    eager_decode = s.timings["step (eager decode)"]
    assert eager_decode.n < s.timings["step (eager)"].n                 # the prefill steps are left out
    want = eager_decode.median_ns / s.timings["step (replay)"].median_ns
    assert f"replay speedup (eager decode step ÷ replay step)" in buf.getvalue()
    assert f"{want:.1f}×" in buf.getvalue()


def test_simulated_timings_are_labelled_in_every_table_and_in_diff(tmp_path, capsys):
    sim = tmp_path / "sim.jsonl"
    real = tmp_path / "real.jsonl"
    header, events = synth.steady_decode()
    write_record(sim, header, events)
    import dataclasses
    write_record(real, dataclasses.replace(header, simulated=False, backend="cuda", device="H200"), events)
    main(["report", str(sim)])
    out = capsys.readouterr().out
    assert "Timing (medians) — SIMULATED driver: host times, not GPU times" in out
    assert "step gpu (numpy host time)" in out and not re.search(r"^step gpu\s+\d", out, re.M)
    main(["diff", str(sim), str(sim)])
    out = capsys.readouterr().out
    assert "Timing (medians) — SIMULATED" in out and "step gpu (numpy host time)" in out
    main(["diff", str(sim), str(real)])
    out = capsys.readouterr().out
    assert "control is SIMULATED (host times), test ran on a GPU: these timings do not compare" in out


# -- 6. the README's test command ends with pytest's summary line ------------------------------------------
def test_readme_test_command_shows_the_summary_line_and_ci_runs_it():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Run the tests.*?```bash\n(.*?)\n```", readme, re.S).group(1).strip()
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"].get(
        "addopts", "")
    quiet = sum(a.count("q") for a in (block + " " + addopts).split() if re.fullmatch(r"-q+", a))
    assert quiet <= 1, "two -q hide pytest's `N passed, M skipped` line"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert block in ci, ".ci/run must run exactly the README's test command"

"""Reports, records, diffs and scenarios over real runs of the runtime (simulated driver, CPU only)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from graphdiag import runner
from graphdiag.cli.diff import diff
from graphdiag.cli.report import report
from graphdiag.config import resolve
from graphdiag.report.diff import diff_runs, diff_steps
from graphdiag.report.nvtx_sink import NvtxSink
from graphdiag.report.record import RunHeader, read_record, write_record
from graphdiag.report.summary import summarize
from graphdiag.scenario import check_expectations, list_scenarios


def _run(scenario=None, **cli):
    cfg = resolve({"backend": "sim", "steps": 8, **cli}, scenario=scenario.run if scenario else None,
                  environ=scenario.environ({}) if scenario else {})
    result = runner.run(cfg, scenario=scenario, span_sinks=[NvtxSink()])
    return RunHeader.from_dict(result.header), result


@pytest.fixture(scope="module")
def steady():
    return _run()


def test_report_e2e_header_is_what_the_runner_wrote(steady):
    header, result = steady
    assert header.to_dict().items() >= {k: v for k, v in result.header.items()}.items()
    assert header.simulated and header.backend == "sim" and header.settings["steps"] == 8


def test_report_e2e_summary_agrees_with_the_runner_counters(steady):
    header, result = steady
    s = summarize(header, result.events)
    assert s.counters == result.counters.snapshot()
    assert s.steps == 9 and s.counters["replays"] >= 5


def test_record_e2e_round_trip_and_report_command(steady, tmp_path):
    header, result = steady
    path = tmp_path / "run.jsonl"
    write_record(path, header, result.events)
    h2, ev2 = read_record(path)
    assert (h2, ev2) == (header, result.events)
    assert summarize(h2, ev2) == summarize(header, result.events)
    r = CliRunner().invoke(report, [str(path)])
    assert r.exit_code == 0 and "SIMULATED GPU" in r.output and "eager → capture" in r.output


def test_diff_e2e_two_runs_of_one_config_are_equal_and_chunking_is_not(steady, tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    write_record(a, steady[0], steady[1].events)
    again = _run()
    write_record(b, again[0], again[1].events)
    chunked = _run(chunk_size=64)
    write_record(c, chunked[0], chunked[1].events)
    assert CliRunner().invoke(diff, [str(a), str(b)]).exit_code == 0
    d = diff_runs(read_record(a), read_record(c))
    assert not d.equal and [s.name for s in d.settings] == ["chunk_size"]
    assert any(ch.field == "nodes" and ch.node == "chunk 1" for ch in d.ledger)
    assert diff_steps(steady[1].events, 5, 6).equal


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list_scenarios(), ids=lambda s: s.name)
def test_scenario_e2e_expectations_hold(scenario):
    cfg = resolve({"backend": "sim"}, scenario=scenario.run, environ=scenario.environ({}))
    result = runner.run(cfg, scenario=scenario)
    summary = summarize(RunHeader.from_dict(result.header), result.events)
    assert check_expectations(scenario, summary) == []


def test_report_e2e_live_sinks_wired_through_the_header_hook(tmp_path):
    import io

    from graphdiag.report.console import ConsoleReporter
    from graphdiag.report.record import JsonlWriter

    buf, path = io.StringIO(), tmp_path / "live.jsonl"
    rep, writer = ConsoleReporter(verbosity=1, file=buf), JsonlWriter(path)
    cfg = resolve({"backend": "sim", "steps": 4}, environ={})
    result = runner.run(cfg, sinks=[rep, writer], on_header=lambda h: (rep.start(h), writer.start(h)))
    rep.close()
    writer.close()
    header, events = read_record(path)
    assert events == result.events and header == RunHeader.from_dict(result.header)
    text = buf.getvalue()
    assert text.startswith("graphdiag ") and "chunk 0 · nodes 0–" in text


def test_diff_cli_on_batch_change_runs_with_different_chunk_sizes(tmp_path):
    """Two records of the batch-change scenario: chunk 512 vs 64 diverge (exit 1, named); a rerun is equal."""
    from graphdiag.cli.main import main
    from graphdiag.scenario import load_scenario
    sc = load_scenario("batch-change")
    paths = {}
    for name, chunk in (("a", 512), ("b", 64), ("a2", 512)):
        h, r = _run(sc, chunk_size=chunk, steps=16)
        paths[name] = tmp_path / f"{name}.jsonl"
        write_record(paths[name], h, r.events)
    runner_ = CliRunner()
    res = runner_.invoke(diff, [str(paths["a"]), str(paths["b"])])
    assert res.exit_code == 1
    assert "chunk_size" in res.output and "step 2" in res.output
    assert runner_.invoke(diff, [str(paths["a"]), str(paths["a2"])]).exit_code == 0
    assert main(["diff", str(paths["a"]), str(paths["a2"])]) == 0

"""Reports, records, diffs and scenarios over real runs of the runtime (simulated driver, CPU only)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from graphdiag import events as E
from graphdiag import runner
from graphdiag.cli.diff import diff
from graphdiag.cli.report import report
from graphdiag.config import resolve
from graphdiag.report.analysis.diff import diff_runs, diff_steps
from graphdiag.report.sinks.nvtx_sink import NvtxSink
from graphdiag.report.record import RunHeader, read_record, write_record
from graphdiag.report.analysis.summary import summarize
from graphdiag.scenario import check_expectations, list_scenarios
from support.simrun import run_sim


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
    rows_a, rows_b = ([e.nodes for e in read_record(p)[1] if isinstance(e, E.LedgerCaptured)] for p in (a, b))
    assert rows_a and rows_a[0] and rows_a == rows_b                   # ledger rows are deterministic
    assert diff_runs(read_record(a), read_record(b)).nodes == []
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

    from graphdiag.report.sinks.console import ConsoleReporter
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


def _node_line(field: str, control, test) -> re.Pattern:
    """A rendered node-row line: 'N embd   FIELD   CONTROL   TEST   changed'."""
    return re.compile(rf"^\d+ embd +{re.escape(field)} +{control} +{test} +changed *$", re.M)


def test_diff_e2e_node_rows_of_batch_1_and_batch_2(steady, tmp_path):
    """Steady decode at batch 1 and at batch 2: the decode captures differ in embd's ne[1] (1 vs 2);
    the batch-2 run also captured its prefill graph, which the batch-1 run never did."""
    a, b = tmp_path / "b1.jsonl", tmp_path / "b2.jsonl"
    write_record(a, steady[0], steady[1].events)
    h2, r2 = _run(batch=2)
    write_record(b, h2, r2.events)
    d = diff_runs(read_record(a), read_record(b))
    assert not d.equal and [s.name for s in d.settings] == ["batch"]
    decode = next(c for c in d.nodes if c.control and c.test)
    assert (decode.control.label, decode.test.label) == ("decode #0", "decode #0")
    assert ("embd", "ne[1]", 1, 2) in [(ch.name, ch.field, ch.control, ch.test) for ch in decode.changes]
    assert [(c.control, c.test.label) for c in d.nodes if not c.control] == [(None, "prefill #0")]
    res = CliRunner().invoke(diff, [str(a), str(b)])
    assert res.exit_code == 1 and _node_line("ne[1]", 1, 2).search(res.output)
    assert "more (every field is in --json)" in res.output
    j = json.loads(CliRunner().invoke(diff, [str(a), str(b), "--json"]).output)
    assert sum(len(c["changes"]) for c in j["nodes"]) == sum(len(c.changes) for c in d.nodes) > 20


def test_diff_e2e_steps_across_a_batch_change_name_the_node_change(tmp_path):
    """One run, batch 1 then 2 from step 5: the capture in force at step 7 differs from the one at step 4."""
    result = run_sim(timeline=[{"at_step": 5, "batch": 2}], steps=10)
    path = tmp_path / "run.jsonl"
    write_record(path, RunHeader.from_dict(result.header), result.events)
    d = diff_steps(read_record(path)[1], 4, 7)
    (c,) = d.nodes
    assert c.control.step < 5 <= c.test.step
    assert ("embd", "ne[1]", 1, 2) in [(ch.name, ch.field, ch.control, ch.test) for ch in c.changes]
    res = CliRunner().invoke(diff, [str(path), "--step", "4", "--step", "7"])
    assert res.exit_code == 1 and _node_line("ne[1]", 1, 2).search(res.output)
    assert CliRunner().invoke(diff, [str(path), "--step", "3", "--step", "4"]).exit_code == 0

"""The report, diff and scenarios commands through click (exit codes: diff like diff(1))."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from graphdiag.cli.diff import diff
from graphdiag.cli.report import report
from graphdiag.cli.scenarios import scenarios
from graphdiag.errors import EventFileError
from graphdiag.report.record import write_record
from support import synth


@pytest.fixture
def records(tmp_path):
    paths = {}
    for name, run in (("steady", synth.steady_decode()), ("steady2", synth.steady_decode()),
                      ("batch", synth.batch_change())):
        paths[name] = tmp_path / f"{name}.jsonl"
        write_record(paths[name], *run)
    (tmp_path / "broken.jsonl").write_text('{"schema": "graphdiag-events", "version": 1}\n{"kind": "uid_h')
    paths["broken"] = tmp_path / "broken.jsonl"
    return paths


def test_report_command_renders_the_record(records):
    r = CliRunner().invoke(report, [str(records["batch"])])
    assert r.exit_code == 0, r.output
    assert "SIMULATED GPU" in r.output and "warmup reset" in r.output and "Per graph key" in r.output
    assert "chunk 0 update refused" not in r.output
    r = CliRunner().invoke(report, [str(records["batch"]), "-v"])
    assert "chunk 0 update refused: TOPOLOGY_CHANGED" in r.output


def test_report_command_json(records):
    r = CliRunner().invoke(report, [str(records["steady"]), "--json"])
    assert r.exit_code == 0
    assert json.loads(r.output)["counters"]["replays"] == 5


def test_report_command_raises_the_record_error_for_the_entry_to_map(records):
    r = CliRunner().invoke(report, [str(records["broken"])])
    assert isinstance(r.exception, EventFileError) and "truncated last line" in str(r.exception)


def test_report_command_error_through_the_cli_entry_is_one_line(records, capsys):
    from graphdiag.cli.main import main
    assert main(["report", str(records["broken"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphdiag: error: ") and ":2: truncated last line" in err[0]


@pytest.mark.parametrize("args, code, text", [
    (["steady", "steady2"], 0, "result: EQUAL"),
    (["steady", "batch"], 1, "result: DIFFERENT"),
    (["steady", "--step", "3", "--step", "4"], 0, "step 3 (control) vs step 4 (test)"),
    (["steady", "--step", "2", "--step", "3"], 1, "result: DIFFERENT"),
])
def test_diff_command_exit_status_like_diff1(records, args, code, text):
    argv = [str(records[a]) if a in records else a for a in args]
    r = CliRunner().invoke(diff, argv)
    assert r.exit_code == code, r.output
    assert text in r.output


@pytest.mark.parametrize("args, message", [
    (["broken", "steady"], "truncated last line"),
    (["steady", "missing"], "no such file"),
    (["steady"], "give a second record, or two steps"),
    (["steady", "--step", "1"], "give a second record, or two steps"),
    (["steady", "batch", "--step", "1", "--step", "2"], "--step compares two steps of ONE record"),
    (["steady", "--step", "1", "--step", "99"], "step 99 is not in the record"),
])
def test_diff_command_errors_exit_2_with_one_line(records, tmp_path, args, message):
    argv = [str(records[a]) if a in records else str(tmp_path / a) if a == "missing" else a for a in args]
    r = CliRunner().invoke(diff, argv)
    assert r.exit_code == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_diff_command_json(records):
    r = CliRunner().invoke(diff, [str(records["steady"]), str(records["batch"]), "--json"])
    assert r.exit_code == 1
    d = json.loads(r.output)
    assert d["equal"] is False and d["first_divergence"]["step_control"] == 1


def test_diff_command_through_the_cli_entry_keeps_its_codes(records):
    from graphdiag.cli.main import main
    assert main(["diff", str(records["steady"]), str(records["steady2"])]) == 0
    assert main(["diff", str(records["steady"]), str(records["batch"])]) == 1
    assert main(["diff", str(records["broken"]), str(records["batch"])]) == 2


def test_scenarios_command_lists_one_line_each():
    r = CliRunner().invoke(scenarios, [])
    assert r.exit_code == 0
    lines = r.output.splitlines()
    names = [line.split()[0] for line in lines]
    assert names == sorted(names) and {"steady-decode", "graphs-disabled-env", "fusion-boundary"} <= set(names)
    assert all(len(line.split(None, 1)) == 2 for line in lines)

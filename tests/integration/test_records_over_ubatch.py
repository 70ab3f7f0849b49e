"""Records of runs whose prompts are longer than n_ubatch are read back by report, diff and whatif.

A prompt over n_ubatch is decoded in several ubatches, each a step of its own (plan.py); the record's header
must size the run with them, or the reader refuses its own run's record (issue 46: "step 28 is beyond the
run's 27 steps"). Through the CLI on the simulated driver, decisions only where the tokens are not needed.
"""

from __future__ import annotations

import pytest

from graphdiag.cli.main import main
from graphdiag.plan import plan_length
from graphdiag.report.record.read import read_record

DECISIONS = ["--backend", "sim", "--model", "tiny", "--sim-mode", "decisions"]

MID_RUN_PREFILL = """name = "mid-run-prefill"
description = "a 600-token prefill mid-run: two ubatches of one timeline entry"
timeline = [{ at_step = 3, prefill = 600 }]

[run]
model = "tiny"
prompt_tokens = 8
steps = 7
sim_mode = "decisions"
"""

CASES = {
    "prompt-1100": DECISIONS + ["--prompt-tokens", "1100", "--steps", "3"],
    "prompt-4000": DECISIONS + ["--prompt-tokens", "4000", "--steps", "2"],
    "mid-run-prefill": ["--backend", "sim", "--scenario", "{scenario}"],
    "ubatch-16": ["--backend", "sim", "--model", "tiny", "--prompt-tokens", "40", "--ubatch-size", "16",
                  "--steps", "3"],
}


def _run(tmp_path, name: str, argv: list[str]):
    scenario = tmp_path / "mid-run-prefill.toml"
    scenario.write_text(MID_RUN_PREFILL)
    path = tmp_path / f"{name}.jsonl"
    assert main(["run", *[a.format(scenario=scenario) for a in argv], "--events", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A run with another prompt length (two ubatches of 512), to diff against."""
    return _run(tmp_path_factory.mktemp("other"), "other", DECISIONS + ["--prompt-tokens", "700", "--steps", "3"])


@pytest.mark.parametrize("name", CASES)
def test_a_record_over_n_ubatch_is_read_by_report_diff_and_whatif(name, other, tmp_path, capsys):
    path = _run(tmp_path, name, CASES[name])
    header, events = read_record(path)
    s = header.settings
    assert max(e.step for e in events) == plan_length(s["batch"], s["prompt_tokens"], s["ubatch_size"], s["steps"])
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    assert main(["diff", str(path), str(path)]) == 0
    assert main(["diff", str(path), str(other)]) == 1          # compared: the runs differ (exit 1, not 2)
    assert main(["whatif", "--key", "first-node", str(path)]) == 0
    assert main(["whatif", "--key", "content-hash", str(path)]) == 0
    assert "error" not in capsys.readouterr().err


def test_the_mid_run_prefill_takes_a_step_per_ubatch_within_the_run_s_steps(tmp_path):
    header, events = read_record(_run(tmp_path, "mid-run-prefill", CASES["mid-run-prefill"]))
    started = {e.step: e for e in events if e.kind == "step_started"}
    assert [started[i].n_tokens for i in (3, 4)] == [512, 88] and len(started) == 1 + 7
    assert header.settings["steps"] == 7


def test_a_converted_llama_record_over_n_ubatch_is_read_and_aligned_with_graphdiag_s(tmp_path, capsys):
    """`graphdiag llama`'s record of the same plan (a synthetic raw stream: three ubatch decodes, three
    decode steps) numbers its steps as graphdiag's run does: report reads it, and the diff of the two
    compares every step (no step only in one of them). whatif refuses any llama.cpp record by design (the
    keys it replays are not observable), with its own line, not the reader's."""
    from graphdiag.llama.convert import convert_raw
    from graphdiag.report.record.write import write_record
    from tests.unit.test_llama_convert import _prompt_over_ubatch

    ours = _run(tmp_path, "prompt-1100", CASES["prompt-1100"])
    llama = tmp_path / "llama.jsonl"
    write_record(llama, *convert_raw(_prompt_over_ubatch().write(tmp_path / "raw.jsonl")))
    assert read_record(llama)[0].settings["steps"] == read_record(ours)[0].settings["steps"] == 3
    capsys.readouterr()
    assert main(["report", str(llama)]) == 0
    assert main(["whatif", "--key", "first-node", str(llama)]) == 2
    assert "comes from real llama.cpp" in capsys.readouterr().err
    assert main(["diff", str(llama), str(llama)]) == 0
    assert main(["diff", str(ours), str(llama)]) in (0, 1)
    out = capsys.readouterr().out
    assert "steps only in" not in out and "compared:" in out, out

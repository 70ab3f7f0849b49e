"""The parity tests' shared machinery on the CPU (tests/support/llama_parity.py): the iSWA scenarios go to
llama.cpp without graphdiag's sim_mode, and a comparison records the known differences it met."""

from __future__ import annotations

import pytest

from graphdiag.llama.command import resolve_llama
from graphdiag.llama.convert import convert_raw
from graphdiag.llama.expressible import check_expressible
from graphdiag.report.analysis.known import ModelFacts
from graphdiag.scenario import load_scenario
from tests.support import llama_parity as lp
from tests.support.llama_raw import steady


def test_sim_mode_is_dropped_for_both_runs(tmp_path):
    copy = lp.for_llama("swa-mask-stops-growing", tmp_path)
    sc, orig = load_scenario(copy), load_scenario("swa-mask-stops-growing")
    assert "sim_mode" in orig.run and "sim_mode" not in sc.run
    assert {k: v for k, v in orig.run.items() if k != "sim_mode"} == sc.run and sc.timeline == orig.timeline
    check_expressible(*resolve_llama("x.gguf", {}, copy))
    assert lp.for_llama("steady-decode", tmp_path) == "steady-decode"


def test_compare_records_what_it_excused(tmp_path, monkeypatch):
    monkeypatch.setattr(lp, "RESULTS", {})
    ours = convert_raw(steady(nodes=58).write(tmp_path / "a.jsonl"))
    theirs = convert_raw(steady(nodes=57).write(tmp_path / "b.jsonl"))
    lp.compare("tiny f16", ModelFacts("tiny"), "steady", ours, theirs)
    assert lp.RESULTS == {"tiny f16 steady": {"graph-nodes"}}
    lp.compare("tiny f16", ModelFacts("tiny"), "/tmp/copy/steady.toml", ours, ours, case="tiny f16 nkv")
    assert lp.RESULTS["tiny f16 nkv"] == set()


def test_a_failed_comparison_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(lp, "RESULTS", {})
    ours = convert_raw(steady(nodes=58).write(tmp_path / "a.jsonl"))
    theirs = convert_raw(steady(nodes=56).write(tmp_path / "b.jsonl"))
    with pytest.raises(AssertionError):
        lp.compare("tiny f16", ModelFacts("tiny"), "steady", ours, theirs)
    assert lp.RESULTS == {}


def test_known_met_counts_only_the_given_cases_once_all_compared(monkeypatch):
    """A differential timeline that excused cublas-split-k neither completes the parity cases nor counts for
    them; until every parity case compared equal there is no verdict."""
    monkeypatch.setattr(lp, "RESULTS", {"tiny f16 a": {"graph-nodes"},
                                        "moe-tiny-llama-f16 /tmp/t/timeline.toml": {"cublas-split-k"}})
    assert lp.known_met({"tiny f16 a", "tiny f16 b"}) == (1, None)
    lp.RESULTS["tiny f16 b"] = set()
    assert lp.known_met({"tiny f16 a", "tiny f16 b"}) == (2, {"graph-nodes"})

"""The parity tests' shared machinery on the CPU (tests/support/llama_parity.py): the iSWA scenarios go to
llama.cpp without graphdiag's sim_mode, and a comparison records the known differences it met."""

from __future__ import annotations

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
    monkeypatch.setattr(lp, "MET", set())
    monkeypatch.setattr(lp, "COMPARED", [])
    ours = convert_raw(steady(nodes=58).write(tmp_path / "a.jsonl"))
    theirs = convert_raw(steady(nodes=57).write(tmp_path / "b.jsonl"))
    lp.compare("tiny f16", ModelFacts("tiny"), "steady", ours, theirs)
    assert lp.MET == {"graph-nodes"} and lp.COMPARED == ["tiny f16 steady"]

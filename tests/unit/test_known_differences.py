"""The known differences between graphdiag and llama.cpp as exact predicates (report/analysis/known.py): each
excuses exactly the pair of decisions it describes and nothing after it. End to end on the recorded H200
streams (tests/data/llama) against graphdiag on the simulated driver with the same plan, and on synthetic
streams for the MoE cuBLAS case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.llama.convert import convert_raw
from graphdiag.report.analysis.known import KNOWN, ModelFacts, diff_known, model_facts, unmet
from graphdiag.report.record.read import read_record
from tests.support.llama_raw import RawStream, moe_capture_stream

DATA = Path(__file__).parents[1] / "data" / "llama"
DENSE, MOE = ModelFacts("tiny f16"), ModelFacts("moe-tiny f16", f32_routers=4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """graphdiag on the simulated driver, the exported tiny F16 (seed 0), the recorded streams' plans."""
    d = tmp_path_factory.mktemp("known")
    g = d / "tiny-f16.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", "f16", str(g)]) == 0
    out = {"facts": model_facts(g)}
    for name, prompt, steps in (("steady", 8, 24), ("nkv", 250, 12)):
        p = d / f"{name}.jsonl"
        assert main(["run", "--backend", "sim", "--model", str(g), "--prompt-tokens", str(prompt), "--steps",
                     str(steps), "--chunk-size", "0", "--events", str(p)]) == 0
        out[name] = read_record(p)
    return out


def _planted(tmp_path, raw: str, change) -> tuple:
    """The recorded stream with one line changed (change(lines) edits the parsed lines in place)."""
    lines = [json.loads(x) for x in (DATA / raw).read_text().splitlines()]
    change(lines)
    p = tmp_path / raw
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return convert_raw(p)


def test_recorded_steady_differs_by_the_embedding_node_only(runs):
    d = diff_known(runs["steady"], convert_raw(DATA / "tiny-f16-steady.raw.jsonl"), runs["facts"])
    assert d.equal, d.to_json()
    assert [(x["name"], x["step"], x["control"], x["test"]) for x in d.excused] == [
        ("graph-nodes", 2, "capture of E1: 58 graph nodes", "capture of E1: 57 graph nodes")]
    assert d.steps_compared == 25 and d.decisions_compared > 40
    assert runs["facts"] == ModelFacts("tiny-f16", 0)


def test_a_later_capture_of_the_same_kind_is_still_compared(runs, tmp_path):
    """nkv: two captures, each 58 vs 57 (two pairs excused); with llama.cpp's second planted at 56 the first
    is excused and the second is the difference."""
    theirs = convert_raw(DATA / "tiny-f16-nkv.raw.jsonl")
    d = diff_known(runs["nkv"], theirs, runs["facts"])
    assert d.equal and [x["step"] for x in d.excused] == [2, 8]

    def second_at_56(lines):
        ends = [x for x in lines if x.get("fn") == "cudaStreamEndCapture"]
        ends[1]["nodes"] = ends[1]["kernel_nodes"] = 56
    d = diff_known(runs["nkv"], _planted(tmp_path, "tiny-f16-nkv.raw.jsonl", second_at_56), runs["facts"])
    assert not d.equal and [x["step"] for x in d.excused] == [2]
    assert d.first[0] == 8 and d.first[2].line() == "capture of E1: 58 graph nodes"
    assert d.first[3].line() == "capture of E1: 56 graph nodes"


def test_a_planted_uid_difference_after_an_excused_pair_is_caught(runs, tmp_path):
    def no_reuse_at_step_10(lines):
        at = next(i for i, x in enumerate(lines) if x.get("ev") == "decode_begin" and x["step"] == 10)
        assert "reused" in lines[at + 1]["text"]
        del lines[at + 1]
    d = diff_known(runs["steady"], _planted(tmp_path, "tiny-f16-steady.raw.jsonl", no_reuse_at_step_10),
                   runs["facts"])
    assert [x["name"] for x in d.excused] == ["graph-nodes"]
    assert d.first[:2] == (10, 0) and d.first[2].line() == "uid: hit" and d.first[3].line() == "phase of E1: replay"


def test_two_nodes_more_is_not_the_embedding(runs):
    """graphdiag's record of 2026-12-02 (59 nodes: the KQ mask's cast too) against the same llama.cpp run."""
    d = diff_known(read_record(DATA / "repro-steady.jsonl"), convert_raw(DATA / "tiny-f16-steady.raw.jsonl"),
                   runs["facts"])
    assert d.excused == [] and d.first[0] == 2
    assert (d.first[2].outcome, d.first[3].outcome) == ("59 graph nodes", "57 graph nodes")


def _moe(tmp_path, ours: RawStream, theirs: RawStream, facts=MOE):
    return diff_known(convert_raw(ours.write(tmp_path / "ours.jsonl")),
                      convert_raw(theirs.write(tmp_path / "theirs.jsonl")), facts)


def test_cublas_split_k_excuses_the_update_inside_cublas_only(tmp_path):
    """8 -> 9 tokens on the F32 router's cuBLAS path (recorded: 88 kernels at both, refused): excused."""
    ours = moe_capture_stream([85, 89, 89], [2, 0])
    d = _moe(tmp_path, ours, moe_capture_stream([84, 88, 88], [2, 2]))
    assert d.equal, d.to_json()
    assert [x["name"] for x in d.excused] == ["graph-nodes"] * 3 + ["cublas-split-k"]
    assert d.excused[-1]["step"] == 5 and d.excused[-1]["test"].endswith("refused (TOPOLOGY_CHANGED), "
                                                                           "instantiated again")


@pytest.mark.parametrize("case", ["dense model", "mmvf columns", "their counts moved", "+2 nodes"])
def test_cublas_split_k_holds_for_that_case_alone(tmp_path, case):
    facts, tokens, ours, theirs = MOE, (2, 8, 9), [85, 89, 89], [84, 88, 88]
    if case == "dense model":
        facts = DENSE
    elif case == "mmvf columns":
        tokens = (1, 2, 3)
    elif case == "their counts moved":
        theirs = [84, 88, 87]
        ours = [85, 89, 88]
    else:
        ours = [85, 89, 90]
    d = _moe(tmp_path, moe_capture_stream(ours, [2, 0], tokens), moe_capture_stream(theirs, [2, 2], tokens), facts)
    assert not d.equal and "cublas-split-k" not in [x["name"] for x in d.excused]


def test_a_later_refusal_after_the_excused_one_is_still_caught(tmp_path):
    """Excused at 8 -> 9, then at 9 -> 10 llama.cpp refuses again where graphdiag updates with the counts
    moving (not the cuBLAS case): reported."""
    d = _moe(tmp_path, moe_capture_stream([85, 89, 89, 91], [2, 0, 0], (2, 8, 9, 10)),
             moe_capture_stream([84, 88, 88, 90], [2, 2, 2], (2, 8, 9, 10)))
    assert "cublas-split-k" in [x["name"] for x in d.excused]
    assert d.first[0] == 7 and d.first[2].outcome == "updated"


def test_unmet_names_entries_no_pair_met():
    assert unmet({"graph-nodes"}) == ["cublas-split-k", "cublas-conversions"]
    assert unmet({k.name for k in KNOWN}) == []


def _graph_nodes_excused(backends: tuple, split: int, chunk: int = 0) -> bool:
    """Whether graph-nodes excuses graphdiag's 58-node capture of `split` (chunk `chunk`) against llama.cpp's 57,
    the splits running on `backends`."""
    from graphdiag import events as E
    from graphdiag.report.analysis.known import Excuser
    from graphdiag.report.analysis.observed_diff import Decision
    events = [E.StepStarted(step=2, n_tokens=1), E.GraphSplit(step=2, n_splits=len(backends), backends=backends),
              E.ChunkCaptured(step=2, split=split, chunk=chunk, n_graph_nodes=58)]
    ours, theirs = Decision("phase", "E1", "capture"), Decision("capture", "E1", "58 graph nodes")
    llama = Decision("capture", "E1", "57 graph nodes")
    return Excuser(DENSE, events)(2, 1, theirs, llama, {2: [ours, theirs]}, {2: [ours, llama]}) == "graph-nodes"


def test_graph_nodes_holds_only_for_the_graph_that_holds_the_embedding():
    """The node llama.cpp lacks is the token embedding's GET_ROWS, graphdiag's first node: a capture of a
    later split, a later chunk, or a first split on the CPU has no such node, and +1 there is a difference."""
    assert _graph_nodes_excused(("SIM0",), 0)
    assert _graph_nodes_excused(("CUDA0", "CPU", "CUDA0"), 0)
    assert not _graph_nodes_excused(("CUDA0", "CPU", "CUDA0"), 2)
    assert not _graph_nodes_excused(("CPU", "CUDA0"), 1)
    assert not _graph_nodes_excused(("SIM0",), 0, chunk=1)

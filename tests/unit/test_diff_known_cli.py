"""`graphdiag diff` of a graphdiag record against a `graphdiag llama` one applies the known differences
(report/analysis/known.py) as the parity tests do: each excused pair shown as such with its entry's evidence,
every decision after it still compared; --no-known shows them as differences. On the recorded H200 streams
(tests/data/llama) against graphdiag on the simulated driver with the same plan, and on synthetic MoE streams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.llama.convert import convert_raw
from graphdiag.report.record.header import RunHeader
from graphdiag.report.record.write import write_record
from tests.support.cli import one_line
from tests.support.llama_raw import moe_capture_stream

DATA = Path(__file__).parents[1] / "data" / "llama"
EVIDENCE = "evidence: llama.cpp keeps the token embedding on the CPU"


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    """graphdiag's record (simulated driver, the exported tiny F16, steady's plan) and llama.cpp's recorded one."""
    d = tmp_path_factory.mktemp("diffknown")
    g = d / "tiny-f16.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", "f16", str(g)]) == 0
    ours = d / "ours.jsonl"
    assert main(["run", "--backend", "sim", "--model", str(g), "--prompt-tokens", "8", "--steps", "24",
                 "--chunk-size", "0", "--events", str(ours)]) == 0
    return {"ours": str(ours), "theirs": _llama(d / "theirs.jsonl", DATA / "tiny-f16-steady.raw.jsonl"), "dir": d}


def _llama(path: Path, raw: Path) -> str:
    write_record(path, *convert_raw(raw))
    return str(path)


def _diff(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["diff", *argv])
    return rc, capsys.readouterr().out


def test_the_embedding_node_is_excused_with_its_evidence(rec, capsys):
    rc, out = _diff(capsys, rec["ours"], rec["theirs"])
    assert rc == 0, out
    assert "known differences: 1 pair excused, each alone" in out
    assert "graph-nodes\n    control: capture of E1: 58 graph nodes\n    test:    capture of E1: 57 graph nodes" in out
    assert "step 2, decision " in out and EVIDENCE in out
    assert "decisions: the same at every compared step but for the known differences above" in out


def test_no_known_shows_it_as_the_first_difference(rec, capsys):
    rc, out = _diff(capsys, rec["ours"], rec["theirs"], "--no-known")
    assert rc == 1
    assert "note: known differences not applied (--no-known)" in out and "known differences:" not in out
    assert "first difference: step 2" in out and "control: capture of E1: 58 graph nodes" in out


def test_llama_cpp_as_the_control(rec, capsys):
    """The predicates take graphdiag's decision and llama.cpp's whichever side each record is on."""
    rc, out = _diff(capsys, rec["theirs"], rec["ours"])
    assert rc == 0, out
    assert "control: capture of E1: 57 graph nodes\n    test:    capture of E1: 58 graph nodes" in out


def test_a_difference_after_an_excused_pair_is_still_found(rec, capsys, tmp_path):
    """llama.cpp's uid hit at step 10 removed: the excused capture at step 2 hides nothing after it."""
    lines = [json.loads(x) for x in (DATA / "tiny-f16-steady.raw.jsonl").read_text().splitlines()]
    at = next(i for i, x in enumerate(lines) if x.get("ev") == "decode_begin" and x["step"] == 10)
    assert "reused" in lines[at + 1]["text"]
    del lines[at + 1]
    raw = tmp_path / "planted.raw.jsonl"
    raw.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc, out = _diff(capsys, rec["ours"], _llama(tmp_path / "planted.jsonl", raw), "--json")
    d = json.loads(out)
    assert rc == 1 and [(x["name"], x["step"]) for x in d["excused"]] == [("graph-nodes", 2)]
    assert d["first"] == {"step": 10, "index": 0, "control": "uid: hit", "test": "phase of E1: replay"}
    assert list(d["known"]) == ["graph-nodes"] and d["known"]["graph-nodes"]["evidence"].startswith("llama.cpp")


def test_two_nodes_more_is_not_excused(rec, capsys):
    """graphdiag's record of 2026-12-02 (59 nodes: the KQ mask's cast too) against the same llama.cpp run."""
    rc, out = _diff(capsys, str(DATA / "repro-steady.jsonl"), rec["theirs"])
    assert rc == 1 and "known differences:" not in out
    assert "control: capture of E1: 59 graph nodes" in out


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """graphdiag's side of the 8 -> 9 token cuBLAS case as a graphdiag record naming an exported moe-tiny
    (F32 routers), llama.cpp's as a `graphdiag llama` record."""
    d = tmp_path_factory.mktemp("moe")
    g = d / "moe-f16.gguf"
    assert main(["export-gguf", "--model", "moe-tiny", "--wtype", "f16", str(g)]) == 0
    _, events = convert_raw(moe_capture_stream([85, 89, 89], [2, 0]).write(d / "ours.raw.jsonl"))

    def ours(model: str) -> str:
        p = d / f"ours-{Path(model).stem}.jsonl"
        write_record(p, RunHeader(backend="cuda", model=model, settings={"model": model, "wtype": "f16"}), events)
        return str(p)
    theirs = _llama(d / "theirs.jsonl", moe_capture_stream([84, 88, 88], [2, 2]).write(d / "theirs.raw.jsonl"))
    return {"ours": ours, "theirs": theirs, "file": str(g), "dir": d}


def test_cublas_split_k_is_excused_on_the_file_the_record_names(moe, capsys):
    rc, out = _diff(capsys, moe["ours"](moe["file"]), moe["theirs"])
    assert rc == 0, out
    assert "known differences: 4 pairs excused" in out and ": cublas-split-k\n" in out
    assert "test:    executable of E1: refused (TOPOLOGY_CHANGED), instantiated again" in out
    assert "evidence: llama.cpp's MoE router mat-mul" in out


def test_without_the_model_file_the_router_case_is_not_excused(moe, capsys):
    """The record names a file that is not here: no router assumed, the refusal is a difference (a note says
    why); --model names the file and it is excused again."""
    gone = str(moe["dir"] / "elsewhere" / "moe-f16.gguf")
    rc, out = _diff(capsys, moe["ours"](gone), moe["theirs"])
    assert rc == 1 and "not found here" in out and "give --model FILE.gguf" in out
    assert "first difference: step 5" in out and "control: executable of E1: updated" in out
    rc, out = _diff(capsys, moe["ours"](gone), moe["theirs"], "--model", moe["file"])
    assert rc == 0 and ": cublas-split-k\n" in out


def test_a_preset_record_takes_the_presets_routers(moe, capsys):
    """A record of the moe-tiny preset: graphdiag's own weights for it (routers F32) give the facts."""
    rc, out = _diff(capsys, moe["ours"]("moe-tiny"), moe["theirs"])
    assert rc == 0 and ": cublas-split-k\n" in out


def test_a_traced_program_is_not_held_to_the_known_differences(rec, capsys, tmp_path):
    from graphdiag.trace.convert import convert_raw as convert_trace
    p = tmp_path / "traced.jsonl"
    write_record(p, *convert_trace(Path(__file__).parents[1] / "data" / "trace" / "llama-batch.raw.jsonl"))
    rc, out = _diff(capsys, rec["ours"], str(p))
    assert rc == 1 and "held against `graphdiag llama` records only" in out and "known differences:" not in out


@pytest.mark.parametrize("extra, message", [
    (["--model", "/no/such/file.gguf"], "file.gguf"),
    (["--no-known"], "apply to a comparison with a `graphdiag llama` record"),
])
def test_bad_known_options_are_one_line(rec, capsys, extra, message):
    second = rec["theirs"] if extra[0] == "--model" else rec["ours"]
    assert message in one_line(capsys, ["diff", rec["ours"], second, *extra])

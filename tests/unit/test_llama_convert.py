"""Raw llama-watch streams -> graphdiag records (graphdiag/llama/convert.py), over synthetic streams written
as ggml 0c1e57098 makes its calls (tests/support/llama_raw.py), and the recorded fixtures when present."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.errors import EventFileError
from graphdiag.llama.convert import NOT_OBSERVABLE, convert_raw
from graphdiag.report.analysis.summary import summarize
from graphdiag.report.record.read import read_record
from graphdiag.report.record.write import write_record
from graphdiag.report.views.console import render_report
from tests.support.llama_raw import RawStream, steady

FIXTURES = sorted((Path(__file__).parents[1] / "data" / "llama").glob("*.raw.jsonl"))


def _phases(events):
    return {e.step: e.phase for e in events if isinstance(e, E.PhaseDecided)}


def _of(events, cls):
    return [e for e in events if isinstance(e, cls)]


def test_steady_decode_phases_and_capture(tmp_path):
    h, ev = convert_raw(steady(steps=6).write(tmp_path / "r.jsonl"))
    assert _phases(ev) == {0: "eager", 1: "eager", 2: "capture", 3: "replay", 4: "replay", 5: "replay"}
    (cap,) = _of(ev, E.ChunkCaptured)
    assert (cap.step, cap.key, cap.n_graph_nodes) == (2, 1, 58)
    (inst,) = _of(ev, E.ChunkInstantiated)
    assert not inst.after_refusal and inst.duration_ns == 300_000
    assert len(_of(ev, E.ChunkUpdated)) == 1            # ggml updates the executable it just instantiated
    assert [w.to_state for w in _of(ev, E.WarmupTransition)] == ["warm"]
    assert {u.uid for u in _of(ev, E.UidHit)} == {4} and len(_of(ev, E.UidHit)) == 4
    fin = _of(ev, E.StepFinished)
    assert [f.mode for f in fin] == ["eager", "eager", "capture", "replay", "replay", "replay"]
    assert fin[0].duration_ns == 190_000 and fin[0].gpu_ns == 150_000
    assert _of(ev, E.RunEnded)[0].status == "complete"
    assert _of(ev, E.StepStarted)[0].phase == "prefill"
    assert h.llama["perf"]["n_reused"] == 4 and h.llama["not_observable"] == list(NOT_OBSERVABLE)


def test_refused_update_keeps_the_entry(tmp_path):
    """1 -> 2 tokens: warmup reset (eager), capture refused TOPOLOGY_CHANGED, re-instantiated: one entry."""
    r, box = RawStream(), {}
    r.decode(RawStream.eager, n_tokens=8, n_outputs=1)
    r.decode(RawStream.eager)
    r.decode(lambda s: box.__setitem__("x", s.capture(new_entry=True, uid=3)))
    r.decode(lambda s: s.replay(box["x"], uid=3))
    r.decode(RawStream.warmup_reset, n_tokens=2, n_seqs=2)
    r.decode(lambda s: box.__setitem__("x", s.capture(uid=5, result=2, exec_id=box["x"], nodes=74)),
             n_tokens=2, n_seqs=2)
    r.decode(lambda s: s.replay(box["x"], uid=5), n_tokens=2, n_seqs=2)
    h, ev = convert_raw(r.end().write(tmp_path / "r.jsonl"))
    assert _phases(ev) == {0: "eager", 1: "eager", 2: "capture", 3: "replay", 4: "eager", 5: "capture",
                           6: "replay"}
    (ref,) = _of(ev, E.UpdateRefused)
    assert (ref.step, ref.reason, ref.key) == (5, "TOPOLOGY_CHANGED", 1)
    again = [i for i in _of(ev, E.ChunkInstantiated) if i.after_refusal]
    assert [(i.step, i.key) for i in again] == [(5, 1)]
    assert {e.key for e in _of(ev, E.ReplayLaunched)} == {1}
    assert [(w.step, w.to_state) for w in _of(ev, E.WarmupTransition)] == [(2, "warm"), (4, "cold"), (5, "warm")]


def test_eviction_then_a_new_entry(tmp_path):
    r, box = RawStream(), {}
    r.decode(RawStream.eager)
    r.decode(lambda s: box.__setitem__("x", s.capture(new_entry=True)))
    r.decode(lambda s: (s.evict(box["x"]), RawStream.eager(s)))
    r.decode(lambda s: box.__setitem__("y", s.capture(new_entry=True)))
    r.decode(lambda s: s.replay(box["y"]))
    h, ev = convert_raw(r.end().write(tmp_path / "r.jsonl"))
    (evd,) = _of(ev, E.Evicted)
    assert (evd.step, evd.key) == (2, 1)
    assert _phases(ev)[2] == "eager" and [c.key for c in _of(ev, E.ChunkCaptured)] == [1, 2]
    assert _of(ev, E.ReplayLaunched)[0].key == 2


def test_graphs_disabled_by_env(tmp_path):
    r = RawStream(env={"GGML_CUDA_DISABLE_GRAPHS": "1"})
    for _ in range(3):
        r.decode(RawStream.eager)
    h, ev = convert_raw(r.end().write(tmp_path / "r.jsonl"))
    assert set(_phases(ev).values()) == {"disabled"} and len(_of(ev, E.GraphsDisabled)) == 3
    assert h.settings["graphs_disabled"] is True


def test_failed_decode_and_cut_stream(tmp_path):
    r = RawStream()
    r.decode(RawStream.eager)
    r.decode(RawStream.eager, ret=-3)
    r.begin()                                  # killed inside llama_decode: no decode_end, no end line
    h, ev = convert_raw(r.write(tmp_path / "r.jsonl"))
    fails = _of(ev, E.StepFailed)
    assert [(f.step, f.status) for f in fails] == [(1, -3), (2, -3)]
    end = _of(ev, E.RunEnded)[0]
    assert end.status == "failed" and "no end line" in end.reason and end.steps_done == 1


def test_converted_record_round_trips_and_reports(tmp_path):
    h, ev = convert_raw(steady().write(tmp_path / "r.jsonl"))
    write_record(tmp_path / "c.jsonl", h, ev)
    h2, ev2 = read_record(tmp_path / "c.jsonl")
    assert h2.llama == h.llama and ev2 == ev
    out = io.StringIO()
    s = summarize(h2, ev2)
    render_report(h2, ev2, s, out)
    text = out.getvalue()
    assert "not observable in llama.cpp:" in text and "graph key (the first node's address)" in text
    assert "n_reused 4" in text
    assert s.llama_counters == {"graphs reused": 4}


@pytest.mark.parametrize("lines, message", [
    (['{"ev": "decode_begin"'], "not JSON"),
    (['{"ev": "bogus"}'], "unknown raw line 'bogus'"),
    (['{"ev": "api", "fn": "cudaLaunchKernel"}'], "not one of the watched graph calls"),
    (['{"ev": "api", "fn": "cudaGraphLaunch"}'], "api line without a valid exec"),
    (['{"ev": "decode_begin", "step": "x", "n_tokens": 1}'], "decode_begin line without a valid step"),
    (['{"ev": "decode_end", "step": 0, "ret": 0, "host_ns": 1}'], "without its decode_begin"),
])
def test_malformed_raw_lines(tmp_path, lines, message):
    head = json.dumps(RawStream().lines[0])
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join([head, *lines]) + "\n")
    with pytest.raises(EventFileError, match=message) as e:
        convert_raw(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


@pytest.mark.parametrize("text, message", [
    ("", "empty file"), ('{"schema": "graphdiag-events"}\n', "not a llama-watch raw stream"),
    ('{"raw": "llama-watch", "version": 9}\n', "unsupported llama-watch stream version 9"),
])
def test_not_a_raw_stream(tmp_path, text, message):
    p = tmp_path / "x.jsonl"
    p.write_text(text)
    with pytest.raises(EventFileError, match=message):
        convert_raw(p)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_recorded_fixture_converts(path, tmp_path):
    """The lead's streams recorded on the H200: every decode a step, a phase per compute, a clean end."""
    h, ev = convert_raw(path)
    steps = _of(ev, E.StepStarted)
    assert steps and all(s.step in _phases(ev) for s in steps)
    write_record(tmp_path / "c.jsonl", h, ev)
    assert read_record(tmp_path / "c.jsonl")[1] == ev


def _prompt_over_ubatch(**header) -> RawStream:
    """A 1100-token prompt (n_ubatch 512): llama.cpp's three ubatches, one llama_decode each (the driver
    decodes a plan step at a time), only the last with an output; then three decode steps."""
    r, box = RawStream(prompt_tokens=1100, n_ubatch=512, **header), {}
    for n, out in ((512, 0), (512, 0), (76, 1)):
        r.decode(RawStream.eager, n_tokens=n, n_outputs=out)
    r.decode(RawStream.eager)
    r.decode(lambda s: box.setdefault("x", s.capture(new_entry=True, uid=4)))
    r.decode(lambda s: s.replay(box["x"], uid=4))
    return r.end(n_reused=1)


@pytest.mark.parametrize("said", [True, False], ids=["steps-in-raw", "steps-from-decodes"])
def test_a_prompt_over_n_ubatch_numbers_its_steps_as_graphdiag_run(said, tmp_path):
    """Every ubatch a step, numbered as plan.py numbers them; the header's settings say the run's steps
    (3 decode steps, not 5) and its ubatch size as `graphdiag run`'s header does, so the reader sizes the
    converted run as it sizes graphdiag's own (issue 46)."""
    raw = _prompt_over_ubatch()
    path = raw.write(tmp_path / "r.jsonl")
    if not said:                               # a stream whose header did not give the plan's steps
        lines = path.read_text().splitlines()
        head = json.loads(lines[0])
        del head["steps"]
        path.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    h, ev = convert_raw(path)
    assert {k: h.settings[k] for k in ("batch", "prompt_tokens", "ubatch_size", "steps")} == {
        "batch": 1, "prompt_tokens": 1100, "ubatch_size": 512, "steps": 3}
    assert [(s.step, s.n_tokens, s.phase) for s in _of(ev, E.StepStarted)] == [
        (0, 512, "prefill"), (1, 512, "prefill"), (2, 76, "prefill"), (3, 1, "decode"), (4, 1, "decode"),
        (5, 1, "decode")]
    assert _of(ev, E.RunEnded)[0].step == 6
    write_record(tmp_path / "c.jsonl", h, ev)
    assert read_record(tmp_path / "c.jsonl")[1] == ev


def test_the_record_says_how_the_graph_calls_were_read(tmp_path):
    """The driver writes its watcher's kind after it starts: an interposing watcher's record says so in its note
    and header; a record without the line (every earlier one) says CUPTI, as before."""
    src = next(p for p in FIXTURES if p.name == "tiny-f16-steady.raw.jsonl")
    head, *rest = src.read_text().splitlines()
    raw = tmp_path / "i.raw.jsonl"
    raw.write_text("\n".join([head, json.dumps({"ev": "watcher", "kind": "injection library, interposing"}),
                              *rest]) + "\n")
    header, events = convert_raw(raw)
    plain, plain_events = convert_raw(src)
    assert "watched by interposing its CUDA runtime calls and its log" in header.note
    assert header.llama["watcher"] == "injection library, interposing"
    assert "through CUPTI callbacks" in plain.note and "watcher" not in plain.llama
    assert len(events) == len(plain_events)


def test_a_watcher_line_without_its_kind_is_refused(tmp_path):
    src = next(p for p in FIXTURES if p.name == "tiny-f16-steady.raw.jsonl")
    head, *rest = src.read_text().splitlines()
    raw = tmp_path / "bad.raw.jsonl"
    raw.write_text("\n".join([head, json.dumps({"ev": "watcher", "kind": 3}), *rest]) + "\n")
    with pytest.raises(EventFileError, match=r"bad.raw.jsonl:2: watcher line without a valid kind"):
        convert_raw(raw)

"""diff: runs and steps compared as decisions (no times, keys/uids/addresses renamed by first use)."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from graphdiag import events as E
from graphdiag.errors import UsageError
from graphdiag.report.analysis.diff import diff_runs, diff_steps
from graphdiag.report.views.diff import render_run_diff, render_step_diff
from support import synth


def _shift(run, key_offset=0x1000, uid_offset=40, time_scale=3):
    """The same run on other addresses, other uids and other timings."""
    header, events = run
    moved = []
    for e in events:
        kw = {"key": e.key + key_offset if e.key else 0, "uid": e.uid + uid_offset if e.uid else 0,
              "t_ns": e.t_ns * time_scale}
        if hasattr(e, "duration_ns"):
            kw["duration_ns"] = e.duration_ns * time_scale
        if isinstance(e, E.GraphSplit):
            kw["uids"] = tuple(u + uid_offset for u in e.uids)
        if isinstance(e, E.UidMiss) and e.old_uid:
            kw["old_uid"] = e.old_uid + uid_offset
        moved.append(dataclasses.replace(e, **kw))
    return header, moved


def test_diff_same_decisions_on_other_addresses_and_timings_are_equal():
    d = diff_runs(synth.batch_change(), _shift(synth.batch_change()))
    assert d.equal
    assert d.first_divergence is None and d.ledger == [] and d.nodes == [] and d.settings == []
    assert all(t.delta > 0 for t in d.timings if t.name == "capture split")


def test_diff_first_divergent_step_and_what_changed():
    d = diff_runs(synth.steady_decode(), synth.batch_change())
    assert not d.equal
    assert d.first_divergence.step_control == 1
    changes = d.first_divergence.changes
    assert changes[0].change == "changed" and "n_tokens 8" in changes[0].test
    assert any("ne[1] 16→1" in (c.control or "") and "ne[1] 16→8" in (c.test or "") for c in changes)
    assert [(s.name, s.control, s.test) for s in d.settings] == [("steps", 8, 9), ("batch", 1, 8),
                                                                  ("chunk_size", 0, 64)]
    assert {c.name: c.delta for c in d.counters}["update_refusals"] == 1
    assert d.tokens_differ_at == 1


def test_diff_ledger_lists_node_field_control_and_test():
    d = diff_runs(synth.steady_decode(), synth.batch_change())
    facts = {(c.key, c.capture, c.node, c.field): (c.control, c.test, c.change) for c in d.ledger}
    assert facts[("k1", 0, "node 3", "ne[1]")] == ("1", "8", "changed")
    assert facts[("k1", 0, "chunk 0", "nodes")] == ("0–119", "0–63 (moved by fusion)", "changed")
    assert facts[("k1", 0, "node 40", "fusion")] == (None, "mul_mat_vec+glu +2", "added")
    assert facts[("k1", 0, "node 10", "fusion")] == ("rms_norm+mul +1", None, "removed")
    assert facts[("k1", 1, "-", "captured")] == (None, "yes", "added")
    assert {c.phase for c in d.ledger} == {"decode"}


def _node_changes(d):
    return [(c.key, c.control and c.control.label, ch.node, ch.name, ch.field, ch.control, ch.test, ch.change)
            for c in d.nodes for ch in c.changes]


def test_diff_node_rows_list_exactly_the_fields_that_differ():
    """Same decisions; in the test run's ledger node 3's ne[1] and node 41's src[1].data differ."""
    control = synth.steady_decode()
    test = synth.edit_ledger(synth.edit_ledger(control, 3, "ne[1]", 2), 41, "src[1].data", "b2+0x4000")
    d = diff_runs(control, _shift(test))
    assert not d.equal and d.first_divergence is None and d.ledger == []
    assert _node_changes(d) == [("k1", "decode #0", 3, "inp_embd", "ne[1]", 1, 2, "changed"),
                                ("k1", "decode #0", 41, "__fattn__-3", "src[1].data", "b2+0x0", "b2+0x4000",
                                 "changed")]
    assert (d.nodes[0].control.step, d.nodes[0].test.step) == (2, 2)
    assert "2 node fields differ in 1 captures" in _rendered(d)


def test_diff_node_rows_of_a_batch_change_and_a_capture_only_one_run_made():
    d = diff_runs(synth.steady_decode(), synth.batch_change())
    first, only_test = d.nodes
    assert ("k1", "decode #0", 3, "inp_embd", "ne[1]", 1, 8, "changed") in _node_changes(d)
    assert (only_test.control, only_test.test.label, only_test.test.step, only_test.changes) == \
        (None, "decode #1", 6, [])
    text = _rendered(d)
    assert f"… {len(first.changes) - 20} more (every field is in --json)" in text
    assert "k1 · control: none · test: decode #1 at step 6, 120 nodes · test only" in text
    j = json.loads(d.to_json())
    assert len(j["nodes"][0]["changes"]) == len(first.changes) > 20       # JSON keeps every field
    assert j["nodes"][0]["changes"][0] == {"node": 0, "name": "attn_norm-0", "field": "ne[1]",
                                          "control": 1, "test": 8, "change": "changed"}


def _rendered(d) -> str:
    buf = io.StringIO()
    render_run_diff(d, buf)
    return buf.getvalue()


def test_diff_steps_compare_the_captures_in_force():
    """batch_change captures at step 2 (batch 8) and at step 6 (batch 9)."""
    _, events = synth.batch_change()
    assert diff_steps(events, 3, 4).nodes == []                 # the same capture is in force
    assert diff_steps(events, 4, 5).nodes == []                 # step 5 runs eager: still the step-2 capture
    d = diff_steps(events, 4, 7)
    (c,) = d.nodes
    assert (c.key, c.control.label, c.control.step, c.test.label, c.test.step) == ("k1", "decode #0", 2,
                                                                                  "decode #1", 6)
    assert ("k1", "decode #0", 3, "inp_embd", "ne[1]", 8, 9, "changed") in _node_changes(d)
    assert ("k1", "decode #0", 41, "__fattn__-3", "src[1].ne[1]", 8, 9, "changed") in _node_changes(d)
    first = diff_steps(events, 1, 3).nodes[0]                   # no capture yet at step 1
    assert (first.control, first.test.step) == (None, 2)
    buf = io.StringIO()
    render_step_diff(d, "b.jsonl", buf)
    assert "Captured graphs in force at step 4 (control) and step 7 (test)" in buf.getvalue()
    assert "1 captured graphs in force differ" in buf.getvalue()


def test_diff_chunk_size_shows_in_ledger_not_in_first_steps():
    d = diff_runs(synth.steady_decode(chunk_size=512), synth.steady_decode(chunk_size=64))
    assert d.first_divergence.step_control == 2           # eager steps are the same; the capture is not
    assert {(c.node, c.field) for c in d.ledger} >= {("chunk 0", "nodes"), ("chunk 1", "nodes")}


def test_diff_steps_of_one_run():
    _, events = synth.steady_decode()
    assert diff_steps(events, 3, 4).equal
    d = diff_steps(events, 2, 3)
    assert not d.equal
    assert any(c.change == "changed" and c.control.endswith("capture (warmup complete)")
               and c.test.endswith("replay (warm, unchanged)") for c in d.changes)
    assert any(c.change == "removed" and "chunk 0 instantiated" in c.control for c in d.changes)
    assert any(c.change == "added" and "replay · 1 chunks" in c.test for c in d.changes)


def test_diff_steps_unknown_step_is_a_usage_error():
    with pytest.raises(UsageError, match="step 99 is not in the record"):
        diff_steps(synth.steady_decode()[1], 1, 99)


def test_diff_renders_text_and_json():
    d = diff_runs(synth.steady_decode(), synth.batch_change(), ("a.jsonl", "b.jsonl"))
    buf = io.StringIO()
    render_run_diff(d, buf)
    text = buf.getvalue()
    assert "result: DIFFERENT (decisions diverge at step 1;" in text
    assert "First divergent step: 1" in text and "Settings that differ" in text
    j = json.loads(d.to_json())
    assert j["equal"] is False and j["first_divergence"]["step_control"] == 1
    assert {c["name"]: c["delta"] for c in j["counters"]}["captures"] == 1
    buf = io.StringIO()
    render_step_diff(diff_steps(synth.steady_decode()[1], 4, 5), "a.jsonl", buf)
    assert "result: EQUAL" in buf.getvalue()


def test_diff_golden_text():
    import os

    from support.normalise import check_golden
    buf = io.StringIO()
    render_run_diff(diff_runs(synth.steady_decode(), synth.batch_change(), ("a.jsonl", "b.jsonl")), buf)
    render_step_diff(diff_steps(synth.batch_change()[1], 4, 5), "b.jsonl", buf)
    check_golden("diff_steady_vs_batch_change", buf.getvalue(), update=bool(os.environ.get("GRAPHDIAG_UPDATE_GOLDEN")))

"""diff: runs and steps compared as decisions (no times, keys/uids/addresses renamed by first use)."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from graphdiag import events as E
from graphdiag.errors import UsageError
from graphdiag.report.diff import diff_runs, diff_steps
from graphdiag.report.diff_view import render_run_diff, render_step_diff
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
    assert d.first_divergence is None and d.ledger == [] and d.settings == []
    assert all(t.delta > 0 for t in d.timings if t.name == "capture split")


def test_diff_first_divergent_step_and_what_changed():
    d = diff_runs(synth.steady_decode(), synth.batch_change())
    assert not d.equal
    assert d.first_divergence.step_control == 1
    changes = d.first_divergence.changes
    assert changes[0].change == "changed" and "n_tokens 8" in changes[0].test
    assert any("ne[1] 16→1" in (c.control or "") and "ne[1] 16→8" in (c.test or "") for c in changes)
    assert [(s.name, s.control, s.test) for s in d.settings] == [("steps", 8, 9), ("batch", 1, 8)]
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

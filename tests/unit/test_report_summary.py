"""Summary: per-key numbers, timings, llama.cpp counters, agreement with the live Counters sink."""

from __future__ import annotations

import json

from graphdiag import events as E
from graphdiag.counters import Counters
from graphdiag.report.analysis.summary import summarize
from support import synth


def test_report_summary_steady_decode():
    header, events = synth.steady_decode(n_replays=5)
    s = summarize(header, events)
    assert s.steps == 8
    assert s.step_modes == {"eager": 2, "capture": 1, "replay": 5}
    (k,) = s.keys
    assert (k.key, k.splits) == (synth.KEY_A, [0])
    assert (k.steps_eager, k.steps_capture, k.steps_replay) == (2, 1, 5)
    assert (k.chunks, k.instantiates, k.updates, k.refusals, k.warmup_resets) == (1, 1, 0, {}, 0)
    assert s.timings["replay split"].n == 5
    assert s.timings["eager split"].median_ns == synth.EAGER_NS + 500     # steps 0 and 1: +0, +1000
    assert s.llama_counters == {"graphs reused": 6, "graph reallocs (same size)": 1,
                                "graph reallocs (size changed)": 1}


def test_report_summary_batch_change_counts_refusals_and_resets():
    s = summarize(*synth.batch_change())
    (k,) = s.keys
    assert k.refusals == {"TOPOLOGY_CHANGED": 1}
    assert (k.warmup_resets, k.instantiates, k.updates, k.chunks) == (1, 3, 1, 2)
    assert s.counters["refusals_by_reason"] == {"TOPOLOGY_CHANGED": 1}
    assert s.property_diff_fields == ["ne[1]", "src[1].ne[1]"]
    assert s.timings["chunk update"].median_ns < s.timings["chunk instantiate"].median_ns


def test_report_summary_moe_has_one_key_per_gpu_split():
    s = summarize(*synth.moe_offload())
    assert [(k.key, k.splits) for k in s.keys] == [(synth.KEY_B, [0]), (synth.KEY_C, [2])]
    assert s.distinct_keys == 2


def test_report_summary_counters_agree_with_the_live_sink():
    header, events = synth.pressure_and_idle()
    bus, live = E.EventBus(), Counters()
    bus.subscribe(live)
    for ev in events:
        bus.emit(ev)
    s = summarize(header, events)
    assert s.counters == live.snapshot()
    assert (s.counters["invalidations"], s.counters["evictions"]) == (1, 1)
    assert s.keys[0].evictions == 1


def test_report_summary_ignores_spans_and_counts_verify_mismatches():
    header, events = synth.steady_decode(n_replays=2)
    extra = [E.SpanBegin(step=3, name="step"), E.VerifyResult(step=3, ok=True),
             E.VerifyResult(step=4, ok=False, max_abs_diff=0.5), E.SpanEnd(step=3, name="step")]
    s = summarize(header, events + extra)
    assert (s.verify_checks, s.verify_mismatches) == (2, 1)
    assert s.steps == 5


def test_report_summary_json_is_plain_data_with_hex_keys():
    d = json.loads(summarize(*synth.moe_offload()).to_json())
    assert [k["key"] for k in d["keys"]] == [hex(synth.KEY_B), hex(synth.KEY_C)]
    assert d["distinct_keys"] == 2
    assert d["header"]["schema"] == "graphdiag-events"
    assert d["timings"]["replay split"]["n"] == 4

"""CUPTI device records of a real run (issue 11): a replayed step's kernels match the captured graph's
kernel nodes, in count and in names; a 1b timeline is written and checked. Needs cupti-python."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from graphdiag import events as E
from graphdiag.config import resolve

pytestmark = pytest.mark.gpu


def _run(settings, tmp_path, name):
    pytest.importorskip("cupti")
    from graphdiag.report.sinks.timeline import TimelineWriter
    from graphdiag.runner import run
    path = tmp_path / f"{name}.json"
    tl, steps = TimelineWriter(path), []
    try:
        result = run(resolve({"backend": "cuda", "nvtx": False, **settings}, environ={}), span_sinks=[tl],
                     on_header=tl.start, device_sinks=[tl.add_device, steps.append], cupti=True)
    finally:
        tl.close()
    return result, steps, json.loads(path.read_text())


def test_replayed_step_kernels_match_the_captured_graph(require_gpu, tmp_path):
    result, steps, _ = _run({"model": "tiny", "steps": 6, "prompt_tokens": 16, "chunk_size": 0}, tmp_path, "tiny")
    fin = [e for e in result.events if isinstance(e, E.StepFinished)]
    replay = [i for i, e in enumerate(fin) if e.mode == "replay"]
    assert replay, [e.mode for e in fin]
    records = [r for r in steps[replay[-1]] if r.kind == "kernel"]
    # the captured graph's kernel nodes: the launches recorded during the capture, by kernel function
    cap_step = next(e.step for e in fin if e.mode == "capture")
    eager_like = [r for r in steps[[e.step for e in fin].index(cap_step)] if r.kind == "kernel"]
    assert len(records) == len(eager_like), (len(records), len(eager_like))
    assert Counter(r.name for r in records) == Counter(r.name for r in eager_like)
    assert all(r.graph_id and r.node_id for r in records), "CONCURRENT_KERNEL records carry graph node ids"
    via = Counter(r.via for r in records)
    print("attributed via", dict(via))                    # "node id" where cuptiGetGraphNodeId matches
    assert all(r.label for r in records), via
    dt = next(e for e in result.events if isinstance(e, E.DeviceTime) and e.step == fin[replay[-1]].step)
    assert dt.source == "cupti" and dt.n_kernels == len(records) and dt.attributed == len(records)


def test_1b_timeline(require_gpu, tmp_path):
    from graphdiag.report.analysis.accounting import account
    result, steps, doc = _run({"model": "1b", "steps": 8, "prompt_tokens": 32}, tmp_path, "1b")
    evs = doc["traceEvents"]
    assert doc["otherData"]["simulated_device"] is False
    names = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"].endswith("_name")}
    assert "GPU (CUPTI)" in names and any(n.startswith("stream") for n in names)
    n_steps = sum(isinstance(e, E.StepFinished) for e in result.events)
    assert sum(e["ph"] == "X" and e["name"].startswith("step ") for e in evs) == n_steps
    kernels = [e for e in evs if e["ph"] == "X" and e["cat"] == "kernel"]
    assert kernels and sum(bool(k["args"].get("nodes")) for k in kernels) / len(kernels) > 0.95
    phases = {p.phase: p for p in account(result.events).phases}
    print({k: (p.bound, p.wall_ns, p.busy_ns, p.idle_ns, p.mgmt_ns) for k, p in phases.items()})
    # the bound rule counts the host's time before the first kernel (issue 25): under CUPTI's kernel tracing
    # a 1b replayed step's wall roughly doubles (2.8 ms measured, against 1.18 ms untraced) while the device
    # is busy for its ~1.1 ms of kernels, so the traced step reads "host" — what the figures say
    rep = phases["replay"]
    assert 0.7e6 < rep.busy_ns < 1.8e6, rep.busy_ns     # 1b's replayed kernels (bench steps: GPU 1.14 ms)
    assert rep.bound == ("GPU" if 2 * rep.busy_ns >= rep.wall_ns else "host")

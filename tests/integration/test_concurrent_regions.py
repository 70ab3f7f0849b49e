"""Concurrent regions as llama.cpp 0c1e57098 forms, interleaves and validates them (issue 29, part 3):
ggml_backend_cuda_graph_optimize (fork/join search, the branch interleave) and the check graph_compute
makes before it evaluates or captures (ggml_cuda_concurrent_event::is_valid, then the original order back,
or every region dropped)."""

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.gpu import backend as gpu_backend
from graphdiag.backends.gpu.concurrency import MIDDLE, interleave, invalid_reason, races, scan
from graphdiag.config import resolve
from graphdiag.counters import Counters
from graphdiag.ir.dtypes import GGMLType
from graphdiag.ir.graph import Graph
from graphdiag.ir.ops import Op
from graphdiag.ir.tensor import Tensor
from graphdiag.model.build import DECODE, GraphParams, build_graph
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model
from graphdiag.plan import StepPlan
from graphdiag.report.analysis.eventlog import describe
from graphdiag.runner import RunResult, Session, Stepper

from support.simrun import of


def _graph(preset="tiny"):
    m = create_model(PRESETS[preset], GGMLType.F16, with_data=False)
    return build_graph(m, GraphParams(1, 1, 1, DECODE, 256)).graph


def _session(preset="tiny", **settings):
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, "concurrent_streams": True,
                   "model": preset, **settings}, environ={})
    bus = E.EventBus()
    seen: list = []
    bus.subscribe(seen.append)
    return Session(cfg, bus), seen


def _names(g: Graph, slots) -> list[str]:
    return [Tensor(g.arena, s).name for s in slots]


def test_branches_interleave_one_node_each_in_turn_no_ops_kept_with_the_node_before():
    g = _graph()
    r = next(r for r in scan(g)[0] if g.node(r.fork).name == "attn_norm-1")
    # upstream's names repeat: Qcur-1 is Q's mat-mul, reshape and rope; `cache_k_l1 (view)` K's cache write
    # (SET_ROWS) and the attention's view of the cache
    assert [(g.node(i).op.name, g.node(i).name) for i in sorted(r.stream_of)] == [
        ("MUL_MAT", "Qcur-1"), ("RESHAPE", "Qcur-1"), ("ROPE", "Qcur-1"), ("MUL_MAT", "Vcur-1"),
        ("RESHAPE", "Vcur-1"), ("MUL_MAT", "Kcur-1"), ("RESHAPE", "Kcur-1"), ("ROPE", "Kcur-1"),
        ("VIEW", "Kcur-1 (view)"), ("SET_ROWS", "cache_k_l1 (view)"), ("VIEW", "Vcur-1 (view)"),
        ("SET_ROWS", "cache_v_l1 (view)"), ("VIEW", "Qcur-1 (view)"), ("PERMUTE", "Qcur-1 (view) (permuted)"),
        ("VIEW", "cache_k_l1 (view)"), ("PERMUTE", "cache_k_l1 (view) (permuted)"), ("VIEW", "cache_v_l1 (view)"),
        ("PERMUTE", "cache_v_l1 (view) (permuted)")]
    assert _names(g, r.order) == [g.node(i).name for i in sorted(r.stream_of)]
    assert [(Tensor(g.arena, s).op.name, Tensor(g.arena, s).name) for s in r.interleaved] == [
        ("MUL_MAT", "Qcur-1"), ("RESHAPE", "Qcur-1"), ("MUL_MAT", "Vcur-1"), ("RESHAPE", "Vcur-1"),
        ("VIEW", "Vcur-1 (view)"), ("MUL_MAT", "Kcur-1"), ("RESHAPE", "Kcur-1"), ("ROPE", "Qcur-1"),
        ("VIEW", "Qcur-1 (view)"), ("PERMUTE", "Qcur-1 (view) (permuted)"), ("SET_ROWS", "cache_v_l1 (view)"),
        ("VIEW", "cache_v_l1 (view)"), ("PERMUTE", "cache_v_l1 (view) (permuted)"), ("ROPE", "Kcur-1"),
        ("VIEW", "Kcur-1 (view)"), ("SET_ROWS", "cache_k_l1 (view)"), ("VIEW", "cache_k_l1 (view)"),
        ("PERMUTE", "cache_k_l1 (view) (permuted)")]


def test_interleave_skips_an_emptied_branch():
    noop = [False, True, False, False, False, True]
    assert interleave([[0, 1, 2], [3], [4, 5]], noop) == [0, 1, 3, 4, 5, 2]


@pytest.mark.parametrize("upstream,first", [("0c1e57098", 0), ("d99724f2", 1)])
def test_gqa_small_forms_a_region_per_layer_but_layer_0_under_d99724f2(upstream, first):
    """small: 16 query heads over 4 KV heads. At 0c1e57098 the KQ mask is an F16 input, no node: every
    layer's fork-join range holds only its branches, so all 8 form. Under d99724f2 layer 0's range also
    holds the mask's cast (a CPY in no branch): graph_optimize skips that fork ("the number of nodes in the
    middle is not equal to the total number of branch nodes"). Upstream's check (is_valid) clears every
    region when one fails. At 0c1e57098 none fails: K and V (1 KiB each) and Q (4 KiB) are live together
    from the interleaved mat-muls to the join, ropes run in place, the cache writes are views of distinct
    caches, and the only buffer freed inside a region (attn_norm) is never handed to a region node. Under
    d99724f2 layer 1's fails: K's rope reads a view (the reshape), so it takes memory of its own (ggml-alloc
    never owns a view), and the best fit is V's 1 KiB, freed by V's cache write just before in the
    interleaved order, while V's mat-mul ran on another stream: the seven regions are cleared."""
    s, seen = _session("small", upstream=upstream)
    try:
        Stepper(s, RunResult({}, [], Counters())).step(StepPlan("decode", batch=1))
        formed = [e.fork_name for e in seen if isinstance(e, E.ConcurrentRegion)]
        refused = [e for e in seen if isinstance(e, E.ConcurrentRefused)]
        assert formed == [f"attn_norm-{il}" for il in range(first, 8)]
        assert all(e.branch_sizes == (5, 6, 7) for e in seen if isinstance(e, E.ConcurrentRegion))
        got = s.gpu.concurrent
        if upstream == "d99724f2":
            assert [(e.fork_name, e.reason, e.cleared) for e in refused] == [
                ("attn_norm-0", MIDDLE, 0), ("attn_norm-1", "writes of Vcur-1 (stream 2) overlap Kcur-1 (stream 3)", 7)]
            assert got is None
            return
        assert refused == []
        assert got is not None and got.checked and len(got.regions) == 8
        g = s.ctx.sched.splits[0].graph
        assert np.array_equal(g.nodes, got.original)           # all valid: the original order is back
        assert all(invalid_reason(g, r) == "" for r in got.regions)
    finally:
        s.close()


def test_branch_buffers_written_by_two_streams_make_the_region_invalid():
    s, _ = _session()
    try:
        Stepper(s, RunResult({}, [], Counters())).step(StepPlan("decode", batch=1))
        g = s.ctx.sched.splits[0].graph
        r = next(r for r in s.gpu.concurrent.regions if g.node(r.fork).name == "attn_norm-1")
        join = g.node(r.join)
        j0, j1 = join.data, join.data + join.nbytes()

        def apart(i):   # a node of its own memory, clear of the join's buffer (is_valid leaves that out)
            t = g.node(i)
            return t.view_src is None and (t.data + t.nbytes() <= j0 or t.data >= j1)
        ones = [g.node(i) for i, st in r.stream_of.items() if st == 1 and apart(i)]
        threes = [g.node(i) for i, st in r.stream_of.items() if st == 3 and apart(i)]
        q, v = next((a, b) for a in ones for b in threes if b.nbytes() <= a.nbytes())
        kept = v.data
        try:
            v.data = q.data                                  # one stream writes over another's output
            assert invalid_reason(g, r).startswith("writes of ") and "overlap" in invalid_reason(g, r)
        finally:
            v.data = kept
        assert invalid_reason(g, r) == ""
        moved = dict(r.stream_of)
        for i in r.stream_of:                # V's cache write, the cache's view and permute on K's stream:
            if g.node(i).name.startswith("cache_v_l1 (view)"):   # it reads V's row on stream 2
                r.stream_of[i] = 3
        try:
            assert invalid_reason(g, r) == "cache_v_l1 (view) (stream 3) reads Vcur-1 (view) (stream 2)"
        finally:
            r.stream_of.clear()
            r.stream_of.update(moved)
    finally:
        s.close()


def test_one_invalid_region_drops_every_region_and_the_interleaved_order_runs_on_one_stream(monkeypatch):
    real = gpu_backend.invalid_reason
    monkeypatch.setattr(gpu_backend, "invalid_reason",
                        lambda g, r: "forced" if g.node(r.fork).name == "attn_norm-2" else real(g, r))
    s, seen = _session()
    try:
        st = Stepper(s, RunResult({}, [], Counters()))
        for _ in range(4):
            st.step(StepPlan("decode", batch=1))
        dropped = [e for e in seen if isinstance(e, E.ConcurrentRefused) and e.cleared]
        assert [(e.fork_name, e.reason, e.cleared) for e in dropped] == [("attn_norm-2", "forced", 4)]
        assert s.gpu.concurrent is None
        g = s.ctx.sched.splits[0].graph
        order = [g.node(i).name for i in range(g.n_nodes)]
        q_rope = next(i for i in range(g.n_nodes) if g.node(i).op == Op.ROPE and g.node(i).name == "Qcur-1")
        assert order.index("Vcur-1") < q_rope  # still interleaved
        assert not [e for e in seen if isinstance(e, E.ChunkBoundary) and e.moved_by == "concurrent region"]
        assert "4 concurrent regions dropped: fork node" in describe(dropped[0])
    finally:
        s.close()


@pytest.mark.parametrize("upstream,formed", [("0c1e57098", 4), ("d99724f2", 0)])
def test_one_used_device_of_two_visible_follows_the_upstream_rule(upstream, formed):
    s, seen = _session(upstream=upstream)
    s.gpu.driver.n_visible = 2             # a second device present, not used (CUDA_VISIBLE_DEVICES shows 2)
    try:
        Stepper(s, RunResult({}, [], Counters())).step(StepPlan("decode", batch=1))
        assert len([e for e in seen if isinstance(e, E.ConcurrentRegion)]) == formed
        off = [e for e in seen if isinstance(e, E.ConcurrentRefused) and e.fork_node < 0]
        assert bool(off) == (formed == 0)
        if off:
            assert describe(off[0]) == ("concurrent streams off for this split: 2 CUDA devices visible "
                                        "(d99724f2 needs exactly one)")
    finally:
        s.close()


@pytest.mark.parametrize("upstream,preset", [("0c1e57098", "tiny"), ("0c1e57098", "small"), ("d99724f2", "tiny")])
def test_every_byte_two_streams_of_a_valid_region_share_is_named(preset, upstream):
    """The branches of a region run at once, with no event between them until the join. ggml-alloc walks the
    interleaved order and hands a buffer to one branch while another still reads it: Q's rope goes over the
    fork's output (attn_norm), freed once V's mat-mul, the last in that order, has read it, while K's and
    V's mat-muls on the other streams may still be reading it; is_valid never looks at reads from before the
    fork and passes the region. Real llama.cpp computes other tokens with GGML_CUDA_GRAPH_OPT=1 on these
    graphs (H200): graphdiag launches the same, and every such pair is reported (ConcurrentRace), counting
    only what the kernels write (a fusion's elided nodes are never written)."""
    from graphdiag.backends.gpu.fusion import TOPK_MOE, fusion_plan, launching_nodes
    s, seen = _session(preset, upstream=upstream)
    try:
        Stepper(s, RunResult({}, [], Counters())).step(StepPlan("decode", batch=1))
        g = s.ctx.sched.splits[0].graph
        assert s.gpu.concurrent.regions and all(invalid_reason(g, r) == "" for r in s.gpu.concurrent.regions)
        plan = fusion_plan(g, 900, launching_nodes(g), upstream)
        written = set()
        for i in range(g.n_nodes):
            f = next((f for q, f in plan.items() if q <= i <= q + f.absorbed), None)
            q = next((q for q, f in plan.items() if q <= i <= q + f.absorbed), None)
            if f is None or i == q + f.absorbed or (f.pattern == TOPK_MOE and i == q + 3):
                written.add(i)
        reported = {e.fork_node: e for e in seen if isinstance(e, E.ConcurrentRace)}
        for r in s.gpu.concurrent.regions:
            writes, reads = [], []                              # by brute force, from the graph
            for i, stream in r.stream_of.items():
                t = g.node(i)
                if t.op in (0, 36, 37, 38, 39):
                    continue
                if i in written:
                    b = t.view_src or t
                    writes.append((b.data, b.data + b.nbytes(), stream, t.name))
                for x in t.src:
                    xb = None if x is None else (x.view_src or x)
                    if xb is not None and xb.idx >= g.arena.mark and xb.idx not in set(r.order):
                        reads.append((xb.data, xb.data + xb.nbytes(), stream, xb.name))
            shared = {frozenset((n, n2)) for lo, hi, st, n in writes for lo2, hi2, st2, n2 in writes + reads
                      if st != st2 and lo < hi2 and lo2 < hi}
            got = {frozenset((a, b)) for a, _, b, _ in races(g, r, plan)}
            assert shared == got
            if shared:
                e = reported[r.fork]
                assert e.n_pairs == len(races(g, r, plan)) and frozenset((e.writer, e.other)) in got
                assert "races" in describe(e) and e.writer in describe(e)
        # Q's rope (named Qcur-1, as its mat-mul) writes over attn_norm-1
        assert reported and ("Qcur-1", "attn_norm-1") in {(e.writer, e.other) for e in reported.values()}
        # without the plan a fused-away node would count as written: K's rope, elided by rope+view+set_rows
        r1 = next(r for r in s.gpu.concurrent.regions if g.node(r.fork).name == "attn_norm-1")
        assert any("Kcur-1" in (a, b) for a, _, b, _ in races(g, r1))
        assert not any("Kcur-1" in (a, b) for a, _, b, _ in races(g, r1, plan))
    finally:
        s.close()


def test_a_branch_writing_over_the_fork_output_another_stream_reads_is_a_race():
    s, _ = _session()
    try:
        Stepper(s, RunResult({}, [], Counters())).step(StepPlan("decode", batch=1))
        g = s.ctx.sched.splits[0].graph
        r = next(r for r in s.gpu.concurrent.regions if g.node(r.fork).name == "attn_norm-1")
        fork = g.node(r.fork)
        i = next(i for i, st in r.stream_of.items() if st == 3 and g.node(i).view_src is None)
        t = g.node(i)
        kept = t.data
        try:
            t.data = fork.data                               # stream 3 writes what streams 1 and 2 still read
            assert any(a == t.name and b == fork.name for a, _, b, _ in races(g, r))
        finally:
            t.data = kept
    finally:
        s.close()

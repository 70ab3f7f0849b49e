"""0c1e57098's MoE weighted expert reduction (#25952) and the allocation dependencies graph_optimize adds for it
(#27301): the matcher (ggml_cuda_match_moe_weighted_reduction), the fused kernel's simulated twin, the
launches it saves, and the allocator keeping the kept tensors alive until the reduction's output has run."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.cpu import CpuBackend
from graphdiag.backends.gpu.capture import lower_graph
from graphdiag.backends.gpu.fusion import (MOE_WR, fusion_plan, moe_alloc_deps, moe_reduction,
                                           moe_reduction_operands)
from graphdiag.backends.gpu.fusion_graph import consumer_counts
from graphdiag.backends.gpu.lowering import op_launches
from graphdiag.backends.sim_kernels import run_kernel
from graphdiag.backends.sim_view import AddressSpace
from graphdiag.config import resolve
from graphdiag.ir.arena import Arena
from graphdiag.ir.build import Ctx
from graphdiag.ir.dtypes import GGMLType
from graphdiag.ir.graph import Graph
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model
from graphdiag.runner import run
from graphdiag.sched.alloc import GraphAllocator

F32 = GGMLType.F32


def _moe_graph(n_tokens: int):
    m = create_model(PRESETS["moe-tiny"], GGMLType.F16, with_data=False)
    gtype = DECODE if n_tokens == 1 else PREFILL
    return build_graph(m, GraphParams(n_tokens, 1, 1, gtype, 256)).graph


@pytest.mark.parametrize("n_tokens", [1, 7])
def test_each_layers_weighted_sum_fuses_into_one_launch(n_tokens):
    """moe-tiny (k = 2): MUL, 2 VIEWs, 1 ADD per layer become one moe_weighted_reduction_f32; not under
    d99724f2, which predates it."""
    g = _moe_graph(n_tokens)
    plan = fusion_plan(g, 900)
    at = sorted(i for i, f in plan.items() if f.pattern == MOE_WR)
    assert len(at) == PRESETS["moe-tiny"].n_layer and all(plan[i].absorbed == 3 for i in at)
    assert [g.node(i + 3).name for i in at][0].startswith("ffn_moe_out-0")
    names = [la.kernel for op in lower_graph(g, plan, 900) if op is not None for la in op_launches(op)]
    assert names.count("moe_weighted_reduction_f32") == len(at)
    assert not any(f.pattern == MOE_WR for f in fusion_plan(g, 900, upstream="d99724f2").values())


def _reduction(k: int, t: int, scaled: bool, views_off: int = 0):
    """experts (E, k, t) [* scale (1, k, t)] * weights (1, k, t), its k views and the ADD chain."""
    c = Ctx(Arena())
    d = 64
    experts = c.new_input(F32, (d, k, t), "experts")
    w = c.new_input(F32, (1, k, t), "weights")
    cur = experts
    if scaled:
        cur = c.mul(experts, c.new_input(F32, (1, k, t), "scale"), "scaled")
    weighted = c.mul(cur, w, "weighted")
    views = [c.view(weighted, (d, t), (weighted.nb[0], weighted.nb[2], weighted.nb[2] * t, weighted.nb[2] * t),
                    (i + views_off) * weighted.nb[1], f"view {i}") for i in range(k)]
    g = Graph(c.arena)
    for v in views:
        g.build_forward_expand(v)
    out = views[0]
    for i in range(1, k):
        out = c.add(out, views[i], f"sum {i}")
    g.build_forward_expand(out)
    return g


@pytest.mark.parametrize("k,scaled", [(2, False), (4, True), (15, False)])
def test_both_forms_match_up_to_fifteen_experts(k, scaled):
    g = _reduction(k, 3, scaled)
    m = moe_reduction(g, 0, consumer_counts(g))
    assert m is not None and m[0] == 2 * k + (1 if scaled else 0) == g.n_nodes
    assert (m[2] is not None) == scaled and m[1].name == "experts" and m[3].name == "weights"
    assert moe_reduction_operands(g, 0) == (m[1], m[2], m[3])     # what the lowering reads back


@pytest.mark.parametrize("k,off", [(16, 0), (1, 0), (3, 1)])
def test_too_many_or_few_experts_or_a_shifted_view_do_not_match(k, off):
    """16 experts (33 nodes: more than ggml_can_fuse_subgraph takes), 1 (nothing to sum), views one row off."""
    g = _reduction(k, 2, False, views_off=off)
    assert moe_reduction(g, 0, consumer_counts(g)) is None
    if off:
        g = _reduction(k, 2, False)
        assert moe_reduction(g, 0, consumer_counts(g)) is not None


def _run(space, name, slots):
    p = new_params()
    for i, s in enumerate(slots):
        if s is not None:
            set_desc(p, i, *s)
    run_kernel(space, name, p)


def _put(space, a: np.ndarray):
    a = np.ascontiguousarray(a, np.float32)
    addr = space.alloc(a.nbytes)
    space.bytes(addr, a.nbytes)[...] = np.frombuffer(a.tobytes(), np.uint8)
    ne = tuple(reversed(a.shape)) + (1,) * (4 - a.ndim)
    nb = [4]
    for n in ne[:-1]:
        nb.append(nb[-1] * n)
    return addr, int(F32), ne, tuple(nb)


@pytest.mark.parametrize("scaled", [False, True])
def test_the_fused_kernel_is_the_unfused_sum(scaled):
    rng = np.random.default_rng(1)
    t, k, d = 5, 3, 300
    e = rng.standard_normal((t, k, d)).astype(np.float32)
    w = rng.random((t, k, 1)).astype(np.float32)
    s = rng.random((t, k, 1)).astype(np.float32) if scaled else np.ones((t, k, 1), np.float32)
    space = AddressSpace(0x7F00_0000_0000)
    dst = _put(space, np.zeros((t, d), np.float32))
    _run(space, "moe_weighted_reduction_f32", [dst, _put(space, e), _put(space, w), _put(space, s) if scaled else None])
    want = (e[:, 0] * s[:, 0]) * w[:, 0]
    for x in range(1, k):
        want = want + (e[:, x] * s[:, x]) * w[:, x]
    np.testing.assert_array_equal(space.ndarray(dst[0], int(F32), dst[2], dst[3]).reshape(t, d), want)


def test_graph_optimize_keeps_experts_and_weights_alive_until_the_output():
    """The dependencies name, per layer, the reduction's output and its experts and router weights."""
    g = _moe_graph(4)
    deps: dict[int, list[int]] = {}
    moe_alloc_deps(g, deps)
    out = {u: k for u, k in deps.items() if g.arena.rec["name"][u].decode().startswith("ffn_moe_out-")}
    assert len(out) == PRESETS["moe-tiny"].n_layer          # (the router's own are test_topk_moe.py's)
    for until, kept in out.items():
        names = sorted(g.arena.rec["name"][kept].astype(str).tolist())
        assert [n.split("-")[0] for n in names] == ["ffn_moe_down", "ffn_moe_weights"]


def test_a_kept_tensor_is_not_reused_before_its_node_has_run():
    """x -> a -> b (a's last reader) -> c: b and c take a's memory in place; with a kept until c has run (a
    second reader of a, the dependency node), neither can, and c lies apart from a."""
    c = Ctx(Arena())
    x = c.new_input(F32, (256,), "x")
    a = c.scale(x, 2.0, "a")
    b = c.scale(a, 2.0, "b")
    y = c.add(b, x, "c")
    g = Graph(c.arena)
    g.build_forward_expand(y)

    def addrs(deps):
        alloc = GraphAllocator([CpuBackend()])
        alloc.deps = deps
        alloc.alloc_graph(g, [0] * g.n_nodes, [0] * len(g.leafs))
        return a.data, y.data
    a0, y0 = addrs({})
    assert a0 == y0 == b.data
    a1, y1 = addrs({y.idx: [a.idx]})
    assert not (a1 <= y1 < a1 + a.nbytes() or y1 <= a1 < y1 + y.nbytes())


def test_a_simulated_moe_run_fuses_and_meets_the_oracle(capsys):
    cfg = resolve({"backend": "sim", "model": "moe-tiny", "steps": 4, "prompt_tokens": 12, "oracle": True,
                   "verify": True, "nvtx": False}, environ={})
    r = run(cfg)
    fused = [e for e in r.events if type(e).__name__ == "FusionApplied" and e.pattern == MOE_WR]
    assert fused
    assert all(e.ok for e in r.events if type(e).__name__ == "OracleCheck")

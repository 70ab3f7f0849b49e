"""The top-k MoE router fusion (ggml-cuda's topk_moe, in d99724f2 and 0c1e57098): SOFT_MAX, RESHAPE, ARGSORT,
VIEW (the ids), GET_ROWS (the weights) [, the weight norm of llama's MoE: RESHAPE, SUM_ROWS, CLAMP, DIV,
RESHAPE] [, SCALE] as one topk_moe_f32 launch; the matcher's conditions
(ggml_cuda_topk_moe_fusion, ggml_can_fuse_subgraph, ggml_cuda_should_use_topk_moe), the memory-range check
that lets the logits alias the outputs, the kernel's simulated twin against the unfused ops, and the
allocation dependencies graph_optimize adds for it at 0c1e57098."""

from __future__ import annotations

import re

import numpy as np
import pytest

from graphdiag.backends import cpu_ops as ops
from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.gpu.capture import lower_graph
from graphdiag.backends.gpu.fusion import TOPK_MOE, fusion_plan, moe_alloc_deps, topk_moe
from graphdiag.backends.gpu.fusion_graph import consumer_counts
from graphdiag.backends.gpu.lowering import lower_node, op_launches
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

F32, I32 = GGMLType.F32, GGMLType.I32


def _moe_graph(n_tokens: int):
    m = create_model(PRESETS["moe-tiny"], GGMLType.F16, with_data=False)
    return build_graph(m, GraphParams(n_tokens, 1, 1, DECODE if n_tokens == 1 else PREFILL, 256)).graph


def _router(n_expert=8, k=2, t=3, softmax_scale=1.0, scale=None, extra_reader=False, computed=False, norm=None):
    """The router as llama.cpp's build_moe_ffn builds it (softmax gating, no bias, no norm); `computed`: the
    logits a node's output (node 0, the router's softmax node 1), not an input; `norm`: the weight norm after
    the GET_ROWS (norm_w: "norm") or a variant of it (_norm)."""
    c = Ctx(Arena())
    logits = c.new_input(F32, (n_expert, t), "logits")
    if computed:
        logits = c.scale(logits, 1.0, "logits (computed)")
    probs = c.soft_max(logits, "probs", softmax_scale)
    topk = c.argsort_top_k(probs, k, "topk", "argsort")
    probs3 = c.reshape(probs, (1, n_expert, t), "probs3")
    w = c.get_rows(probs3, topk, "weights")
    g, after = Graph(c.arena), None
    if norm is not None:
        w, after = _norm(c, w, k, t, norm)
    g.build_forward_expand(w)
    if after is not None:
        g.build_forward_expand(after)
    if scale is not None:
        g.build_forward_expand(c.scale(w, scale, "weights_scaled"))
    if extra_reader:
        g.build_forward_expand(c.scale(probs, 2.0, "probs_elsewhere"))
    return g


@pytest.mark.parametrize("n_tokens", [1, 7])
def test_each_layers_router_is_one_launch(n_tokens):
    """moe-tiny (8 experts, k = 2): softmax, argsort and get_rows become one topk_moe_f32 per layer, at 1 token
    and in a batch, under either upstream."""
    g = _moe_graph(n_tokens)
    for upstream in ("0c1e57098", "d99724f2"):
        plan = fusion_plan(g, 900, upstream=upstream)
        at = sorted(i for i, f in plan.items() if f.pattern == TOPK_MOE)
        assert len(at) == PRESETS["moe-tiny"].n_layer and all(plan[i].absorbed == 4 for i in at)
        assert [g.node(i).name for i in at][0] == "ffn_moe_probs-0"
        names = [la.kernel for op in lower_graph(g, plan, 900) if op is not None for la in op_launches(op)]
        assert names.count("topk_moe_f32") == len(at)
        assert "argsort_f32_i32_desc" not in names and "soft_max_f32" not in names


def test_the_match_and_its_scale():
    g = _router(scale=0.5)
    m = topk_moe(g, 0, consumer_counts(g))
    assert m is not None and m[0] == 6 and m[1].name == "logits" and m[2].name == "topk" and m[3].name == "weights_scaled"
    op = lower_graph(g, fusion_plan(g, 900), 900)[0]
    assert op.launch.kernel == "topk_moe_f32" and op.launch.params["fp"][0] == np.float32(0.5)
    assert op.launch.params["ip"][0] == 2 and op.launch.grid == (1, 1, 1) and op.launch.block == (32, 8, 1)


@pytest.mark.parametrize("kw", [{"n_expert": 12}, {"n_expert": 1024}, {"softmax_scale": 0.5},
                                {"extra_reader": True}])
def test_what_upstream_does_not_fuse(kw):
    """An expert count launch_topk_moe_cuda has no instantiation for (12, above 512), a scaled softmax, or
    probabilities read outside the group (ggml_can_fuse_subgraph): the ops launch apart."""
    plain = _router()
    assert topk_moe(plain, 0, consumer_counts(plain)) is not None
    g = _router(**kw)
    assert topk_moe(g, 0, consumer_counts(g)) is None


@pytest.mark.parametrize("t,fuses", [(1, {"0c1e57098": True, "d99724f2": True}),
                                     (3, {"0c1e57098": True, "d99724f2": False}),
                                     (9, {"0c1e57098": False, "d99724f2": False})])
def test_the_logits_may_alias_the_weights_where_one_block_reads_them_all(t, fuses):
    """ggml_cuda_check_fusion_memory_ranges(is_topk_moe): the logits may overlap an output when one block
    holds every row (0c1e57098: up to TOPK_MOE_ROWS_PER_BLOCK = 8 rows; d99724f2: one row)."""
    from graphdiag.backends.gpu.fusion import _topk_moe_fuses
    g = _router(t=t, computed=True)
    base = 0x7000_0000_0000
    for k, idx in enumerate(list(g.leafs) + list(g.nodes)):
        g.arena.rec["data"][idx] = base + 0x10000 * (k + 1)
    logits, weights = g.node(1).src[0], g.node(5)
    assert g.node(1).op.name == "SOFT_MAX" and weights.name == "weights"
    g.arena.rec["data"][weights.idx] = logits.data           # the weights written over the logits
    consumers = consumer_counts(g)
    for upstream, want in fuses.items():
        assert bool(_topk_moe_fuses(g, 1, consumers, upstream)) is want, upstream


def test_288_and_576_experts_have_an_instantiation():
    for n in (288, 576):
        g = _router(n_expert=n, k=8)
        assert topk_moe(g, 0, consumer_counts(g)) is not None


def _put(space, a, t=F32):
    a = np.ascontiguousarray(a)
    addr = space.alloc(a.nbytes)
    space.bytes(addr, a.nbytes)[:] = a.view(np.uint8).reshape(-1)
    ne = list(a.shape[::-1]) + [1] * (4 - a.ndim)
    nb = [a.itemsize]
    for n in ne[:3]:
        nb.append(nb[-1] * n)
    return addr, int(t), tuple(ne), tuple(nb)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_the_fused_kernel_is_softmax_argsort_and_get_rows(scale):
    rng = np.random.default_rng(3)
    t, n, k = 9, 16, 4
    logits = rng.standard_normal((t, n)).astype(np.float32)
    logits[2, 5] = logits[2, 7]                          # a tie: the lower expert first, as the argsort
    space = AddressSpace(0x7F00_0000_0000)
    w = _put(space, np.zeros((t, k), np.float32))
    sorted_ids = _put(space, np.full((t, n), -1, np.int32), I32)   # the argsort's rows; the view: the first k
    view = (sorted_ids[0], int(I32), (k, t, 1, 1), (4, 4 * n, 4 * n * t, 4 * n * t))
    lg = _put(space, logits)
    p = new_params()
    for slot, (addr, typ, ne, nb) in enumerate((w, view, lg)):
        set_desc(p, slot, addr, typ, ne, nb)
    p["ip"][0], p["fp"][0] = k, scale
    run_kernel(space, "topk_moe_f32", p)
    probs = ops.soft_max(logits)
    want_ids = ops.argsort(probs, True)[:, :k]
    got_ids = space.ndarray(sorted_ids[0], int(I32), (n, t, 1, 1), sorted_ids[3]).reshape(t, n)
    np.testing.assert_array_equal(got_ids[:, :k], want_ids)
    assert (got_ids[:, k:] == -1).all()                 # the rest of the argsort's rows untouched
    want_w = np.take_along_axis(probs, want_ids, axis=1) * np.float32(scale)
    # the softmax times 1 / sum as upstream's kernel, where the unfused op divides: the last bit may differ
    np.testing.assert_allclose(space.ndarray(w[0], int(F32), w[2], w[3]).reshape(t, k), want_w, rtol=2e-7, atol=0)


def test_a_nan_or_infinite_logit_gives_upstreams_row():
    """topk_moe_cuda: a NaN or infinite logit makes the row's softmax NaN, and a NaN p is -FLT_MAX, so the
    argmax still picks k distinct experts (the lowest, all equal) with weights -FLT_MAX * scale."""
    t, n, k = 3, 8, 2
    logits = np.random.default_rng(4).standard_normal((t, n)).astype(np.float32)
    logits[0, 3], logits[1, 6] = np.nan, np.inf
    got_ids, got_w = _run_topk(logits, k)
    assert got_ids[:2].tolist() == [[0, 1], [0, 1]] and (got_w[:2] == np.float32(-3.402823466e38)).all()
    assert np.isfinite(got_w[2]).all() and got_w[2, 0] >= got_w[2, 1] > 0


def test_graph_optimize_keeps_the_router_alive_until_the_node_after_it():
    """0c1e57098's add_alloc_deps(i, i + ops.size()): every node of the group and their sources, kept until
    the node after the group (the experts' input reshape in moe-tiny)."""
    g = _moe_graph(3)
    deps: dict[int, list[int]] = {}
    moe_alloc_deps(g, deps)
    names = g.arena.rec["name"]
    routed = {names[u].decode(): sorted(names[k].decode() for k in kept) for u, kept in deps.items()
              if re.fullmatch(r"ffn_norm-\d+ \(reshaped\)", names[u].decode())}
    assert len(routed) == PRESETS["moe-tiny"].n_layer
    assert routed["ffn_norm-0 (reshaped)"] == sorted(["ffn_moe_logits-0", "ffn_moe_probs-0", "ffn_moe_probs-0 (reshaped)",
                                             "ffn_moe_argsort-0", "ffn_moe_topk-0", "ffn_moe_weights-0"])


def test_a_simulated_moe_run_fuses_the_router_and_meets_the_oracle():
    cfg = resolve({"backend": "sim", "model": "moe-tiny", "steps": 4, "prompt_tokens": 12, "oracle": True,
                   "verify": True, "nvtx": False}, environ={})
    r = run(cfg)
    assert [e for e in r.events if type(e).__name__ == "FusionApplied" and e.pattern == TOPK_MOE]
    checks = [e for e in r.events if type(e).__name__ == "OracleCheck"]
    assert checks and all(e.ok for e in checks)
    assert all(e.ok for e in r.events if type(e).__name__ == "VerifyResult")


# -- the weight norm (build_moe_ffn's norm_w: llama's MoE) ---------------------------------------------------
MIN = 6.103515625e-5


def _norm(c: Ctx, w, k: int, t: int, form: str):
    """(weights, a node to add after them or None): build_moe_ffn's norm_w after the weights' GET_ROWS (form
    "norm"), or a variant upstream's matcher reads otherwise: "sum-read-elsewhere" (the SUM_ROWS also read by a
    node after the group), "no-clamp" (the DIV by the SUM_ROWS itself), "reshape-then-scale" (a SCALE of the
    first RESHAPE where the SUM_ROWS would be)."""
    w2 = c.reshape(w, (k, t), "weights (reshaped)")
    if form == "reshape-then-scale":
        return c.scale(w2, 0.5, "w2 scaled"), None
    total = c.sum_rows(w2, "weights_sum")
    lo = total if form == "no-clamp" else c.clamp(total, MIN, np.inf, "weights_sum_clamped")
    out = c.reshape(c.div(w2, lo, "weights_norm"), (1, k, t), "weights_norm (reshaped)")
    return out, (c.scale(total, 2.0, "sum elsewhere") if form == "sum-read-elsewhere" else None)


@pytest.mark.parametrize("scale", [None, 0.5])
def test_the_weight_norm_joins_the_router(scale):
    """ggml_cuda_topk_moe_fusion's args.norm: RESHAPE, SUM_ROWS, CLAMP, DIV (of the RESHAPE by the CLAMP),
    RESHAPE after the GET_ROWS join the group (10 nodes, 11 with a SCALE of the weights after them); the launch
    carries the norm (ip[1]) and the CLAMP's minimum (fp[1]), and writes the last node."""
    g = _router(norm="norm", scale=scale)
    m = topk_moe(g, 0, consumer_counts(g))
    assert m is not None and m.count == (10 if scale is None else 11) and m.clamp.name == "weights_sum_clamped"
    assert [g.node(i).op.name for i in range(5, 10)] == ["RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"]
    plan = fusion_plan(g, 900)
    assert plan == {0: type(plan[0])(TOPK_MOE, m.count - 1)}
    op = lower_graph(g, plan, 900)[0]
    p = op.launch.params
    assert op.launch.kernel == "topk_moe_f32" and list(p["ip"][:2]) == [2, 1]
    assert p["fp"][0] == np.float32(scale or 1.0) and p["fp"][1] == np.float32(MIN)
    assert tuple(p["t"][0]["ne"]) == (1, 2, 3, 1) and tuple(p["t"][1]["ne"]) == (2, 3, 1, 1)   # weights, ids
    assert [x for x in lower_graph(g, plan, 900)[1:] if x is not None] == []     # nothing else launches


@pytest.mark.parametrize("form,count", [("sum-read-elsewhere", None), ("no-clamp", 5), ("reshape-then-scale", 5)])
def test_what_upstream_does_with_another_norm(form, count):
    """A SUM_ROWS also read outside the group fails ggml_can_fuse_subgraph for the whole group (nothing fuses,
    as upstream: no fallback to the plain router); a chain that breaks after its first RESHAPE (no CLAMP, or
    something else where the SUM_ROWS would be) leaves the plain router fused and no SCALE looked for."""
    g = _router(norm=form)
    m = topk_moe(g, 0, consumer_counts(g))
    assert (m.count if m is not None else None) == count
    if m is not None:
        assert m.clamp is None and m.scale is None
        plan = fusion_plan(g, 900)
        assert lower_node(g, 0, plan[0], 900).launch.params["ip"][1] == 0
    else:
        assert fusion_plan(g, 900) == {}


def test_an_unfused_weight_norm_lowers_to_kernels_of_its_own():
    """With fusion off (or refused) SUM_ROWS, CLAMP and DIV each launch their own kernel, as ggml-cuda's unfused
    ops (k_sum_rows_f32, the clamp kernel, k_bin_bcast op_div); the CLAMP carries its bounds."""
    from graphdiag.backends.gpu.fusion_graph import launching_nodes
    from graphdiag.backends.gpu.lowering import lower_node
    from graphdiag.ir.ops import Op
    g = _router(norm="norm")
    launches = launching_nodes(g)
    got = {}
    for i in range(g.n_nodes):
        node = g.node(i)
        if node.op in (Op.SUM_ROWS, Op.CLAMP, Op.DIV) and launches[i]:
            got[node.op] = lower_node(g, i, None, 900).launch
    assert {op: l.kernel for op, l in got.items()} == {Op.SUM_ROWS: "sum_rows_f32", Op.CLAMP: "clamp_f32",
                                                       Op.DIV: "div_f32"}
    clamp = next(g.node(i) for i in range(g.n_nodes) if g.node(i).op == Op.CLAMP)
    assert tuple(got[Op.CLAMP].params["fp"][:2]) == (np.float32(clamp.param_f32(0)), np.float32(clamp.param_f32(1)))


def _run_topk(logits, k, scale=1.0, lo=None):
    """topk_moe_f32's twin on (T, n) logits; (ids (T, k), weights (T, k))."""
    t, n = logits.shape
    space = AddressSpace(0x7F00_0000_0000)
    w = _put(space, np.zeros((t, k), np.float32))
    ids = _put(space, np.full((t, n), -1, np.int32), I32)
    p = new_params()
    for slot, (addr, typ, ne, nb) in enumerate((w, (ids[0], int(I32), (k, t, 1, 1), (4, 4 * n, 4 * n * t, 4 * n * t)),
                                                _put(space, logits))):
        set_desc(p, slot, addr, typ, ne, nb)
    p["ip"][:2] = k, int(lo is not None)
    p["fp"][:2] = scale, (lo if lo is not None else -np.inf)
    run_kernel(space, "topk_moe_f32", p)
    return (space.ndarray(ids[0], int(I32), (n, t, 1, 1), ids[3]).reshape(t, n)[:, :k],
            space.ndarray(w[0], int(F32), w[2], w[3]).reshape(t, k))


@pytest.mark.parametrize("n,k,t,scale,lo", [(8, 2, 9, 1.0, MIN), (64, 6, 5, 2.5, MIN), (64, 40, 3, 1.0, MIN),
                                            (576, 8, 4, 1.0, MIN), (64, 2, 7, 1.0, 0.99)])
def test_the_normalised_kernel_is_the_unfused_norm(n, k, t, scale, lo):
    """The twin against the unfused ops in numpy: softmax, the descending argsort's first k, the weights'
    rows, SUM_ROWS, CLAMP (0.99: above every kept sum of 2 of 64, so the minimum divides), DIV, SCALE; the
    kernel multiplies by 1 / sum where DIV divides, so the last bit may differ."""
    logits = np.random.default_rng(n + k).standard_normal((t, n)).astype(np.float32) * np.float32(3)
    got_ids, got_w = _run_topk(logits, k, scale, lo)
    probs = ops.soft_max(logits)
    want_ids = ops.argsort(probs, True)[:, :k]
    kept = np.take_along_axis(probs, want_ids, axis=1)
    want = ops.scale(ops.div(kept, ops.clamp(ops.sum_rows(kept), lo, np.inf)), scale)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_w, want, rtol=4e-7, atol=0)
    if lo == 0.99:
        assert (ops.sum_rows(kept) < lo).all()


def test_the_normalised_kernel_sums_as_the_warp_does():
    """The kept p are summed per lane (expert % 32, in round order), then by the warp's butterfly: with k = 40
    of 64 the order differs from a plain left-to-right sum, and the twin follows the kernel's to the bit."""
    logits = np.random.default_rng(11).standard_normal((5, 64)).astype(np.float32)
    ids, w = _run_topk(logits, 40, 1.0, MIN)
    probs = ops.soft_max(logits)       # the kernel's p: exp(x - max) * (1 / sum), as the twin computes it
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = e * (np.float32(1) / e.sum(axis=1, keepdims=True, dtype=np.float32))
    kept = np.take_along_axis(p, ids, axis=1)
    lanes = np.zeros((5, 32), np.float32)
    for r in range(40):
        lanes[np.arange(5), ids[:, r] % 32] += kept[:, r]
    for off in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[:, np.arange(32) ^ off]
    np.testing.assert_array_equal(w, kept * (np.float32(1) / lanes[:, :1]))
    plain = np.zeros(5, np.float32)
    for r in range(40):
        plain += kept[:, r]
    assert (plain != lanes[:, 0]).any() and np.allclose(probs, p, rtol=1e-6)


def test_a_nan_logit_with_the_norm_gives_upstreams_row():
    """A NaN logit: every p -FLT_MAX, the k kept sum to -inf, the CLAMP's minimum wins (fmaxf), so each weight
    is -FLT_MAX * (1 / 6.1e-5) = -inf, as upstream's kernel computes it."""
    logits = np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)
    logits[0, 4] = np.nan
    ids, w = _run_topk(logits, 2, 1.0, MIN)
    assert ids[0].tolist() == [0, 1] and (w[0] == -np.inf).all() and np.isfinite(w[1]).all()

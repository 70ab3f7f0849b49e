"""Fusion rules of the Gemma 3 / Qwen graphs (ggml_cuda_try_fuse, 0c1e57098) on small graphs built with Ctx:
which nodes fuse and which do not, the kernels the lowering launches for them, and the fused graph computed
on the simulated GPU equal to the CPU backend's unfused ops."""

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.cpu import CpuBackend
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.fusion import MMV_ADD, MMV_GLU, RMS_NORM_MUL, fusion_plan
from graphdiag.backends.gpu.fusion_norm import RMS_NORM_MUL_ADD, RMS_NORM_MUL_ROPE, RMS_NORM_MUL_ROPE_SET_ROWS
from graphdiag.backends.gpu.lowering import lower_node, op_launches
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.ir import Arena, GGMLType as G, GluOp, Graph
from graphdiag.ir.build import Ctx
from support.placement import place_tensors

E_, D, H, HKV, FF, N_CACHE = 64, 32, 4, 1, 128, 16
NEOX = 2


def gemma_piece(c: Ctx, t: int, k_extra_use: bool = False, mul_extra_use: bool = False,
                strided_residual: bool = False, swap_glu: bool = False):
    """Q/K QK-norm + NEOX rope (Q scaled, K into its cache), a post-norm + residual ADD, GEGLU FFN.
    Returns (outputs, leaves by name)."""
    L = {}
    leaf = lambda ty, ne, name: L.setdefault(name, c.new_tensor(ty, ne, name))  # noqa: E731
    x, wq, wk = leaf(G.F32, (E_, t), "x"), leaf(G.F16, (E_, D * H), "wq"), leaf(G.F16, (E_, D * HKV), "wk")
    qn, kn, pn = leaf(G.F32, (D,), "qn"), leaf(G.F32, (D,), "kn"), leaf(G.F32, (E_,), "pn")
    wg, wu, attn = leaf(G.F16, (E_, FF), "wg"), leaf(G.F16, (E_, FF), "wu"), leaf(G.F32, (E_, t), "attn")
    kc = leaf(G.F16, (D * HKV, N_CACHE), "kc")
    L["pos"], L["kidx"] = c.new_input(G.I32, (t,), "pos"), c.new_input(G.I32, (t,), "kidx")
    q = c.reshape(c.mul_mat(wq, x, "Qcur"), (D, H, t), "Qcur (reshaped)")
    q = c.rope(c.mul(c.rms_norm(q, 1e-6, "q_norm"), qn, "Qcur_normed"), L["pos"], D, 1e6, "Qcur_rope", mode=NEOX)
    q = c.scale(q, D ** -0.5, "Qcur_scaled")
    k = c.reshape(c.mul_mat(wk, x, "Kcur"), (D, HKV, t), "Kcur (reshaped)")
    k = c.rope(c.mul(c.rms_norm(k, 1e-6, "k_norm"), kn, "Kcur_normed"), L["pos"], D, 1e4, "Kcur_rope", mode=NEOX)
    outs = [q, k]
    k2 = c.view(k, (D * HKV, t), (k.nb[0], k.nb[2], k.nb[2] * t, k.nb[2] * t), 0, "Kcur_rope (view)")
    outs.append(c.set_rows(kc, k2, L["kidx"], "cache_k (set_rows)"))
    if k_extra_use:
        outs.append(c.scale(k, 2.0, "k_reader"))
    post = c.mul(c.rms_norm(attn, 1e-6, "post_norm"), pn, "attn_post_norm")
    res = x
    if strided_residual:       # the residual as a view with padded rows: not contiguous
        wide = leaf(G.F32, (E_ + 8, t), "wide")
        res = c.view(wide, (E_, t), (4, wide.nb[1]), 0, "res (view)")
    sa = c.add(res, post, "sa_out") if strided_residual else c.add(post, res, "sa_out")
    if mul_extra_use:
        outs.append(c.scale(post, 3.0, "post_reader"))
    gate, up = c.mul_mat(wg, sa, "ffn_gate"), c.mul_mat(wu, sa, "ffn_up")
    if swap_glu:
        outs.append(up)        # ffn_up expanded first: the gate (the GLU's src[0]) is the second mat-mul
    outs.append(c.glu_split(gate, up, GluOp.GEGLU, "ffn_geglu"))
    return outs, L


def qwen2_bias_piece(c: Ctx, t: int):
    L = {"x": c.new_tensor(G.F32, (E_, t), "x"), "wq": c.new_tensor(G.F16, (E_, D * H), "wq"),
         "bq": c.new_tensor(G.F32, (D * H,), "bq")}
    return [c.add(c.mul_mat(L["wq"], L["x"], "Qcur"), L["bq"], "Qcur_b")], L


def graph_of(build, *args, **kw):
    arena = Arena()
    outs, leaves = build(Ctx(arena), *args, **kw)
    g = Graph(arena)
    for o in outs:
        g.build_forward_expand(o)
    return g, outs, leaves


def fused(g: Graph) -> dict[str, str]:
    """{first node's name: pattern} of the fusion plan."""
    return {g.node(i).name: f.pattern for i, f in fusion_plan(g).items()}


def test_gemma_piece_fuses_as_upstream_at_one_token():
    g, *_ = graph_of(gemma_piece, 1)
    assert fused(g) == {"q_norm": RMS_NORM_MUL_ROPE, "k_norm": RMS_NORM_MUL_ROPE_SET_ROWS,
                        "post_norm": RMS_NORM_MUL_ADD, "ffn_gate": MMV_GLU}


def test_geglu_mat_vec_fuses_at_one_token_not_at_two_the_norms_at_both():
    g, *_ = graph_of(gemma_piece, 2)
    assert fused(g) == {"q_norm": RMS_NORM_MUL_ROPE, "k_norm": RMS_NORM_MUL_ROPE_SET_ROWS,
                        "post_norm": RMS_NORM_MUL_ADD}


def test_a_roped_k_read_elsewhere_keeps_its_cache_write_apart():
    """The 5-op group needs the rope read only by its view; the 3-op one lets its last node have readers."""
    g, *_ = graph_of(gemma_piece, 1, k_extra_use=True)
    assert fused(g)["k_norm"] == RMS_NORM_MUL_ROPE


def test_norm_mul_add_only_when_the_mul_is_read_once_and_the_first_operand_is_contiguous():
    g, *_ = graph_of(gemma_piece, 1, mul_extra_use=True)
    assert fused(g)["post_norm"] == RMS_NORM_MUL
    g, *_ = graph_of(gemma_piece, 1, strided_residual=True)
    assert fused(g)["post_norm"] == RMS_NORM_MUL_ADD    # one row: its stride is no gap (ggml_is_contiguous)
    g, *_ = graph_of(gemma_piece, 2, strided_residual=True)
    assert fused(g)["post_norm"] == RMS_NORM_MUL


def test_mat_vec_bias_add_fuses_at_one_token_and_not_over_a_batch():
    assert fused(graph_of(qwen2_bias_piece, 1)[0]) == {"Qcur": MMV_ADD}
    assert fused(graph_of(qwen2_bias_piece, 2)[0]) == {}      # the bias row broadcasts: no fusion upstream


def _names(g: Graph, i: int, f) -> list[str]:
    return [launch.kernel for launch in op_launches(lower_node(g, i, f, 900))]


def test_the_fused_groups_lower_to_one_kernel_each_and_the_glu_gate_is_its_src0():
    g, _, L = graph_of(gemma_piece, 1, swap_glu=True)
    for n, (name, t) in enumerate(L.items()):
        t.data = 0x7000_0000 + 0x10_0000 * n          # distinct weight addresses, nodes unplaced
    plan = fusion_plan(g)
    kernels = {g.node(i).name: _names(g, i, f) for i, f in plan.items()}
    assert kernels == {"q_norm": ["rms_norm_mul_rope_f32"], "k_norm": ["rms_norm_mul_rope_set_rows_f16"],
                       "post_norm": ["rms_norm_mul_add_f32"], "ffn_up": ["mul_mat_vec_glu_f16"]}
    i = next(i for i in plan if g.node(i).name == "ffn_up")
    assert g.node(i + 1).name == "ffn_gate"
    p = op_launches(lower_node(g, i, plan[i], 900))[0].params
    # the GLU's src[0] (ffn_gate, node i + 1) gates: its weight in slot 1, the up weight in slot 2
    assert int(p["t"][1]["data"]) == L["wg"].data and int(p["t"][2]["data"]) == L["wu"].data
    assert int(p["ip"][0]) == GluOp.GEGLU


def test_unfused_scale_and_geglu_lower_to_their_kernels():
    g, *_ = graph_of(gemma_piece, 2)
    names = {g.node(i).name: i for i in range(g.n_nodes)}
    assert _names(g, names["Qcur_scaled"], None) == ["scale_f32"]
    assert _names(g, names["ffn_geglu"], None) == ["glu_geglu_f32"]


def _place_and_fill(g: Graph, leaves, alloc, write):
    """data for every tensor (a view at its source's data + offset), the leaves filled with seeded values."""
    rng = np.random.default_rng(5)
    place_tensors(g, alloc)
    for name, t in sorted(leaves.items()):
        n = int(np.prod(t.ne))
        if t.type == G.I32:
            v = np.array({"pos": [7, 300, 2], "kidx": [3, 11, 0]}[name][: t.ne[0]], np.int32)
        elif name == "kc":
            v = np.zeros(n, np.float16)
        else:
            v = rng.standard_normal(n).astype(np.float16 if t.type == G.F16 else np.float32)
        write(t.data, v)


@pytest.mark.parametrize("t", [1, 3])
def test_fused_graph_on_the_simulated_gpu_equals_the_cpu_backend(t):
    outs = []
    cpu = CpuBackend()
    g, o, L = graph_of(gemma_piece, t)
    _place_and_fill(g, L, cpu.buffer_alloc, cpu.tensor_set)
    cpu.graph_compute(g, 0)
    outs.append([cpu.tensor_get(x.data, x.nbytes()) for x in o])
    drv = SimDriver(memory_bytes=16 << 20)
    gpu = GpuBackend(drv, E.EventBus(), RuntimeOptions())
    try:
        g, o, L = graph_of(gemma_piece, t)
        assert len(fusion_plan(g)) == (4 if t == 1 else 3)
        _place_and_fill(g, L, gpu.buffer_alloc, gpu.tensor_set)
        gpu.graph_compute(g, 0)
        outs.append([gpu.tensor_get(x.data, x.nbytes()) for x in o])
    finally:
        gpu.close()
        drv.close()
    for x, a, b in zip(o, *outs):
        if x.name == "Kcur_rope":
            continue           # elided: the fused kernel writes the cache rows, not the rope's own output
        dt = np.float16 if x.type == G.F16 else np.float32
        want, got = a.view(dt).astype(np.float64), b.view(dt).astype(np.float64)
        # from 2 tokens the F16 mat-muls are upstream's MMF, whose tiles round x to F16 (graphdiag's tile kernel
        # does too) where the CPU backend keeps x in F32: within 2e-3 of the output's largest value
        atol = 2e-3 if dt == np.float16 else 2e-5 if t == 1 else 2e-3 * np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=atol, err_msg=x.name)

"""The file's weight types on the GPU path, without a GPU: the numpy twins of kernels/mmvq.cu against a
float reference (gguf's dequantisation), ggml's MUL_MAT dispatch at cc 9.0 (compat.mul_mat_path), the
lowering's kernels and launch counts per path, and the fusions ggml applies to these types."""

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from graphdiag.backends import qunits
from graphdiag.backends.gpu.compat import mul_mat_id_needs_sync, mul_mat_path
from graphdiag.backends.gpu.fusion import MMV_ADD, MMV_GLU, try_fuse
from graphdiag.backends.gpu.lowering import lower_node, op_launches
from graphdiag.backends.sim_kernels import quantize_q8_1
from graphdiag.ir.arena import Arena
from graphdiag.ir.build import Ctx
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.ir.graph import Graph
from graphdiag.ir.ops import GluOp
from support.quant_data import random_rows

TYPES = [*qunits.QUANT_TYPES, G.BF16]
RNG = np.random.default_rng(7)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_is_ggml_bit_for_bit(t):
    raw = random_rows(RNG, t, 1024, 9)
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType(int(t)))
    assert qunits.dequantize(raw, t).tobytes() == ref.astype(np.float32).tobytes()


def _dequantize_q8_1(xq):
    return (xq["d"].astype(np.float64)[..., None] * xq["qs"]).reshape(*xq.shape[:-1], -1)


@pytest.mark.parametrize("t", qunits.QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [256, 1024])
def test_integer_dots_are_the_float_product_of_the_dequantised_operands(t, k):
    """The MMVQ twin against float64 W . x over gguf's weights and the dequantised Q8_1 x: equal but for
    float32 rounding and the Q8_1 sum s (stored as f16, used by Q4_0/Q5_0/Q5_1's offsets)."""
    m, n = 37, 3
    raw = random_rows(RNG, t, k, m)
    x = RNG.standard_normal((n, k)).astype(np.float32)
    xq = quantize_q8_1(x)
    got = qunits.q8_dot(raw[None, None], t, xq[None, None])[0, 0]
    w = gguf_dequantize(raw, gguf.GGMLQuantizationType(int(t))).astype(np.float64)
    ref = _dequantize_q8_1(xq) @ w.T
    terms = np.abs(_dequantize_q8_1(xq)) @ np.abs(w).T           # sum |w x|: the float32 rounding's scale
    d_w = np.abs(w).reshape(m, -1, 32).max(-1)                    # >= |offset scale| of each block
    s_err = (np.abs(xq["s"].astype(np.float64)) * 2.0 ** -11) @ (16 * d_w).T
    assert np.all(np.abs(got - ref) <= 1e-6 * terms + s_err + 1e-30)
    # and the rounding of x to Q8_1 alone: |x - xq| <= d / 2 per element
    q_err = (np.repeat(xq["d"].astype(np.float64), 32, -1) / 2) @ np.abs(w).T
    assert np.all(np.abs(got - x.astype(np.float64) @ w.T) <= 1.001 * q_err + 1e-6 * terms + s_err)


def test_a_wrong_nibble_order_would_be_caught():
    """The float reference tells the halves of a Q4_0 block apart (a swap changes the product)."""
    raw = random_rows(RNG, G.Q4_0, 256, 4)
    swapped = raw.reshape(4, -1, 18).copy()
    swapped[..., 2:] = ((swapped[..., 2:] & 0xF) << 4) | (swapped[..., 2:] >> 4)
    x = quantize_q8_1(RNG.standard_normal((1, 256)).astype(np.float32))
    a = qunits.q8_dot(raw[None, None], G.Q4_0, x[None, None])
    b = qunits.q8_dot(swapped.reshape(4, -1)[None, None], G.Q4_0, x[None, None])
    assert not np.allclose(a, b)


# -- ggml's dispatch at cc 9.0 and the lowering --------------------------------------------------------
def _mm(t, k, m, n):
    ctx = Ctx(Arena())
    w = ctx.new_tensor(t, (k, m), "w")
    x = ctx.new_input(G.F32, (k, n), "x")
    out = ctx.mul_mat(w, x, "out")
    g = Graph(ctx.arena)
    g.build_forward_expand(out)
    return g, out


@pytest.mark.parametrize("t, n, path", [
    (G.Q4_K, 1, "mmvq"), (G.Q4_K, 8, "mmvq"), (G.Q4_K, 9, "mmq"), (G.Q5_0, 8, "mmvq"), (G.Q6_K, 512, "mmq"),
    (G.BF16, 1, "mmvf"), (G.BF16, 2, "mmf"), (G.BF16, 16, "mmf"), (G.BF16, 17, "cublas"),
    (G.F16, 1, "mmvf"), (G.Q8_0, 3, "mmvq")])
def test_mul_mat_path_follows_ggml_cuda_mul_mat_at_cc_9_0(t, n, path):
    _, out = _mm(t, 512, 64, n)
    assert mul_mat_path(out, 900) == path


def test_mmvq_batch_limits_of_other_devices():
    _, out = _mm(G.Q4_K, 512, 64, 6)
    assert mul_mat_path(out, 1200) == "mmq" and mul_mat_path(out, 900) == "mmvq"   # tuned on an RTX 5090


# ggml_cuda_should_use_mmvq's largest column count per (cc, type): 8 wherever upstream lists none
MMVQ_COLS = {(890, G.Q2_K): 4, (890, G.Q3_K): 6, (890, G.Q4_K): 8, (1200, G.Q2_K): 5, (1200, G.Q3_K): 5,
             (1210, G.Q2_K): 6, (1210, G.Q3_K): 8, (870, G.Q2_K): 1, (870, G.Q3_K): 1, (700, G.Q2_K): 4,
             (700, G.Q3_K): 6, (900, G.Q2_K): 8, (900, G.Q3_K): 8, (800, G.Q2_K): 8}


@pytest.mark.parametrize("cc, t", sorted(MMVQ_COLS), ids=lambda v: str(getattr(v, "name", v)))
def test_2_and_3_bit_k_quants_leave_mmvq_at_upstreams_column_count(cc, t):
    from graphdiag.backends.gpu.compat import mmvq_ok
    n = MMVQ_COLS[(cc, t)]
    assert mmvq_ok(t, cc, n) and not mmvq_ok(t, cc, n + 1)
    _, out = _mm(t, 512, 64, n + 1)
    assert mul_mat_path(out, cc) == "mmq"      # quantized, few columns: MMQ on every cc here


@pytest.mark.parametrize("cc, t, most", [(610, G.Q2_K, 4), (610, G.Q3_K, 4), (750, G.Q2_K, 7), (750, G.Q3_K, 5),
                                         (800, G.Q3_K, 5), (700, G.Q2_K, 8), (890, G.Q3_K, 8), (900, G.Q2_K, 8)])
def test_2_and_3_bit_k_quant_experts_take_mmvq_up_to_upstreams_token_count(cc, t, most):
    from graphdiag.backends.gpu.compat import mmvq_mmid_max_batch
    assert mmvq_mmid_max_batch(t, cc) == most


@pytest.mark.parametrize("t, name", [(G.Q4_0, "q4_0"), (G.Q5_0, "q5_0"), (G.Q5_1, "q5_1"), (G.Q4_K, "q4_k"),
                                     (G.Q5_K, "q5_k"), (G.Q6_K, "q6_k"), (G.Q2_K, "q2_k"), (G.Q3_K, "q3_k")])
def test_quantized_mul_mat_lowers_to_two_launches_on_both_paths(t, name):
    """Two launches on each path; on the MMQ path a third, the fixup of the k-split, where upstream's stream-k
    needs its fixup (one 64-row tile on the H200's 132 SMs), none where every tile has an SM (one SM)."""
    g, _ = _mm(t, 512, 64, 1)
    assert [l.kernel for l in op_launches(lower_node(g, 0, None, 900))] == ["quantize_q8_1", f"mul_mat_vec_{name}"]
    g, _ = _mm(t, 512, 64, 9)
    assert [l.kernel for l in op_launches(lower_node(g, 0, None, 900, nsm=1))] == [f"dequantize_f16_{name}",
                                                                                  "mul_mat_f16"]
    split = op_launches(lower_node(g, 0, None, 900))
    assert [l.kernel for l in split] == [f"dequantize_f16_{name}", "mul_mat_f16", "mul_mat_fixup_f32"]
    assert int(split[1].params["ip"][0]) == 8 and int(split[2].params["ip"][0]) == 7


def test_bf16_mul_mat_lowers_to_mmvf_then_tiles():
    for n, kernel in ((1, "mul_mat_vec_bf16"), (2, "mul_mat_bf16"), (64, "mul_mat_bf16")):
        g, _ = _mm(G.BF16, 512, 64, n)
        assert [l.kernel for l in op_launches(lower_node(g, 0, None, 900))] == [kernel]


def _ffn(t, n=1, glu=GluOp.GEGLU):
    ctx = Ctx(Arena())
    x = ctx.new_input(G.F32, (512, n), "x")
    gate = ctx.mul_mat(ctx.new_tensor(t, (512, 128), "wg"), x, "gate")
    up = ctx.mul_mat(ctx.new_tensor(t, (512, 128), "wu"), x, "up")
    out = ctx.glu_split(gate, up, glu, "glu")
    down = ctx.mul_mat(ctx.new_tensor(t, (128, 512), "wd"), out, "down")
    res = ctx.add(down, x, "res")
    g = Graph(ctx.arena)
    g.build_forward_expand(res)
    return g


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_gate_up_glu_and_down_add_fuse_at_one_token(t):
    from graphdiag.backends.gpu.fusion import consumer_counts
    g = _ffn(t)
    cons = consumer_counts(g)
    assert try_fuse(g, 0, cons).pattern == MMV_GLU
    assert try_fuse(g, 3, cons).pattern == MMV_ADD
    w = {G.BF16: "bf16"}.get(t, t.name.lower())
    glu = op_launches(lower_node(g, 0, try_fuse(g, 0, cons), 900))
    assert glu[-1].kernel == f"mul_mat_vec_glu_{w}" and glu[-1].params["ip"][0] == int(GluOp.GEGLU)
    add = op_launches(lower_node(g, 3, try_fuse(g, 3, cons), 900))
    assert add[-1].kernel == f"mul_mat_vec_add_{w}"
    assert len(glu) == len(add) == (1 if t == G.BF16 else 2)


def test_two_tokens_do_not_fuse():
    from graphdiag.backends.gpu.fusion import consumer_counts
    g = _ffn(G.Q4_K, n=2)
    assert try_fuse(g, 0, consumer_counts(g)) is None


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_moe_experts_of_the_new_types_take_a_fast_path(t):
    """3 tokens (ggml-cuda.cu ggml_cuda_mul_mat_id): quantized experts on mmvq (mmvq.cu
    ggml_cuda_mul_mat_vec_q: quantize_row_q8_1_cuda, then the kernel), BF16 on MMF with ids (one kernel)."""
    ctx = Ctx(Arena())
    experts = ctx.new_tensor(t, (256, 128, 4), "exps")
    x = ctx.new_input(G.F32, (256, 1, 3), "x")
    ids = ctx.new_input(G.I32, (2, 3), "ids")
    out = ctx.mul_mat_id(experts, x, ids, "moe")
    assert not mul_mat_id_needs_sync(out, 900)
    g = Graph(ctx.arena)
    g.build_forward_expand(out)
    w = {G.BF16: "bf16"}.get(t, t.name.lower())
    quantize = [] if t == G.BF16 else ["quantize_q8_1"]
    assert [l.kernel for l in op_launches(lower_node(g, 0, None, 900))] == [*quantize, f"mul_mat_id_vec_{w}"]


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_get_rows_of_every_type(t):
    ctx = Ctx(Arena())
    table = ctx.new_tensor(t, (512, 10), "tok_embd")
    out = ctx.get_rows(table, ctx.new_input(G.I32, (3,), "ids"), "inp_embd")
    g = Graph(ctx.arena)
    g.build_forward_expand(out)
    w = {G.BF16: "bf16"}.get(t, t.name.lower())
    assert [l.kernel for l in op_launches(lower_node(g, 0, None, 900))] == [f"get_rows_{w}"]

"""Q4_1, IQ4_NL and IQ4_XS in ggml's CUDA decisions, without a GPU: the MMVQ / MMQ / MUL_MAT_ID paths and
their per-type limits (mmvq.cu ggml_cuda_should_use_mmvq and get_mmvq_mmid_max_batch_*, mmq.cu
ggml_cuda_should_use_mmq of llama.cpp 0c1e57098), and the launches the lowering issues on each path."""

from __future__ import annotations

import pytest

from graphdiag.backends.gpu.compat import (mmq_refusal, mmvq_mmid_max_batch, mmvq_ok, mul_mat_id_needs_sync,
                                           mul_mat_id_path, mul_mat_path)
from graphdiag.backends.gpu.lowering import lower_node, op_launches
from graphdiag.ir.arena import Arena
from graphdiag.ir.build import Ctx
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.ir.graph import Graph

NEW = (G.Q4_1, G.IQ4_NL, G.IQ4_XS)
PASCAL, P100, TURING, VOLTA, AMPERE, ORIN, ADA, HOPPER, BLACKWELL = 610, 600, 750, 700, 800, 870, 890, 900, 1200


def _mm(t, k, m, n):
    ctx = Ctx(Arena())
    out = ctx.mul_mat(ctx.new_tensor(t, (k, m), "w"), ctx.new_input(G.F32, (k, n), "x"), "out")
    g = Graph(ctx.arena)
    g.build_forward_expand(out)
    return g, out


def _mmid(t, tokens):
    ctx = Ctx(Arena())
    out = ctx.mul_mat_id(ctx.new_tensor(t, (256, 128, 4), "exps"), ctx.new_input(G.F32, (256, 1, tokens), "x"),
                         ctx.new_input(G.I32, (2, tokens), "ids"), "moe")
    g = Graph(ctx.arena)
    g.build_forward_expand(out)
    return g, out


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
def test_mmvq_takes_up_to_8_columns_on_every_nvidia_device(t):
    """None of the three is in the tuned lists of ggml_cuda_should_use_mmvq (Ada, Blackwell, DGX Spark, Orin,
    Volta tune only K-quants there): MMVQ_MAX_BATCH_SIZE everywhere, unlike Q4_K."""
    for cc in (PASCAL, VOLTA, TURING, AMPERE, ORIN, ADA, HOPPER, BLACKWELL):
        assert mmvq_ok(t, cc, 8) and not mmvq_ok(t, cc, 9), cc
    assert not mmvq_ok(G.Q4_K, ORIN, 2) and not mmvq_ok(G.Q4_K, BLACKWELL, 6)


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
def test_mmq_takes_them_as_upstream(t):
    """ggml_cuda_should_use_mmq lists all three: always on tensor-core MMQ (Turing+), dp4a below 64 columns
    on Volta, only MoE on Pascal P100 (no dp4a)."""
    assert not mmq_refusal(t, HOPPER, 512) and not mmq_refusal(t, TURING, 4096)
    assert not mmq_refusal(t, PASCAL, 9) and not mmq_refusal(t, VOLTA, 63) and mmq_refusal(t, VOLTA, 64)
    assert mmq_refusal(t, P100, 9) and not mmq_refusal(t, P100, 9, n_experts=4)


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
@pytest.mark.parametrize("n, path", [(1, "mmvq"), (8, "mmvq"), (9, "mmq"), (512, "mmq")])
def test_mul_mat_path_at_cc_9_0(t, n, path):
    _, out = _mm(t, 512, 64, n)
    assert mul_mat_path(out, HOPPER) == path


@pytest.mark.parametrize("t, pascal", [(G.Q4_1, 6), (G.IQ4_NL, 6), (G.IQ4_XS, 5)], ids=lambda v: str(v))
def test_mul_mat_id_mmvq_batch_limits_per_device(t, pascal):
    """get_mmvq_mmid_max_batch on NVIDIA: the Pascal-and-older table's entries, the Turing+ table's default
    (neither type is listed), 8 on Volta and Ada or newer."""
    assert mmvq_mmid_max_batch(t, PASCAL) == pascal
    assert mmvq_mmid_max_batch(t, TURING) == mmvq_mmid_max_batch(t, AMPERE) == 8
    assert mmvq_mmid_max_batch(t, VOLTA) == mmvq_mmid_max_batch(t, HOPPER) == 8
    _, out = _mmid(t, pascal)
    assert mul_mat_id_path(out, PASCAL) == "mmvq"
    _, out = _mmid(t, pascal + 1)
    assert mul_mat_id_path(out, PASCAL) == "mmq" and mul_mat_id_path(out, TURING) == "mmvq"
    assert not mul_mat_id_needs_sync(out, PASCAL)


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
def test_the_lowering_quantises_x_then_runs_the_types_kernels(t):
    """MMVQ: quantize_q8_1 then mul_mat_vec_{w}; above 8 columns the prefill's dequantize_f16_{w} then
    mul_mat_f16 (with the k-split's fixup where upstream's stream-k needs one); MoE at 3 tokens:
    quantize_q8_1 then mul_mat_id_vec_{w}; GET_ROWS: get_rows_{w}."""
    w = t.name.lower()
    g, _ = _mm(t, 512, 64, 1)
    assert [lw.kernel for lw in op_launches(lower_node(g, 0, None, HOPPER))] == ["quantize_q8_1", f"mul_mat_vec_{w}"]
    g, _ = _mm(t, 512, 64, 9)
    assert [lw.kernel for lw in op_launches(lower_node(g, 0, None, HOPPER, nsm=1))] == [f"dequantize_f16_{w}",
                                                                                       "mul_mat_f16"]
    assert [lw.kernel for lw in op_launches(lower_node(g, 0, None, HOPPER))][-1] == "mul_mat_fixup_f32"
    g, _ = _mmid(t, 3)
    assert [lw.kernel for lw in op_launches(lower_node(g, 0, None, HOPPER))] == ["quantize_q8_1",
                                                                               f"mul_mat_id_vec_{w}"]
    ctx = Ctx(Arena())
    out = ctx.get_rows(ctx.new_tensor(t, (512, 10), "tok_embd"), ctx.new_input(G.I32, (3,), "ids"), "inp_embd")
    g = Graph(ctx.arena)
    g.build_forward_expand(out)
    assert [lw.kernel for lw in op_launches(lower_node(g, 0, None, HOPPER))] == [f"get_rows_{w}"]

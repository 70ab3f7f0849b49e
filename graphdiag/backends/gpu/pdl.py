"""Which launches carry programmatic dependent launch (PDL), as upstream's would.

llama.cpp 0c1e57098 launches most of its kernels through `ggml_cuda_kernel_launch` (common.cuh), which on
9.0+ (GGML_CUDA_PDL unset or non-zero) adds the programmatic stream serialisation attribute; the rest it
launches with `<<<...>>>`, and cuBLAS launches its own. Captured into a CUDA graph, a PDL launch's edge from
the kernel before it is a programmatic edge, a plain launch's an ordinary one. cuGraphExecUpdate refuses a
graph whose edges changed type (TOPOLOGY_CHANGED): so a split whose mat-mul moves from the mat-vec kernel
(PDL) to MMF, MMQ or cuBLAS (plain) between two captures cannot be updated even where the kernel count stays.

Evidence (H100, 2026-12-06, `tools/captured_kernels.py`, fusion off): on `small` F16 exported as llama and
as qwen3, 1 -> 2 sequences keeps 165 / 197 kernels, llama.cpp's mat-vecs become `mul_mat_f` (mmf.cuh,
`<<<>>>`) and its update is refused (TOPOLOGY_CHANGED, an error node named); on Q8_0, where both batches run
`mul_mat_vec_q` (PDL), the update succeeds.

The upstream launch of each kernel family (grep of ggml-cuda at 0c1e57098):
  PDL:   mmvf, mmvq (+ their GLU / bias fusions and the MoE forms), quantize_q8_1, rms_norm (+ mul/add/rope
         fusions), rope_neox, set_rows (float), get_rows (float), cpy (float), binbcast (add, mul, div),
         scale, sum_rows, unary and gated unary (swiglu, geglu), topk_moe, flash attention (all kernels).
  plain: mmf (mul_mat_f, ids too, mul_mat_f_ids), mmq (mul_mat_q, stream-k fixup, quantize_mmq_q8_1),
         mm_ids_helper (mmid.cu), cuBLAS and its
         conversions (convert.cu), rope_norm (llama's mode 0, fused with set_rows too), soft_max, argsort,
         top_k, clamp, moe_weighted_reduction, swiglu_clamp (swiglu_oai), quantized get_rows / set_rows /
         cpy.
"""

from __future__ import annotations

from ...ir.dtypes import GGMLType, is_quantized
from ...ir.ops import Op
from ...ir.tensor import Tensor
from .compat import mul_mat_id_path, mul_mat_path

ROPE_NEOX = 2     # ggml's rope mode bit (op param 2)

# graphdiag kernels whose upstream counterpart is always launched plainly
_PLAIN_PREFIXES = ("soft_max", "argsort", "top_k_", "clamp", "moe_weighted_reduction", "dequantize_f16",
                   "mul_mat_fixup", "glu_swiglu_clamp", "mul_mat_id_gathered", "mm_ids_helper")


def _mat_mul_pdl(node: Tensor, cc: int) -> bool:
    """A MUL_MAT / MUL_MAT_ID and the quantisation before it: PDL on upstream's mat-vec paths only."""
    if node.op == Op.MUL_MAT:
        return mul_mat_path(node, cc) in ("mmvf", "mmvq")
    return mul_mat_id_path(node, cc) == "mmvq"   # MUL_MAT_ID: mmvq up to its per-type batch, else mmq / mmf


def upstream_pdl(kernel: str, node: Tensor, cc: int) -> bool:
    """Whether upstream launches the kernel graphdiag's `kernel` stands for, computing `node` (the first
    node of a fused group), through ggml_cuda_kernel_launch (so with PDL where it is on)."""
    if kernel.startswith(_PLAIN_PREFIXES):
        return False
    if kernel.startswith(("mul_mat_vec_glu", "mul_mat_vec_add", "mul_mat_id_vec_glu")):
        return True                            # fused only on the mat-vec paths (fusion.py)
    if kernel.startswith(("mul_mat", "quantize_q8_1")) and node.op in (Op.MUL_MAT, Op.MUL_MAT_ID):
        return _mat_mul_pdl(node, cc)
    if kernel.startswith("rope"):              # rope_f32, rope_set_rows_f16: rope_norm is plain, neox PDL
        return bool(node.param_i32(2) & ROPE_NEOX)
    if kernel.startswith(("get_rows_", "set_rows_", "cpy_")):
        t = node.src[0].type if kernel.startswith("get_rows_") else node.type
        return not is_quantized(t) or t == GGMLType.BF16
    return True

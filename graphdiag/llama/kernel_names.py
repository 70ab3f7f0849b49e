"""Kernel names of captured graphs on both sides, as one vocabulary: ggml's kernel identifiers.

llama.cpp's kernel nodes are named by their CUDA function (`cuFuncGetName`: mangled C++ such as
`_Z13mul_mat_vec_fI6__half...`, or already cut to the identifier); graphdiag's by its own kernels
(`mul_mat_vec_add_q8_0`). `upstream(name)` gives the ggml identifier a graphdiag kernel stands for (a fused
mat-vec+add is still ggml's `mul_mat_vec_q`, a fused rms_norm+mul its `rms_norm_f32`), `identifier(name)`
cuts ggml's function name to its identifier; a few families stay coarser where the kernels differ in kind
but not in place (`rope` for rope_norm/rope_neox, `quantize` for ggml's two Q8_1 quantisers,
`mul_mat_vec_q` for its MoE form mul_mat_vec_q_moe (more than one token), `fixup` for a
second launch that adds split parts: MMQ stream-k, flash attention stream-k, cuBLAS's split-K reduce,
graphdiag's mul_mat_fixup_f32; `cublas_gemm` for the GEMM cuBLAS ran and graphdiag's F32 stand-in, or its
F16 tile mat-mul after x's F16 copy; `convert_unary` for the conversions around an F16 GEMM on that path).
A float MUL_MAT_ID outside the fused gate/up is ggml's MMF with ids (`mul_mat_f`) on NVIDIA, whatever
graphdiag's kernel is called (mul_mat_id_vec_f16: upstream never runs a float MUL_MAT_ID as a mat-vec there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ggml identifier -> the coarser family both sides are compared in
_COARSE = {"rope_norm": "rope", "rope_neox": "rope", "quantize_q8_1": "quantize", "quantize_mmq_q8_1": "quantize",
           "mul_mat_vec_q_moe": "mul_mat_vec_q",
           "mul_mat_q_stream_k_fixup": "fixup", "flash_attn_stream_k_fixup_uniform": "fixup",
           "flash_attn_stream_k_fixup_general": "fixup", "convert_unary_cont_vec4": "convert_unary",
           "convert_unary_cont": "convert_unary"}
# graphdiag kernel name pattern -> ggml identifier (first match wins)
_GRAPHDIAG = (
    (r"^cpy_f16_f32$", "convert_unary"),                  # an F16 GEMM result back to F32 (cuBLAS path)
    (r"get_rows_(f32|f16|bf16)$", "k_get_rows_float"), (r"get_rows_", "k_get_rows"),
    (r"rms_norm_mul_rope", "rms_norm_mul_rope_f32"),      # the QK-norm fusion (its set_rows form too)
    (r"^scale_f32$", "scale_f32"), (r"^dequantize_f16_", "quantize"),
    (r"rope", "rope"), (r"set_rows_", "k_set_rows"), (r"^(add|sub|mul|div)_f32$", "k_bin_bcast"),
    (r"rms_norm", "rms_norm_f32"), (r"quantize_q8_1", "quantize"),
    (r"mul_mat_fixup", "fixup"), (r"flash_attn_combine", "flash_attn_combine_results"),
    (r"flash_attn_mma", "flash_attn_ext_f16"), (r"flash_attn_vec", "flash_attn_ext_vec"),
    (r"^glu_", "unary_gated_op_kernel"), (r"topk_moe", "topk_moe_cuda"),
    (r"moe_weighted_reduction", "moe_weighted_reduction_f32"),
    (r"^mm_ids_helper$", "mm_ids_helper"), (r"mul_mat_id_f_", "mul_mat_f_ids"),
    (r"mul_mat_id_vec_(f16|bf16|f32)$", "mul_mat_f"),
    (r"mul_mat_(id_)?vec_.*(f16|bf16|f32)$", "mul_mat_vec_f"), (r"mul_mat_(id_)?vec_", "mul_mat_vec_q"),
    (r"mul_mat_(id_)?f32$", "cublas_gemm"), (r"mul_mat_(id_)?(f16|bf16)$", "mul_mat_f"),
    (r"mul_mat_(id_)?q", "mul_mat_q"),
)
_MANGLED = re.compile(r"^_Z(\d+)")


def identifier(name: str) -> str:
    """A llama.cpp kernel function's family: its ggml identifier, coarsened where _COARSE says."""
    if "cutlass" in name or re.search(r"(sm\d+|ampere|hopper)_.*gemm", name):
        return "cublas_gemm"
    if "splitKreduce" in name:
        return "fixup"
    m = _MANGLED.match(name)
    if m:
        n = int(m.group(1))
        name = name[m.end():m.end() + n]
    return _COARSE.get(name, name)


def upstream(name: str) -> str:
    """The family of the ggml kernel a graphdiag kernel stands for ("?name" where no rule maps it)."""
    return next((fam for pat, fam in _GRAPHDIAG if re.search(pat, name)), f"?{name}")


def upstream_sequence(names: list[str]) -> list[str]:
    """upstream() of each graphdiag kernel in a capture, in order; a flash-attention combine after the
    tensor-core kernel is the stream-k fixup ggml launches there (after the vec kernel, its combine), a
    tile mat-mul after a dequantize_f16 is MMQ's stand-in (a quantised type graphdiag's prefill dequantises to
    F16 where ggml quantises x to Q8_1 for mul_mat_q: two launches each), and x's F16 copy followed by the
    tile mat-mul is upstream's cuBLAS path: convert_unary, then the GEMM (lowering._cublas_f16)."""
    out: list[str] = []
    for i, k in enumerate(names):
        fam = upstream(k)
        if k == "cpy_f32_f16" and i + 1 < len(names) and names[i + 1] == "mul_mat_f16":
            fam = "convert_unary"
        elif k == "mul_mat_f16" and i and names[i - 1] == "cpy_f32_f16":
            fam = "cublas_gemm"
        elif fam == "mul_mat_f" and out and out[-1] == "quantize" and names[i - 1].startswith("dequantize_"):
            fam = "mul_mat_q"       # graphdiag's stand-in for MMQ on a type without its own tile kernel
        out.append("fixup" if fam == "flash_attn_combine_results" and out and out[-1] == "flash_attn_ext_f16"
                   else fam)
    return out


@dataclass(frozen=True)
class KernelDifference:
    """A position (in llama.cpp's capture) where the two sides' kernels differ in family: graphdiag's kernel
    as it names it, the ggml family it stands for, llama.cpp's family ("" past either side's end)."""

    index: int
    kernel: str
    ours: str
    theirs: str


def without_cublas_conversions(theirs: list[str]) -> tuple[list[str], set[int]]:
    """llama.cpp's capture less the conversions ggml_cuda_mul_mat_cublas launches around a GEMM that
    graphdiag does not launch (ChunkCaptured.cublas_extra counts them): those to or from BF16 (x to BF16
    before a BF16 GEMM; graphdiag's mul_mat_bf16 reads F32 x), and the positions, in what remains, of the
    GEMMs such a conversion preceded: graphdiag's tile kernel (whose family is MMF's) stands for each of
    those. The F16 path's conversions stay: graphdiag launches them too (lowering._cublas_f16)."""
    out: list[str] = []
    gemms: set[int] = set()
    converted = False
    for k in theirs:
        if "convert_unary" in k and "bfloat16" in k:
            # from F32 (template <float, ...>: "If" in the mangled name) is x going into a GEMM; from BF16
            # a result coming out of one
            converted = not _FROM_BF16.search(k)
            continue
        if converted and identifier(k) == "cublas_gemm":
            gemms.add(len(out))
        converted = False
        out.append(k)
    return out, gemms


_FROM_BF16 = re.compile(r"convert_unary\w*?I14__nv_bfloat16")


def differences(ours: list[str], theirs: list[str], embedding_on_cpu: int = 1,
                f16_gemms: frozenset[int] | set[int] = frozenset()) -> list[KernelDifference]:
    """Every kernel whose family differs, position by position, after graphdiag's first `embedding_on_cpu`
    kernels (the embedding's GET_ROWS llama.cpp runs on the CPU): where those are not GET_ROWS the first
    difference is at index -1, naming graphdiag's kernel there. `f16_gemms`: positions of llama.cpp's
    capture holding cuBLAS GEMMs whose conversions graphdiag does not launch (without_cublas_conversions), where
    graphdiag's tile kernel is their stand-in."""
    head = ours[:embedding_on_cpu]
    out = [KernelDifference(-1, k, upstream(k), "(the embedding's GET_ROWS)") for k in head
           if not upstream(k).startswith("k_get_rows")]
    rest = ours[embedding_on_cpu:]
    a, b = upstream_sequence(rest), [identifier(k) for k in theirs]
    for i in range(max(len(a), len(b))):
        x, y = (a[i] if i < len(a) else ""), (b[i] if i < len(b) else "")
        if x != y and not (i in f16_gemms and (x, y) == ("mul_mat_f", "cublas_gemm")):
            out.append(KernelDifference(i, rest[i] if i < len(rest) else "", x, y))
    return out


def first_difference(ours: list[str], theirs: list[str], embedding_on_cpu: int = 1) -> tuple[int, str, str] | None:
    """(index in llama.cpp's capture, graphdiag's family, llama.cpp's) of the first of `differences`; None
    when the two sequences are the same."""
    d = differences(ours, theirs, embedding_on_cpu)
    return (d[0].index, d[0].ours, d[0].theirs) if d else None

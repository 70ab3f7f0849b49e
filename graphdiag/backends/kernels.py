"""The kernel catalogue: every kernel the GPU backend launches, with its ABI slots and exact semantics.

This is the contract between three implementations of each kernel:
  * kernels/*.cu                     (real CUDA, compiled with NVRTC; signature `NAME(const kparams p)`)
  * graphdiag.backends.sim_kernels   (numpy, run by the simulated driver on simulated device memory)
  * graphdiag.backends.cpu_ops       (numpy op implementations; the CPU backend and the oracle use them)

Conventions (ggml's): a tensor (ne0, ne1, ne2, ne3) with byte strides nb; ne0 is the innermost (row) dim.
t[0] is always the destination. All activations are F32; weights are F16, Q8_0 (blocks of 32: f16 scale +
32 int8) or F32; the KV cache is F16; ids and positions are I32. The Q8_0 mat-vec / mat-mul kernels read x
quantised by quantize_q8_1 into pool scratch (Q8_1 = type 9: blocks of 32, f16 d, f16 d*sum, 32 int8), as
ggml's mmvq / mmq; a node's launch count never depends on n_kv or on which path its batch takes. Every kernel honours the descriptors' nb
(views are strided). Broadcasting follows ggml: a source dim of 1 (or dividing the destination dim) repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

W_TYPES = ("f32", "f16", "q8_0")
# The file's weight types beyond W_TYPES (kernels/mmvq.cu, quants.cuh): MMVQ on Q8_1 x for the quantized
# ones, MMVF on F32 x for BF16 (X_TYPES = Q_TYPES + bf16).
Q_TYPES = ("q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q2_k", "q3_k", "q4_1", "iq4_nl", "iq4_xs", "mxfp4")
X_TYPES = Q_TYPES + ("bf16",)
FA_HEAD_DIMS = (32, 64, 128, 256)   # 256: Gemma 3
FAV_GROUPS = (1, 2, 4, 8)   # query heads per kv head of the decode attention kernels (G rounded up to these)


def fav_groups(g: int) -> int:
    """G query heads per kv head rounded up to the decode kernel's group count (1, 2, 4 or 8)."""
    return next((gm for gm in FAV_GROUPS if g <= gm), FAV_GROUPS[-1])


def fa_vec_kernel(head_dim: int, g: int) -> str:
    """The decode attention entry point for head size `head_dim` and `g` query heads per kv head: one
    kernel per (D, G rounded up), as ggml instantiates fattn-vec per head size and column count. One entry
    dispatching to all twelve bodies was 600 KB of SASS and 248 registers; each of these is about 50 KB."""
    return f"flash_attn_vec_f16_d{head_dim}_g{fav_groups(g)}"


FAV_KERNELS = tuple(fa_vec_kernel(d, g) for d in FA_HEAD_DIMS for g in FAV_GROUPS)


def fa_direct_kernel(head_dim: int) -> str:
    """The decode attention entry point where upstream's vec kernel runs alone (geometry.fa_direct): one
    block per query head writing the node, with its own launch bounds (512 threads)."""
    return f"flash_attn_vec_direct_f16_d{head_dim}"


FA_DIRECT_KERNELS = tuple(fa_direct_kernel(d) for d in FA_HEAD_DIMS)


def fa_mma_kernel(head_dim: int) -> str:
    """The batch (prefill) attention entry point for head size `head_dim`: tensor cores, one per head size."""
    return f"flash_attn_mma_f16_d{head_dim}"


FAM_KERNELS = tuple(fa_mma_kernel(d) for d in FA_HEAD_DIMS)


# MUL_MAT_ID + ADD_ID fused (gpt-oss's expert biases, ggml-cuda's fusion_data.x_bias / gate_bias): the bias of
# expert ids[t, s] added to each product (before the GLU); the GLU kernels' gate bias by address (kparams has
# six descriptors, all taken), with the up bias's layout
_BIAS = "bias F32 (M, E), optional: dst[t, s] += bias[ids[t, s]] (ADD_ID fused)"
_UP_BIAS = "up bias F32 (M, E), optional: the up product += up_bias[ids[t, s]] before the GLU (ADD_IDs fused)"
_GATE_BIAS_IP = ("gate bias address, low 32 bits (with t[5]: the gate product += its row ids[t, s])",
                 "gate bias address, high 32 bits")


@dataclass(frozen=True)
class KernelSpec:
    name: str
    slots: tuple[str, ...]   # meaning of t[0..]
    ip: tuple[str, ...] = ()  # meaning of ip[0..]
    fp: tuple[str, ...] = ()  # meaning of fp[0..]
    doc: str = ""


def _fa_slots(d: int) -> tuple[str, ...]:
    """The ABI slots of a split-KV attention partial kernel of head size d (decode and batch alike)."""
    return ("partials F32 (Dv + 2, n_split, H, T * B), pool scratch", f"q F32 ({d}, H, T, B)",
            f"k F16 view ({d}, Hkv, n_kv)", f"v F16 view ({d}, Hkv, n_kv)", "mask F32 or F16 (n_kv, T_pad, M2, M3), optional")


def _specs() -> dict[str, KernelSpec]:
    s: list[KernelSpec] = []
    for w in W_TYPES:
        s.append(KernelSpec(f"get_rows_{w}", ("dst F32 (ne0, n_ids, ...)", f"table {w} (ne0, n_rows)", "ids I32"),
                            doc="dst[i2, i1, :] = dequant(table[ids[i2, i1], :])"))
        x = "xq Q8_1 (K, N) from quantize_q8_1" if w == "q8_0" else "x F32 (K, N, B2, B3)"
        dot = ("sum_b d_w[m, b] * d_x[n, b] * (integer dot of block b's quants)" if w == "q8_0"
               else "sum_k W[m, k] * x[.., n, k]")
        s.append(KernelSpec(f"mul_mat_vec_{w}", ("dst (M, N, B2, B3)", f"W {w} (K, M)", x),
                            doc=f"dst[.., n, m] = {dot}; N <= 8 (the mat-vec path)"))
        split = w in ("f16", "q8_0", "f32")   # the k-split (mul_mat.cu), followed by mul_mat_fixup_f32
        s.append(KernelSpec(f"mul_mat_{w}", ("dst (M, N, B2, B3)", f"W {w} (K, M)", x)
                            + (("partials F32 (M, N, B2, B3 * (S - 1)), pool scratch; only when S > 1",) if split else ()),
                            ip=("S: k parts (0 or 1: none); part p sums k in [64 * (p * U // S), 64 * ((p + 1) * U "
                                "// S)) clipped to K, U = ceil(K / 64), part 0 into dst, part p > 0 into partials "
                                "at batch i3 + (p - 1) * B3",) if split else (),
                            doc={"f32": "same as mul_mat_vec, any N (tiled, CUDA cores)",
                                 "f16": "any N on tensor cores: x rounded to F16 (or read as F16: the copy "
                                        "cpy_f32_f16 made on upstream's cuBLAS path), then sum_k W[m, k] * "
                                        "x16[n, k] accumulated in F32; dst F32, or F16 (the cuBLAS path's result "
                                        "cpy_f16_f32 converts)",
                                 "q8_0": "same as mul_mat_vec_q8_0, any N (int8 tensor cores)"}[w]))
        s.append(KernelSpec(f"mul_mat_vec_glu_{w}",
                            ("dst (M, N)", f"W_gate {w} (K, M)", f"W_up {w} (K, M)", x),
                            ip=("glu op (1 = GEGLU, 2 = SWIGLU, 6 = SWIGLU_CLAMP)",), fp=("SWIGLU_CLAMP's limit",),
                            doc="fused gate/up mat-vec + GLU: dst = glu(W_gate x, W_up x) (glu_swiglu_f32's, "
                                "glu_geglu_f32's or glu_swiglu_clamp_f32's formula); N <= 8"))
        s.append(KernelSpec(f"mul_mat_vec_add_{w}",
                            ("dst (M, N)", f"W {w} (K, M)", x, "r F32 (M, N), same shape as dst"),
                            doc="fused mat-vec + ADD (the residual): dst = W x + r; N <= 8 (1 in the graphs)"))
        xid = ("xq Q8_1 (K, n_b, T) from quantize_q8_1" if w == "q8_0" else "x F32 (K, n_b, T)") + ", n_b in {1, n_used}"
        s.append(KernelSpec(f"mul_mat_id_vec_{w}",
                            ("dst (M, n_used, T)", f"experts {w} (K, M, E)", xid, "ids I32 (n_used, T)", _BIAS),
                            doc=f"dst[t, s, :] = experts[ids[t, s]] . x[t, s if n_b > 1 else 0] ({dot}); fast path, "
                                "no sync: upstream's mmvq (q8_0, T <= 8) or MMF reading the ids (float, T <= 16)"))
        s.append(KernelSpec(f"mul_mat_id_vec_glu_{w}",
                            ("dst (M, n_used, T)", f"gate experts {w} (K, M, E)", f"up experts {w} (K, M, E)",
                             xid, "ids I32 (n_used, T)", _UP_BIAS),
                            ip=("glu op (1 = GEGLU, 2 = SWIGLU, 3 = SWIGLU_OAI, 6 = SWIGLU_CLAMP)", *_GATE_BIAS_IP),
                            fp=("SWIGLU_CLAMP's limit",),
                            doc="fused expert gate/up mat-vec + GLU: dst[t, s] = glu(G[ids[t, s]] x, U[ids[t, s]] "
                                "x), e.g. silu(G x) * (U x); float experts at one token (mul_mat_id_glu.cu), "
                                "q8_0 up to 8 tokens (mul_mat_vec.cu)"))
        s.append(KernelSpec(f"mul_mat_id_gathered_{w}",
                            ("dst (M, n_used, T)", f"experts {w} (K, M, E)", "x F32 (K, n_b, T)",
                             "row map I32 pairs (slot, token), device memory written by the host"),
                            ip=("expert id", "number of rows", "first pair in the row map"),
                            doc="sorted fallback, one launch per expert with rows: for each (s, t) in the map "
                                "range, dst[t, s, :] = experts[expert] . x[t, s or 0]"))
    s += _x_specs()
    s += [
        KernelSpec("rms_norm_f32", ("dst", "x"), fp=("eps",), doc="per row: x / sqrt(mean(x^2) + eps)"),
        KernelSpec("rms_norm_mul_f32", ("dst", "x", "w (broadcast)"), fp=("eps",),
                   doc="fused RMS_NORM + MUL: rms_norm(x) * w"),
        KernelSpec("rms_norm_scale_f32", ("dst (the SCALE)", "x"), fp=("eps", "scale"),
                   doc="fused RMS_NORM + SCALE without bias (0c1e57098): (x / sqrt(mean(x^2) + eps)) * scale, "
                       "rms_norm_f32's value then one rounded multiply (rms_norm_f32 then scale_f32's bytes)"),
        KernelSpec("mul_f32", ("dst", "a", "b (broadcast)"), doc="a * b"),
        KernelSpec("add_f32", ("dst", "a", "b (broadcast)"), doc="a + b"),
        KernelSpec("rope_f32", ("dst (D, H, T)", "x (D, H, T)", "pos I32 (T)"),
                   ip=("n_dims", "mode (0 = normal: adjacent pairs)"),
                   fp=("freq_base", "freq_scale", "YaRN ext_factor", "YaRN attn_factor (0: no YaRN)",
                       "YaRN corr_dim0", "YaRN corr_dim1"),
                   doc="for i < n_dims/2: th = pos[t]*freq_scale*freq_base^(-2i/n_dims); "
                       "(x0, x1) = x[2i], x[2i+1]; y = (x0 cos th - x1 sin th, x0 sin th + x1 cos th); "
                       "dims >= n_dims are copied. YaRN (fp[3] != 0, gpt-oss): th_e = pos freq_base^(-2i/n_dims), "
                       "r = (1 - clamp((i - c0) / max(0.001, c1 - c0), 0, 1)) ext, th = freq_scale th_e (1 - r) + "
                       "th_e r, cos and sin times attn (1 + 0.1 ln(1 / freq_scale)) where ext != 0 (ggml's rope_yarn)"),
        KernelSpec("set_rows_f16", ("dst F16 (W, n_rows)", "src F32 (W, T, ...)", "idx I32 (T)"),
                   doc="dst[idx[t], :] = f16(src[t, :]) (src rows flattened over ne1..ne3)"),
        KernelSpec("set_rows_f32", ("dst F32 (W, n_rows)", "src F32 (W, T)", "idx I32 (T)"),
                   doc="dst[idx[t], :] = src[t, :]"),
        KernelSpec("rope_set_rows_f16", ("dst cache F16 (D*Hkv, n_rows)", "x (D, Hkv, T)", "pos I32 (T)", "idx I32 (T)"),
                   ip=("n_dims", "mode"), fp=("freq_base", "freq_scale", "YaRN as rope_f32's fp[2..5]"),
                   doc="fused ROPE + VIEW + SET_ROWS: dst[idx[t], :] = f16(rope(x)[t] flattened); "
                       "the ROPE node's own output is not written"),
        *(KernelSpec(fa_vec_kernel(d, gm), _fa_slots(d),
                     ip=("chunk: positions per split (multiple of 32)", "1 (one token per block)"), fp=("scale",),
                     doc="split s covers positions [s * chunk, (s + 1) * chunk) of n_kv; per head h (kv head "
                         "h // (H // Hkv)), token t, split s: x_j = scale * q . k_j + mask[t, j], m = max_j x_j, "
                         "p_j = exp(x_j - m), partial = (sum_j p_j v_j, m, sum_j p_j); an empty or fully "
                         "masked split gives (0, -inf, 0). One token per block: the decode kernel (T <= 8) of "
                         f"head size {d}, H / Hkv rounded up to 1/2/4/8 = {gm}")
          for d in FA_HEAD_DIMS for gm in FAV_GROUPS),
        *(KernelSpec(fa_direct_kernel(d), _fa_slots(d),
                     ip=("chunk: the positions, at most the head size", "1 (one token per block)", "1 (no split)",
                         "1 (one query head per block)"), fp=("scale",),
                     doc="one query head per block, all its n_kv <= D positions: x_j = scale * q . k_j + "
                         "mask[t, j], M = max_j x_j, p_j = exp(x_j - M), dst = sum_j p_j v_j / sum_j p_j (zeros "
                         "for a fully masked row), written into the node: no combine, as upstream's vec kernel "
                         f"at one KV tile; head size {d}")
          for d in FA_HEAD_DIMS),
        *(KernelSpec(fa_mma_kernel(d), _fa_slots(d),
                     ip=("chunk: positions per split (multiple of 32)", "query rows per block (64)"), fp=("scale",),
                     doc="the decode kernels' partials on tensor cores (batches, T > 8): q and p enter the "
                         "products rounded to F16 (F32 accumulation); per split, tiles of 64 positions from the "
                         "split's start, online: m = running max of x_j, p_j = f16(exp(x_j - m)) against the "
                         "running max of its tile, O and l rescaled by exp(m_old - m_new); l sums the unrounded p")
          for d in FA_HEAD_DIMS),
        KernelSpec("flash_attn_combine_f32", ("dst (Dv, H, T, B)", "partials of a flash_attn_vec/mma kernel",
                                              "sinks F32 (H), optional (gpt-oss's attn_sinks: FLASH_ATTN_EXT's src[4])"),
                   doc="M = max_s m_s, w_s = exp(m_s - M), O = sum_s w_s O_s, L = sum_s w_s l_s (splits in order); "
                       "with sinks, then M' = max(M, S_h), r = exp(M - M'): O *= r, L = L r + exp(S_h - M') (the "
                       "sink joins the denominator only, as upstream's vec and mma kernels fold it into split 0); "
                       "dst = O / L, zeros where L is 0 (all splits -inf and no sink: a fully masked row)"),
        KernelSpec("moe_weighted_reduction_f32",
                   ("dst F32 (n_embd, T), contiguous", "experts F32 (n_embd, k, T), contiguous",
                    "router weights F32 (1, k, T), contiguous", "per-expert scale F32 (1, k, T), optional"),
                   doc="dst[t, :] = sum_x (experts[t, x, :] * scale[t, x]) * weights[t, x], x in order (scale 1 "
                       "without t[3]): MUL [+ MUL] + k VIEWs + (k - 1) ADDs fused (kernels/moe.cu, #25952)"),
        KernelSpec("topk_moe_f32",
                   ("weights F32 (k, T) or (1, k, T), contiguous", "ids I32 (k, T): the view of the argsort's rows",
                    "router logits F32 (n_expert, T), contiguous (n_expert <= 576)"),
                   ip=("k: experts used", "1: the weight norm fused, 0: not",
                       "1: the softmax delayed (gpt-oss: top k of the logits, then the k kept softmaxed)"),
                   fp=("scale of the weights (1: no SCALE)", "the norm's CLAMP minimum"),
                   doc="per token p = softmax(logits); k rounds of argmax over p (ties: the lower expert) write "
                       "ids[r] and weights[r] = p[id] * scale, with the norm (p[id] * (1 / max(s, clamp))) * "
                       "scale, s the k kept p summed per lane (expert % 32, in round order) then by the warp's "
                       "butterfly: SOFT_MAX + RESHAPE + ARGSORT + VIEW + GET_ROWS [+ RESHAPE + SUM_ROWS + CLAMP + "
                       "DIV + RESHAPE] [+ SCALE] fused (kernels/moe.cu, ggml-cuda's topk_moe_cuda). With ip[2] (the "
                       "delayed softmax: ARGSORT + VIEW + GET_ROWS + RESHAPE + SOFT_MAX + RESHAPE, gpt-oss): the "
                       "rounds run over the logits (NaN: -FLT_MAX) and weights[r] = softmax of the k kept logits "
                       "(e = exp(v - max), summed per lane (r % 32) then by the butterfly, e * (1 / sum)) * scale"),
        KernelSpec("mul_mat_fixup_f32", ("dst F32 (M, N, B2, B3)", "partials F32 (M, N, B2, B3 * P), pool scratch"),
                   ip=("P: partial outputs (k parts - 1)",),
                   doc="dst[.., i3, n, m] += sum_q partials[.., i3 + q * B3, n, m], q in order: the k-split's "
                       "reduction, where upstream launches mul_mat_q_stream_k_fixup (gpu/compat.py "
                       "mmq_stream_k_parts)"),
        KernelSpec("quantize_q8_1", ("dst Q8_1 (K, N, B2, B3), contiguous pool scratch", "x F32 (K, N, B2, B3)"),
                   doc="per 32-block of x: d = max|x| / 127, q = rint(x / d) (0 if d == 0), stored as "
                       "{f16 d, f16 d * sum(q), int8 q[32]} (36 bytes)"),
        KernelSpec("soft_max_f32", ("dst", "x"), fp=("scale",), doc="per row: softmax(scale * x)"),
        KernelSpec("top_k_f32", ("dst I32 (k, rows)", "x F32 (n, rows)"), ip=("k",),
                   doc="indices of the k largest per row, descending; ties: lower index first"),
        KernelSpec("argsort_f32_i32_desc", ("dst I32 (n, rows)", "x F32 (n, rows)"),
                   doc="each row's indices by descending value; ties: lower index first (top_k_f32 with k = n)"),
        KernelSpec("glu_swiglu_f32", ("dst", "gate", "up"), doc="silu(gate) * up"),
        KernelSpec("glu_swiglu_clamp_f32", ("dst", "gate", "up"), fp=("limit",),
                   doc="silu(min(gate, limit)) * min(max(up, -limit), limit) (GGML_GLU_OP_SWIGLU_CLAMP, "
                       "0c1e57098)"),
        KernelSpec("cpy_f32_f32", ("dst", "src"), doc="element-wise copy between strided layouts, same ne"),
        KernelSpec("cpy_f32_f16", ("dst F16", "src F32"), doc="copy with conversion"),
        KernelSpec("cpy_f16_f32", ("dst F32", "src F16"),
                   doc="copy with conversion: an F16 GEMM result to the node (upstream's cuBLAS path)"),
        *(KernelSpec(f"rng_fill_{w}", (f"dst {w}, contiguous (a weight)",),
                     ip=("seed low 32 bits", "seed high 32 bits", "tensor index"), fp=("mul", "add"),
                     doc="dst[i] = store(f32(c(seed, index, i)) * mul + add), the counter-based generator of "
                         "graphdiag.backends.rng (Q8_0: quantised per 32-block as memory.quantize_q8_0)")
          for w in W_TYPES),
    ]
    s += _gemma_qwen_specs()
    s += _oai_specs()
    s += _moe_norm_specs()
    s += _mmid_specs()
    return {k.name: k for k in s}


MMID_Q_TYPES = ("q8_0",) + Q_TYPES          # mul_mat_id_q_*: upstream's MMQ path of the experts
MMID_F_TYPES = ("f32", "f16", "bf16")       # mul_mat_id_f_*: upstream's MMF path above 16 tokens
_MAP = "map I32 (2, P): mm_ids_helper's (slot, token) pairs, expert by expert"
_BOUNDS = "bounds I32 (E + 1): expert e's pairs are [bounds[e], bounds[e + 1]) of the map"


def _mmid_specs() -> list[KernelSpec]:
    """MUL_MAT_ID over an expert-sorted map of its pairs (gpu/lowering_mmid.py): the map's builder and the
    mat-muls that read it, where upstream runs mm_ids_helper before mul_mat_q (MMQ) or mul_mat_f_ids (MMF)."""
    s = [KernelSpec("mm_ids_helper", (_MAP + ", P = n_used * T", "ids I32 (n_used, T)", _BOUNDS),
                    doc="block e (one warp) writes, token by token (slots in order within a token), the pairs "
                        "(s, t) with ids[t, s] = e from bounds[e] = the count of pairs of lower experts; the last "
                        "block writes bounds[E] (ggml-cuda mmid.cu's mm_ids_helper, as a map of pairs)")]
    split = ("S: k parts (0 or 1: none); part p sums k in [64 * (p * U // S), 64 * ((p + 1) * U // S)) clipped "
             "to K, U = ceil(K / 64), part 0 into dst, part p > 0 into partials at i3 = p - 1",)
    for w in MMID_Q_TYPES:
        s.append(KernelSpec(f"mul_mat_id_q_{w}",
                            ("dst (M, n_used, T)", f"experts {w} (K, M, E)", "xq Q8_1 (K, n_b, T) from quantize_q8_1",
                             "partials F32 (M, n_used, T, S - 1), pool scratch; only when S > 1", _MAP, _BOUNDS),
                            ip=split,
                            doc="for each expert e and pair (s, t) of its range: dst[t, s, :] = experts[e] . "
                                "xq[t, s if n_b > 1 else 0], the mat-vec's integer dots on Q8_1 x; upstream's "
                                "mul_mat_q with ids (mul_mat_q_stream_k_fixup where S > 1: mul_mat_fixup_f32)"))
    for w in MMID_F_TYPES:
        s.append(KernelSpec(f"mul_mat_id_f_{w}",
                            ("dst (M, n_used, T)", f"experts {w} (K, M, E)", "x F32 (K, n_b, T)", "unused", _MAP,
                             _BOUNDS),
                            ip=("0 (one part)",),
                            doc="for each expert e and pair (s, t) of its range: dst[t, s, :] = experts[e] . "
                                "x[t, s if n_b > 1 else 0] in float32; upstream's mul_mat_f_ids (MMF, T > 16)"))
    return s


QUANT_DOC = ("per unit b (32 weights of the row, one Q8_1 block of x) with integer dot_b = sum_i q_w[i] * "
             "q_x[i] (quants before ggml's offsets; d8, s8 the x block's d, d*sum; sx its quants' sum): Q4_0 "
             "d(dot d8 - 8 s8); Q5_0 d(dot d8 - 16 s8); Q5_1 d d8 dot + m s8; Q4_K/Q5_K d8(d sc dot - dmin mn "
             "sx); Q6_K d d8 (sc0 (dot_lo - 32 sx_lo) + sc1 (dot_hi - 32 sx_hi)); Q3_K as Q6_K with 4 for 32; Q2_K "
             "d8(d (sc0&15 dot_lo + sc1&15 dot_hi) - dmin (sc0>>4 sx_lo + sc1>>4 sx_hi)); Q4_1 d d8 dot + m s8; "
             "IQ4_NL d d8 dot and IQ4_XS d d8 (dot (ls - 32)) over the levels kvalues_iq4nl[q]; MXFP4 d d8 dot over "
             "kvalues_mxfp4[q], d = 2^(e - 128); summed over units "
             "(kernels/quants.cuh, graphdiag.backends.qunits)")


def _x_specs() -> list[KernelSpec]:
    """The X_TYPES kernels (kernels/mmvq.cu); BF16's prefill mat-mul is mul_mat_bf16 (mul_mat.cu), the
    quantized types' prefill is dequantize_f16_{w} into pool scratch then mul_mat_f16."""
    s = [KernelSpec("mul_mat_bf16", ("dst (M, N, B2, B3)", "W bf16 (K, M)", "x F32 (K, N, B2, B3)"),
                    doc="sum_k W[m, k] * x[.., n, k], any N (CUDA-core tiles, as mul_mat_f32)")]
    for w in X_TYPES:
        q = w != "bf16"
        x = "xq Q8_1 (K, N) from quantize_q8_1" if q else "x F32 (K, N, B2, B3)"
        dot = QUANT_DOC if q else "sum_k W[m, k] * x[.., n, k]"
        deq = "dequant(W) as quants.cuh unit_f32 (bit for bit in qunits.dequantize)"
        s += [
            KernelSpec(f"get_rows_{w}", ("dst F32 (ne0, n_ids, ...)", f"table {w} (ne0, n_rows)", "ids I32"),
                       doc=f"dst[i2, i1, :] = {deq} of table[ids[i2, i1], :]"),
            KernelSpec(f"dequantize_f16_{w}", ("dst F16 (K, M, W2, W3), contiguous pool scratch", f"W {w} (K, M, W2, W3)"),
                       doc=f"dst = f16({deq}): the prefill's weights for mul_mat_f16"),
            KernelSpec(f"mul_mat_vec_{w}", ("dst (M, N, B2, B3)", f"W {w} (K, M)", x), ip=("unused", "warps per row"),
                       doc=f"dst[.., n, m] = {dot}; N <= 8 (the mat-vec path)"),
            KernelSpec(f"mul_mat_vec_glu_{w}", ("dst (M, N)", f"W_gate {w} (K, M)", f"W_up {w} (K, M)", x),
                       ip=("glu op (0 REGLU, 1 GEGLU, 2 SWIGLU, 6 SWIGLU_CLAMP)",), fp=("SWIGLU_CLAMP's limit",),
                       doc="glu(W_gate x, W_up x); N <= 8"),
            KernelSpec(f"mul_mat_vec_add_{w}", ("dst (M, N)", f"W {w} (K, M)", x, "r F32 (M, N)"),
                       ip=("unused", "warps per row"), doc="W x + r; N <= 8"),
            KernelSpec(f"mul_mat_id_vec_{w}", ("dst (M, n_used, T)", f"experts {w} (K, M, E)",
                                               x.replace("(K, N)", "(K, n_b, T)"), "ids I32 (n_used, T)", _BIAS),
                       doc=(f"dst[t, s, :] = experts[ids[t, s]] . x[t, s or 0]: {dot}" if q else
                            f"dst[t, s, :] = ({deq} of experts[ids[t, s]]) . x[t, s or 0] (F32 x)")),
            KernelSpec(f"mul_mat_id_vec_glu_{w}", ("dst (M, n_used, T)", f"gate experts {w} (K, M, E)",
                                                   f"up experts {w} (K, M, E)", x.replace("(K, N)", "(K, n_b, T)"),
                                                   "ids I32 (n_used, T)", _UP_BIAS),
                       ip=("glu op", *_GATE_BIAS_IP), fp=("SWIGLU_CLAMP's limit",),
                       doc="glu(G[ids[t, s]] x, U[ids[t, s]] x)" + (", T <= 8 (Q8_1 x)" if q else " of one token (F32 x)")),
            KernelSpec(f"mul_mat_id_gathered_{w}", ("dst (M, n_used, T)", f"experts {w} (K, M, E)", "x F32 (K, n_b, T)",
                                                    "row map I32 pairs (slot, token)"),
                       ip=("expert id", "number of rows", "first pair in the row map"),
                       doc="the sorted fallback's per-expert launch (F32 x)"),
        ]
    return s
def _oai_specs() -> list[KernelSpec]:
    """gpt-oss's element-wise ops (kernels/elementwise.cu): its experts' biases and clamped SwiGLU."""
    return [
        KernelSpec("add_id_f32", ("dst F32 (n, n_used, T)", "a F32 (n, n_used, T)", "b F32 (n, n_expert)",
                                  "ids I32 (n_used, T)"),
                   doc="dst[t, i, :] = a[t, i, :] + b[ids[t, i], :] (GGML_OP_ADD_ID, ggml-cuda's add_id_kernel)"),
        KernelSpec("glu_swiglu_oai_f32", ("dst", "gate", "up"), fp=("limit", "alpha"),
                   doc="x = min(gate, limit), y = max(min(up, limit), -limit): dst = x / (1 + exp(-x * alpha)) * "
                       "(1 + y) (GGML_GLU_OP_SWIGLU_OAI, ggml-cuda's ggml_cuda_op_swiglu_oai_single)"),
    ]


def _moe_norm_specs() -> list[KernelSpec]:
    """llama's MoE weight norm unfused (SUM_ROWS, CLAMP, DIV), where the top-k router's fusion is off or refused."""
    return [
        KernelSpec("sum_rows_f32", ("dst (1, rows...)", "x"), doc="per row: dst = sum_i x[i]"),
        KernelSpec("clamp_f32", ("dst", "x"), fp=("min", "max"),
                   doc="fminf(fmaxf(x, min), max), ggml-cuda's op_clamp: a NaN becomes min"),
        KernelSpec("div_f32", ("dst", "a", "b (broadcast)"), doc="a / b (IEEE, rounded to nearest)"),
    ]


def _gemma_qwen_specs() -> list[KernelSpec]:
    """The ops and fusions of the Gemma 3 and Qwen graphs (scale, GEGLU, the norm fusions with rope and add)."""
    rope_ip, rope_fp = ("n_dims", "mode (0 normal, 2 NEOX)"), ("eps", "freq_base", "freq_scale")
    return [
        KernelSpec("scale_f32", ("dst", "x"), fp=("scale", "bias"),
                   doc="dst = x * scale + bias, a multiply then an add (no FMA: numpy's two roundings)"),
        KernelSpec("glu_geglu_f32", ("dst", "gate", "up"),
                   doc="gelu(gate) * up, gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) "
                       "(ggml-cuda's op_gelu, the tanh approximation)"),
        KernelSpec("rms_norm_mul_add_f32", ("dst (the ADD)", "x", "w (broadcast)", "r (broadcast)"), fp=("eps",),
                   doc="fused RMS_NORM + MUL + ADD: rms_norm(x) * w + r (r: the ADD's other operand)"),
        KernelSpec("rms_norm_mul_rope_f32", ("dst (D, H, T), the ROPE", "x (D, H, T)", "w (broadcast)", "pos I32 (T)"),
                   ip=rope_ip, fp=rope_fp,
                   doc="fused RMS_NORM + MUL + ROPE (QK-norm): rope(rms_norm(x) * w) per row of D, the "
                       "norm over each head's row; rope as rope_f32"),
        KernelSpec("rms_norm_mul_rope_set_rows_f16",
                   ("dst cache F16 (D*Hkv, n_rows)", "x (D, Hkv, T)", "w (broadcast)", "pos I32 (T)", "idx I32 (T)"),
                   ip=rope_ip, fp=rope_fp,
                   doc="fused RMS_NORM + MUL + ROPE + VIEW + SET_ROWS: dst[idx[t], :] = f16(rope(rms_norm(x) "
                       "* w)[t] flattened); the ROPE node's own output is not written"),
    ]


KERNELS: dict[str, KernelSpec] = _specs()

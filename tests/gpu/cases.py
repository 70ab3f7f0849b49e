"""The cases every catalogue kernel is tested on: shapes of the decode workload (scaled down), broadcasts,
views and strided layouts, fast paths and the generic strided paths of the mat-vec kernels."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from graphdiag.backends.abi import Q8_1
from graphdiag.backends.geometry import FAM_ROWS, fa_mma_blocks, fa_split, fa_vec
from graphdiag.backends.kernels import KERNELS, W_TYPES, fa_mma_kernel, fa_vec_kernel
from graphdiag.ir.dtypes import GGMLType as G
from quant_cases import quant_cases
from cases_ops import op_cases
from kernel_cases import F16_OUT, F32_DOT, F32_ELEM, FA_MMA, ROPE, ROPE_SINCOS, TC_DOT, Case, expert_map

WT = {"f32": G.F32, "f16": G.F16, "q8_0": G.Q8_0}


def _weights(c: Case, w: str, k: int, m: int, e: int = 1, layout: str = "contig"):
    """W (K, M[, E]). layout: contig | offset (rows start 2 bytes off 16-byte alignment: generic path)
    | transposed (F32/F16: element stride = a row of the stored (M, K) matrix)."""
    t = WT[w]
    if layout == "contig":
        return c.randn(t, k, m, e)
    if layout == "transposed":
        base = c.randn(t, m, k)                       # stored (M, K): ne0 = M
        es = base.nb[0]
        return c.view(base, (k, m), (base.nb[1], es))
    base = c.randn(t, k + 32, m)   # padded rows; the view starts one element (Q8_0: one block) in, so F16/F32
    off = {G.F32: 4, G.F16: 2, G.Q8_0: 34}[t]   # rows lose 16-byte alignment (generic path)
    return c.view(base, (k, m), base.nb[:2], off=off)


def _x(c: Case, w: str, k: int, *cols, xpad: int = 0):
    """The x operand (K, cols...): F32 for float weights (rows padded by `xpad` floats: generic x path),
    Q8_1 blocks for Q8_0 weights (as quantize_q8_1 writes them; xpad: one spare block per row)."""
    if w == "q8_0":
        return c.q8_1(k, *cols, pad_blocks=1 if xpad else 0)
    if xpad:
        xb = c.randn(G.F32, k + xpad, *cols)
        return c.view(xb, (k, *cols), xb.nb[:len(cols) + 1])
    return c.randn(G.F32, k, *cols)


def mat_vec_cases() -> list[Case]:
    out = []
    for w in W_TYPES:
        for k, m, n, layout, xpad in ((2048, 512, 1, "contig", 0), (1024, 300, 3, "contig", 0),
                                      (512, 130, 8, "contig", 0), (288, 64, 4, "contig", 0),
                                      (512, 96, 2, "offset", 0), (512, 96, 2, "contig", 3),
                                      (256, 70, 1, "transposed", 0)):
            if layout == "transposed" and w == "q8_0":
                continue
            c = Case(f"mul_mat_vec_{w}", f"K{k}-M{m}-N{n}-{layout}-xpad{xpad}", F32_DOT)
            W = _weights(c, w, k, m, layout=layout)
            out.append(c.set(c.output(G.F32, m, n), W, _x(c, w, k, n, xpad=xpad)))
        # rows shared by warps (1: one warp per row); K1280: whole 16-byte aligned rows with a partial last
        # step (F16/F32: the predicated use of its loads; Q8_0: one staged step, then 8 blocks 4 lanes each)
        for k, m, parts in ((2048, 512, 2), (2048, 70, 4), (1056, 33, 4), (96, 9, 2), (1280, 64, 2),
                            (1280, 40, 1)):
            c = Case(f"mul_mat_vec_{w}", f"K{k}-M{m}-N1-{parts}-warps-per-row", F32_DOT)
            out.append(c.set(c.output(G.F32, m, 1), _weights(c, w, k, m), _x(c, w, k, 1), ip=(0, parts)))
        # rows of fewer than 32 blocks, every other one off 16-byte alignment (K640: Gemma 3's LM head; Q8_0:
        # a block a lane), alone and shared by warps; and K1120 (35 blocks): one staged step, then a tail of 3
        # blocks taken a block a lane
        for k, m, parts in ((640, 70, 1), (640, 37, 2), (512, 33, 1), (1120, 21, 4)):
            c = Case(f"mul_mat_vec_{w}", f"K{k}-M{m}-N1-{parts}-warps-per-row-short", F32_DOT)
            out.append(c.set(c.output(G.F32, m, 1), _weights(c, w, k, m), _x(c, w, k, 1), ip=(0, parts)))
        c = Case(f"mul_mat_vec_{w}", "K512-M96-N1-offset-2-warps-per-row", F32_DOT)     # the generic loops
        out.append(c.set(c.output(G.F32, 96, 1), _weights(c, w, 512, 96, layout="offset"), _x(c, w, 512, 1),
                         ip=(0, 2)))
        c = Case(f"mul_mat_vec_{w}", "batch-broadcast", F32_DOT)   # W (K, M, 1) over x (K, N, 2)
        out.append(c.set(c.output(G.F32, 100, 2, 2), c.randn(WT[w], 256, 100), _x(c, w, 256, 2, 2)))
    return out


def mat_mat_cases() -> list[Case]:
    """Tensor-core tiles (128 x 64) with partial edges, several k steps, W broadcast over batches, and a grid
    of more blocks than the GPU has SMs (2100 x 600: 170)."""
    out = []
    for w in W_TYPES:
        shapes = [(160, 50, 37, 1, 1), (256, 64, 16, 2, 1), (96, 33, 20, 2, 2), (256, 300, 130, 1, 1),
                  (1408, 512, 250, 1, 1), (96, 2100, 600, 1, 1)]
        if w != "q8_0":
            shapes.append((72, 40, 24, 1, 1))   # K not a multiple of the 32-wide k step
            shapes.append((60, 40, 24, 1, 1))   # rows not 16-byte aligned: F16 takes the register path
        if w == "f16":   # upstream's MMF range below 9 columns (2-8 sequences decoding): one partial column tile
            shapes += [(512, 512, 2, 1, 1), (1408, 512, 8, 1, 1), (512, 4096, 5, 1, 1)]
        for k, m, n, b, wb in shapes:
            c = Case(f"mul_mat_{w}", f"K{k}-M{m}-N{n}-B{b}-W{wb}", TC_DOT if w == "f16" else F32_DOT)
            out.append(c.set(c.output(G.F32, m, n, b), c.randn(WT[w], k, m, wb), _x(c, w, k, n, b)))
    return out + k_split_cases()


def k_split_cases() -> list[Case]:
    """The k-split (ip[0] = S parts) of the tensor-core mat-muls and of mul_mat_f32: part 0 into dst, parts 1.. into the partials
    (t[3]), each compared (out = 3: the partials), with a part of no k (more parts than 64-wide k units), a
    partial last unit, unaligned rows (F16's register path) and batches; then mul_mat_fixup_f32."""
    out = []
    for w in ("f16", "q8_0", "f32"):
        shapes = [(1408, 512, 250, 1, 1, 3), (256, 300, 12, 2, 1, 4), (160, 200, 9, 1, 1, 5), (96, 64, 40, 2, 2, 2)]
        if w == "f32":   # cuBLAS's split-K stand-in: the MoE router's shape (8 experts, K 512) at 4 and 16 columns
            shapes += [(512, 8, 4, 1, 1, 8), (512, 8, 16, 1, 1, 8), (200, 8, 9, 1, 1, 4)]
        if w == "f16":
            shapes.append((200, 130, 24, 1, 1, 3))   # K % 64 != 0, rows not 16-byte aligned: the register path
        for k, m, n, b, wb, s in shapes:
            for slot in (0, 3):
                c = Case(f"mul_mat_{w}", f"K{k}-M{m}-N{n}-B{b}-W{wb}-S{s}-" + ("dst" if slot == 0 else "partials"),
                         TC_DOT if w == "f16" else F32_DOT, out=slot)
                out.append(c.set(c.output(G.F32, m, n, b), c.randn(WT[w], k, m, wb), _x(c, w, k, n, b),
                                 c.output(G.F32, m, n, b, s - 1), ip=(s,)))
    for m, n, b2, b3, p in ((300, 12, 1, 1, 3), (64, 9, 2, 2, 1), (1000, 33, 1, 1, 7)):
        c = Case("mul_mat_fixup_f32", f"M{m}-N{n}-B{b2}x{b3}-P{p}", F32_ELEM)
        out.append(c.set(c.randn(G.F32, m, n, b2, b3), c.randn(G.F32, m, n, b2, b3 * p), ip=(p,)))
    return out + cublas_f16_cases() + moe_reduction_cases() + topk_moe_cases()


def cublas_f16_cases() -> list[Case]:
    """Upstream's cuBLAS path for F16 weights past 16 columns as graphdiag launches it (lowering._cublas_f16):
    x's F16 copy (cpy_f32_f16), mul_mat_f16 reading that copy as it is and writing an F16 result (its pipelined
    path on aligned rows, the register path otherwise), split over K with mul_mat_fixup_f32 adding F32
    partials into the F16 result, and cpy_f16_f32 writing the node. F16 results are compared within two F16
    ulps of max|ref| (the F32 sums round to F16 on both sides, their last bits may differ)."""
    out = []
    for k, m, n, b in ((1408, 512, 47, 1), (512, 512, 26, 1), (512, 1408, 47, 1), (96, 33, 20, 2), (72, 40, 24, 1),
                       (60, 40, 24, 1)):
        c = Case("mul_mat_f16", f"xh-K{k}-M{m}-N{n}-B{b}", 2 * F16_OUT)
        out.append(c.set(c.output(G.F16, m, n, b), c.randn(G.F16, k, m), c.randn(G.F16, k, n, b)))
    for k, m, n, s in ((1408, 512, 47, 2), (1024, 512, 32, 2), (200, 130, 24, 3)):
        for slot in (0, 3):
            c = Case("mul_mat_f16", f"xh-K{k}-M{m}-N{n}-S{s}-" + ("dst" if slot == 0 else "partials"),
                     2 * F16_OUT if slot == 0 else TC_DOT, out=slot)
            out.append(c.set(c.output(G.F16, m, n), c.randn(G.F16, k, m), c.randn(G.F16, k, n),
                             c.output(G.F32, m, n, 1, s - 1), ip=(s,)))
    c = Case("mul_mat_fixup_f32", "f16-dst-M512-N47-P1", F16_OUT)
    out.append(c.set(c.randn(G.F16, 512, 47), c.randn(G.F32, 512, 47), ip=(1,)))
    c = Case("cpy_f16_f32", "M1408-N47", 0.0)
    out.append(c.set(c.output(G.F32, 1408, 47), c.randn(G.F16, 1408, 47)))
    c = Case("cpy_f16_f32", "transposed-src", 0.0)
    sb = c.randn(G.F16, 24, 10)
    out.append(c.set(c.output(G.F32, 10, 24), c.view(sb, (10, 24), (sb.nb[1], 2))))
    return out


def moe_reduction_cases() -> list[Case]:
    """The MoE weighted reduction: k experts' rows of n_embd (a partial last block of 256) per token, with and
    without the per-expert scale."""
    out = []
    for d, k, t, scaled in ((512, 2, 1, False), (300, 4, 7, True), (2048, 8, 3, False)):
        c = Case("moe_weighted_reduction_f32", f"E{d}-k{k}-T{t}" + ("-scaled" if scaled else ""), F32_ELEM)
        out.append(c.set(c.output(G.F32, d, t), c.randn(G.F32, d, k, t), c.randn(G.F32, 1, k, t),
                         c.randn(G.F32, 1, k, t) if scaled else None))
    return out


def topk_moe_cases() -> list[Case]:
    """The top-k MoE router: the weights (slot 0) and the ids written through the argsort's view (slot 1: its
    first k columns of n_expert, the rest untouched), 8 tokens a block (a partial last block at 9 and 5); with
    the weight norm (llama's MoE: ip[1] 1, fp[1] the CLAMP's minimum, 0.99 where it exceeds the kept sum), and
    k = 40 (weights and sums held in a lane's second slot)."""
    out = []
    plain = ((8, 2, 1, 1.0), (8, 2, 9, 1.0), (64, 6, 5, 2.5), (512, 8, 3, 1.0), (288, 8, 2, 1.0), (64, 40, 3, 1.0))
    norm = ((8, 2, 1, 1.0, 6.103515625e-5), (8, 2, 9, 1.0, 6.103515625e-5), (64, 6, 5, 2.5, 6.103515625e-5),
            (512, 8, 3, 1.0, 6.103515625e-5), (576, 8, 4, 1.0, 6.103515625e-5), (64, 40, 3, 1.0, 6.103515625e-5),
            (64, 2, 9, 1.0, 0.99))
    for n, k, t, scale, lo in [(*x, None) for x in plain] + list(norm):
        for slot in (0, 1):
            what = "" if lo is None else f"-norm{lo:g}"
            c = Case("topk_moe_f32", f"E{n}-k{k}-T{t}-s{scale}{what}-{'weights' if slot == 0 else 'ids'}", F32_ELEM)
            ids = c.output(G.I32, n, t)
            c.set(c.output(G.F32, k, t), c.view(ids, (k, t), (4, ids.nb[1])), c.randn(G.F32, n, t, scale=3),
                  ip=(k, int(lo is not None)), fp=(scale, 0.0 if lo is None else lo))
            c.out = slot
            out.append(c)
    # the delayed softmax (gpt-oss's router, ip[2]): the top k of the logits, then the k kept softmaxed
    for n, k, t in ((8, 4, 1), (32, 4, 9), (128, 4, 3), (64, 40, 2)):
        for slot in (0, 1):
            c = Case("topk_moe_f32", f"E{n}-k{k}-T{t}-delayed-{'weights' if slot == 0 else 'ids'}", F32_ELEM)
            ids = c.output(G.I32, n, t)
            c.set(c.output(G.F32, 1, k, t), c.view(ids, (k, t), (4, ids.nb[1])), c.randn(G.F32, n, t, scale=3),
                  ip=(k, 0, 1), fp=(1.0, 0.0))
            c.out = slot
            out.append(c)
    return out


def glu_cases() -> list[Case]:
    out = []
    for w in W_TYPES:
        # K1280: aligned rows with a partial last step (Q8_0: a staged step, then 8 blocks past it)
        # K640: rows of 20 blocks, odd ones off 16-byte alignment (Q8_0: a block a lane, staged or not)
        for k, m, n in ((1024, 300, 1), (512, 77, 5), (1280, 70, 1), (640, 33, 1)):
            c = Case(f"mul_mat_vec_glu_{w}", f"K{k}-M{m}-N{n}", F32_DOT)
            out.append(c.set(c.output(G.F32, m, n), c.randn(WT[w], k, m), c.randn(WT[w], k, m),
                             _x(c, w, k, n), ip=(2,)))
    return out


def mmv_add_cases() -> list[Case]:
    """The fused mat-vec + residual ADD (1 token in the graphs; the kernel takes up to 8 columns)."""
    out = []
    for w in W_TYPES:
        for k, m, n, parts in ((2048, 512, 1, 1), (512, 77, 1, 1), (256, 40, 3, 1), (2048, 512, 1, 2),
                               (1024, 77, 1, 4)):
            c = Case(f"mul_mat_vec_add_{w}", f"K{k}-M{m}-N{n}" + (f"-{parts}-warps-per-row" if parts > 1 else ""),
                     F32_DOT)
            out.append(c.set(c.output(G.F32, m, n), c.randn(WT[w], k, m), _x(c, w, k, n),
                             c.randn(G.F32, m, n), ip=(0, parts)))
    return out


def quantize_cases() -> list[Case]:
    """Q8_1 bytes must match the simulator exactly (the integer-dot kernels' inputs)."""
    out = []
    c = Case("quantize_q8_1", "rows-with-a-zero-block", 0.0)
    x = c.rng.standard_normal((3, 96)).astype(np.float32) * 3
    x[1, 32:64] = 0.0
    out.append(c.set(c.output(Q8_1, 96, 3), c.put(G.F32, x)))
    c = Case("quantize_q8_1", "strided-view", 0.0)
    xb = c.randn(G.F32, 70, 4, 2)
    out.append(c.set(c.output(Q8_1, 64, 4, 2), c.view(xb, (64, 4, 2), xb.nb[:3], off=8)))
    return out


def _ids(c: Case, e: int, n_used: int, t: int) -> np.ndarray:
    """(T, n_used) expert ids, distinct per token (a top-k router's)."""
    return np.stack([c.rng.permutation(e)[:n_used] for _ in range(t)]).astype(np.int32)


def moe_cases() -> list[Case]:
    out = []
    for w in W_TYPES:
        e, k, m, n_used, t = 4, 256, 100, 2, 3
        tg = t if w == "q8_0" else 1          # the fused gate/up: q8_0 up to 8 tokens (mmvq), float at one
        for n_b in (1, n_used):
            c = Case(f"mul_mat_id_vec_{w}", f"E{e}-nb{n_b}", F32_DOT)
            ids = c.ints(c.rng.permutation(e * t)[: n_used * t] % e, (n_used, t))
            out.append(c.set(c.output(G.F32, m, n_used, t), c.randn(WT[w], k, m, e), _x(c, w, k, n_b, t), ids))
        for n_b in (1, n_used):
            c = Case(f"mul_mat_id_vec_glu_{w}", f"E{e}-nb{n_b}-T{tg}", F32_DOT)
            ids = c.ints(_ids(c, e, n_used, tg), (n_used, tg))
            out.append(c.set(c.output(G.F32, m, n_used, tg), c.randn(WT[w], k, m, e), c.randn(WT[w], k, m, e),
                             _x(c, w, k, n_b, tg), ids, ip=(2,)))
        c = Case(f"mul_mat_id_gathered_{w}", "rows-1..4", F32_DOT)
        pairs = c.ints([[0, 0], [1, 0], [0, 1], [1, 2], [0, 2], [1, 1]], (2, 6))   # (slot, token) pairs
        out.append(c.set(c.output(G.F32, m, n_used, t), c.randn(WT[w], k, m, e), c.randn(G.F32, k, n_used, t),
                         pairs, ip=(2, 3, 1)))
    return out + sorted_moe_cases()


def sorted_moe_cases() -> list[Case]:
    """mm_ids_helper (the map and the bounds) and the mat-muls over its map: mul_mat_id_q_q8_0 on Q8_1 x whole
    and in 3 k parts (dst holds part 0, the partials the others), mul_mat_id_f_f32 / _f16 on F32 x. 20 tokens
    of 2 of 8 experts (one expert left without a pair), x broadcast (gate/up) or per slot (down)."""
    out = []
    e, k, m, n_used, t = 8, 512, 70, 2, 20
    for ne_ids in ((2, 5), (n_used, t)):
        for slot, what in ((0, "map"), (2, "bounds")):
            c = Case("mm_ids_helper", f"ids{ne_ids[0]}x{ne_ids[1]}-E{e}-{what}", 0.0)
            ids = c.ints(_ids(c, e - 1, ne_ids[0], ne_ids[1]), ne_ids)
            out.append(c.set(c.output(G.I32, 2, ne_ids[0] * ne_ids[1]), ids, c.output(G.I32, e + 1)))
            out[-1].out = slot
    for n_b in (1, n_used):
        for parts, slot in ((0, 0), (3, 0), (3, 3)):
            c = Case("mul_mat_id_q_q8_0", f"E{e}-nb{n_b}-T{t}-parts{parts}-{'partials' if slot else 'dst'}", F32_DOT)
            pairs, bounds = expert_map(c, _ids(c, e - 1, n_used, t), e)
            partials = c.output(G.F32, m, n_used, t, 2) if parts else None
            out.append(c.set(c.output(G.F32, m, n_used, t), c.randn(G.Q8_0, k, m, e), c.q8_1(k, n_b, t), partials,
                             pairs, bounds, ip=(parts,)))
            out[-1].out = slot
        for w in ("f32", "f16"):
            c = Case(f"mul_mat_id_f_{w}", f"E{e}-nb{n_b}-T{t}", F32_DOT)
            pairs, bounds = expert_map(c, _ids(c, e - 1, n_used, t), e)
            out.append(c.set(c.output(G.F32, m, n_used, t), c.randn(WT[w], k, m, e), c.randn(G.F32, k, n_b, t), None,
                             pairs, bounds))
    return out


def get_rows_cases() -> list[Case]:
    out = []
    for w in W_TYPES:
        c = Case(f"get_rows_{w}", "2d-ids", 0.0)
        out.append(c.set(c.output(G.F32, 96, 3, 2), c.randn(WT[w], 96, 20), c.ints([[3, 0, 19], [7, 7, 1]])))
        c = Case(f"get_rows_{w}", "wide-row", 0.0)
        out.append(c.set(c.output(G.F32, 2048, 1), c.randn(WT[w], 2048, 5), c.ints([4])))
    return out


def norm_cases() -> list[Case]:
    out = []
    c = Case("rms_norm_f32", "rows", F32_ELEM)
    out.append(c.set(c.output(G.F32, 1000, 3, 2), c.randn(G.F32, 1000, 3, 2), fp=(1e-5,)))
    c = Case("rms_norm_f32", "strided-view", F32_ELEM)
    xb = c.randn(G.F32, 64, 6)
    out.append(c.set(c.output(G.F32, 40, 3), c.view(xb, (40, 3), (4, 2 * xb.nb[1]), off=8), fp=(1e-6,)))
    c = Case("rms_norm_mul_f32", "w-broadcast", F32_ELEM)
    out.append(c.set(c.output(G.F32, 2048, 2), c.randn(G.F32, 2048, 2), c.randn(G.F32, 2048), fp=(1e-5,)))
    # the one-round-trip path: decode rows (one float4 per thread, up to 4 per thread), w rows broadcast by
    # modulo, and widths that take the strided loop (n % 4 != 0, w narrower than the row)
    c = Case("rms_norm_mul_f32", "decode-4096", F32_ELEM)
    out.append(c.set(c.output(G.F32, 4096, 1), c.randn(G.F32, 4096, 1), c.randn(G.F32, 4096), fp=(1e-5,)))
    c = Case("rms_norm_mul_f32", "wide-16384-w-rows", F32_ELEM)
    out.append(c.set(c.output(G.F32, 16384, 4), c.randn(G.F32, 16384, 4), c.randn(G.F32, 16384, 2), fp=(1e-5,)))
    c = Case("rms_norm_f32", "wide-9000", F32_ELEM)
    out.append(c.set(c.output(G.F32, 9000, 2), c.randn(G.F32, 9000, 2), fp=(1e-5,)))
    c = Case("rms_norm_f32", "odd-1002", F32_ELEM)
    out.append(c.set(c.output(G.F32, 1002, 2), c.randn(G.F32, 1002, 2), fp=(1e-5,)))
    c = Case("rms_norm_mul_f32", "w-period-4", F32_ELEM)
    out.append(c.set(c.output(G.F32, 64, 2), c.randn(G.F32, 64, 2), c.randn(G.F32, 4), fp=(1e-5,)))
    c = Case("soft_max_f32", "scaled", F32_ELEM)
    out.append(c.set(c.output(G.F32, 300, 4), c.randn(G.F32, 300, 4), fp=(0.7,)))
    c = Case("soft_max_f32", "masked", F32_ELEM)
    x = c.rng.standard_normal((3, 50)).astype(np.float32)
    x[0, 10:] = -np.inf
    x[2, :] = -np.inf   # fully masked: zeros
    out.append(c.set(c.output(G.F32, 50, 3), c.put(G.F32, x), fp=(1.0,)))
    return out


def elementwise_cases() -> list[Case]:
    out = []
    for name in ("add_f32", "mul_f32"):
        c = Case(name, "broadcast", F32_ELEM)
        out.append(c.set(c.output(G.F32, 37, 5, 3), c.randn(G.F32, 37, 5, 3), c.randn(G.F32, 37, 1, 3)))
        c = Case(name, "permuted-view", F32_ELEM)   # a = the transpose of a stored (5, 37) matrix
        ab = c.randn(G.F32, 5, 37)
        a = c.view(ab, (37, 5), (ab.nb[1], 4))
        out.append(c.set(c.output(G.F32, 37, 5), a, c.randn(G.F32, 37, 1)))
        c = Case(name, "strided-dst", F32_ELEM)     # dst rows 8 floats apart, gaps stay poisoned
        d = c.output(G.F32, 8, 4)
        out.append(c.set(c.view(d, (6, 4), (4, 32)), c.randn(G.F32, 6, 4), c.randn(G.F32, 6, 4)))
    c = Case("glu_swiglu_f32", "rows", F32_ELEM)
    out.append(c.set(c.output(G.F32, 100, 3), c.randn(G.F32, 100, 3, scale=4), c.randn(G.F32, 100, 3)))
    for name, t, bound in (("cpy_f32_f32", G.F32, 0.0), ("cpy_f32_f16", G.F16, 0.0)):
        c = Case(name, "transposed-src", bound)
        sb = c.randn(G.F32, 24, 10)
        out.append(c.set(c.output(t, 10, 24), c.view(sb, (10, 24), (sb.nb[1], 4))))
        c = Case(name, "into-view", bound)
        d = c.output(t, 16, 6)
        out.append(c.set(c.view(d, (12, 3, 2), (d.nb[0], d.nb[1], 3 * d.nb[1]), off=2 * d.nb[0]),
                         c.randn(G.F32, 12, 3, 2)))
    return out


def rope_cases() -> list[Case]:
    out = []
    for n_dims, fs in ((64, 1.0), (32, 0.5)):
        c = Case("rope_f32", f"ndims{n_dims}-fs{fs}", ROPE)
        pos = c.ints(c.rng.integers(0, 100, 5))
        out.append(c.set(c.output(G.F32, 64, 4, 5), c.randn(G.F32, 64, 4, 5), pos,
                         ip=(n_dims, 0), fp=(10000.0, fs)))
    c = Case("rope_f32", "qkv-view", ROPE)   # q heads viewed out of a fused (D*(H+2Hkv), T) buffer
    qkv = c.randn(G.F32, 32 * 8, 3)
    x = c.view(qkv, (32, 4, 3), (4, 32 * 4, qkv.nb[1]), off=32 * 4 * 2)
    out.append(c.set(c.output(G.F32, 32, 4, 3), x, c.ints([7, 8, 9]), ip=(32, 0), fp=(500000.0, 1.0)))
    c = Case("rope_set_rows_f16", "cache", F16_OUT)
    out.append(c.set(c.output(G.F16, 64, 10), c.randn(G.F32, 32, 2, 3), c.ints([5, 6, 7]), c.ints([2, 9, 4]),
                     ip=(32, 0), fp=(10000.0, 1.0)))
    # a block per row: pairs past the block's 256 threads, and tokens past the grid's 65535 rows in y
    c = Case("rope_set_rows_f16", "pairs-past-block", F16_OUT)
    out.append(c.set(c.output(G.F16, 1024, 4), c.randn(G.F32, 1024, 1, 2), c.ints([3, 90]), c.ints([1, 3]),
                     ip=(768, 0), fp=(10000.0, 1.0)))
    # theta = pos exactly (one pair, n_dims 2: its frequency is 1) up to 2^17: the kernel's sin/cos (2 pi reduced
    # in two parts, then the hardware's) against numpy's float32 sin/cos of the same theta; the hardware's own
    # reduction alone would be off by ~1e-2 there
    c = Case("rope_f32", "large-positions", ROPE_SINCOS)
    out.append(c.set(c.output(G.F32, 2, 4, 256), c.randn(G.F32, 2, 4, 256), c.ints(c.rng.integers(0, 1 << 17, 256)),
                     ip=(2, 0), fp=(10000.0, 1.0)))
    c = Case("rope_f32", "tokens-past-grid-y", ROPE)
    n_tok = 65535 + 70
    out.append(c.set(c.output(G.F32, 4, 1, n_tok), c.randn(G.F32, 4, 1, n_tok), c.ints(c.rng.integers(0, 100, n_tok)),
                     ip=(4, 0), fp=(10000.0, 1.0)))
    return out


def set_rows_cases() -> list[Case]:
    out = []
    for name, t in (("set_rows_f16", G.F16), ("set_rows_f32", G.F32)):
        c = Case(name, "rows", 0.0)
        out.append(c.set(c.output(t, 64, 16), c.randn(G.F32, 64, 5), c.ints([3, 0, 15, 8, 9])))
        c = Case(name, "heads-flattened", 0.0)   # src (D, Hkv, T) into rows of D * Hkv
        out.append(c.set(c.output(t, 64, 8), c.randn(G.F32, 16, 4, 3), c.ints([1, 6, 2])))
        c = Case(name, "strided-src", 0.0)       # a source view with gaps: the general (unravelling) loop
        sb = c.randn(G.F32, 80, 5)
        out.append(c.set(c.output(t, 64, 16), c.view(sb, (64, 5), (4, sb.nb[1])), c.ints([3, 0, 15, 8, 9])))
    return out


def _causal_mask(c: Case, t: int, n_kv: int, t_pad: int, visible: int | None = None) -> np.ndarray:
    """Random finite mask values, causal over the last t of `visible` positions (the rest -inf)."""
    visible = n_kv if visible is None else visible
    m = c.rng.standard_normal((t_pad, n_kv)).astype(np.float32) * 0.5
    m[:, visible:] = -np.inf
    for i in range(t):
        m[i, visible - t + i + 1:] = -np.inf
    return m


def flash_attn_cases() -> list[Case]:
    """Split-KV partials: GQA groups, decode (1 token, many splits), prefill tiles (64 rows per block),
    F32 / F16 / no mask, a fully masked row, splits whose positions are all masked."""
    out = []
    # (the shapes of the CUDA-core batch kernel these replaced: T > 8 take the tensor-core kernel, T <= 8 the
    # decode kernel, as the lowering chooses)
    cfgs = [("mma" if not fa_vec(x[1], x[2], x[3]) else "vec", *x)
            for x in ((64, 8, 2, 3, 40, G.F32, None), (128, 4, 4, 1, 300, None, None),
                      (64, 2, 1, 2, 7, G.F16, None), (64, 8, 2, 40, 64, G.F32, None), (32, 4, 4, 2, 50, G.F16, None),
                      (64, 4, 4, 40, 80, G.F16, 72), (64, 8, 8, 250, 256, G.F16, 250),
                      (64, 8, 8, 1, 512, G.F16, 260))]
    # the decode kernels: every head size and GQA group up to 8, F32 / F16 / per-head / no mask, several tiles
    # per split (long n_kv), a ragged last tile, small batches (T <= 8), a fully masked row
    cfgs += [("vec", *x) for x in (
        (64, 8, 8, 1, 256, G.F16, 201), (64, 32, 8, 1, 256, G.F16, 201), (128, 32, 32, 1, 256, G.F16, 230),
        (32, 4, 4, 2, 50, G.F16, None), (64, 8, 1, 1, 300, None, None), (128, 8, 4, 3, 40, G.F32, None),
        (64, 32, 8, 1, 4096, G.F16, 3000), (64, 16, 8, 8, 520, G.F16, 500), (128, 6, 2, 2, 70, G.F32, 65),
        # every (D, G) entry point has a case; G = 5 runs in the g8 entry with three heads idle
        (32, 8, 4, 1, 100, G.F16, 90), (32, 16, 4, 2, 64, G.F32, None), (32, 16, 2, 1, 200, G.F16, 150),
        (128, 16, 2, 1, 300, G.F16, 280), (32, 10, 2, 1, 70, None, None))]
    # the tensor-core batch kernels: every head size, GQA groups that do and do not divide the 64-row tile
    # (rows cross tokens), ragged row and position tiles, several splits, F32 / F16 / no mask, a fully
    # masked row, causal prefill shapes
    cfgs += [("mma", *x) for x in (
        (64, 32, 8, 100, 300, G.F16, 290), (128, 8, 8, 40, 256, G.F32, None), (32, 4, 2, 20, 70, None, None),
        (64, 6, 2, 2, 50, G.F16, None), (64, 32, 4, 33, 1000, G.F16, 980), (128, 32, 32, 16, 128, G.F16, 128),
        (32, 16, 1, 9, 96, G.F32, 90), (64, 32, 8, 512, 1024, G.F16, 1024),
        # 2-8 sequences decoding, where upstream (and now graphdiag) leave the vec kernel: tiny (no GQA) and
        # qwen3moe-tiny's shapes (geometry.fa_takes_vec)
        (64, 8, 8, 3, 256, G.F16, 256), (64, 8, 8, 8, 512, G.F16, 400), (128, 8, 2, 4, 256, G.F16, 256))]
    for name, d, h, hkv, t, n_kv, mask_t, vis in cfgs:
        name = fa_vec_kernel(d, h // hkv) if name == "vec" else fa_mma_kernel(d) if name == "mma" else name
        mma = name.startswith("flash_attn_mma")
        c = Case(name, f"D{d}-H{h}-Hkv{hkv}-T{t}-kv{n_kv}-{'nomask' if mask_t is None else mask_t.name}",
                 FA_MMA if mma else F32_DOT)
        n_cache = n_kv + 5
        kc = c.randn(G.F16, d * hkv, n_cache)     # caches as the model stores them: one row per position
        vc = c.randn(G.F16, d * hkv, n_cache)
        kview = c.view(kc, (d, hkv, n_kv), (2, 2 * d, kc.nb[1]))
        vview = c.view(vc, (d, hkv, n_kv), (2, 2 * d, vc.nb[1]))
        mask = None
        if mask_t is not None:
            m = _causal_mask(c, t, n_kv, -(-t // 8) * 8, vis)
            if t == 2:
                m[0, :] = -np.inf   # a fully masked row: its partials are (0, -inf, 0)
            mask = c.put(mask_t, m)
        if mma:
            tq, blocks = FAM_ROWS, fa_mma_blocks(h, hkv, t)
        else:
            tq = 1
            assert fa_vec(h, hkv, t)
            blocks = hkv * t
        n_split, chunk = fa_split(n_kv, blocks, max(1, n_kv // (d + 2)) if mma else None)   # lowering's cap
        out.append(c.set(c.output(G.F32, d + 2, n_split, h, t), c.randn(G.F32, d, h, t), kview, vview, mask,
                         ip=(chunk, tq), fp=(1.0 / np.sqrt(d),)))
    # the vec kernel with a per-head mask (ne2 = H) and with K/V views that are not 16-byte aligned (the
    # element-wise load path)
    for tag, d, h, hkv, n_kv in (("per-head-mask", 64, 8, 2, 100), ("unaligned", 64, 4, 2, 70)):
        c = Case(fa_vec_kernel(d, h // hkv), f"D{d}-H{h}-Hkv{hkv}-T1-kv{n_kv}-{tag}", F32_DOT)
        off = 2 if tag == "unaligned" else 0
        width = d * hkv + (1 if tag == "unaligned" else 0)   # odd rows: no 16-byte alignment
        kc = c.randn(G.F16, width, n_kv + 1)
        vc = c.randn(G.F16, width, n_kv + 1)
        kview = c.view(kc, (d, hkv, n_kv), (2, 2 * d, kc.nb[1]), off)
        vview = c.view(vc, (d, hkv, n_kv), (2, 2 * d, vc.nb[1]), off)
        if tag == "per-head-mask":
            m = np.stack([_causal_mask(c, 1, n_kv, 1, n_kv - 3 * i) for i in range(h)])   # (H, 1, n_kv)
            m[1, :, :] = -np.inf
            mask = c.put(G.F16, m)
        else:
            mask = c.put(G.F32, _causal_mask(c, 1, n_kv, 1, n_kv - 9))
        n_split, chunk = fa_split(n_kv, hkv)
        out.append(c.set(c.output(G.F32, d + 2, n_split, h, 1), c.randn(G.F32, d, h, 1), kview, vview, mask,
                         ip=(chunk, 1), fp=(1.0 / np.sqrt(d),)))
    # The last two are batches of FA_COMBINE_MIN_ROWS tokens or more (several heads per block), the first of
    # them with heads that do not fill the last block
    # Past 8 splits the combine works in chunks of 8, rescaled to the running max (20: three chunks; 9: a
    # chunk of one)
    for dv, ns, h, t in ((64, 5, 4, 3), (128, 1, 2, 2), (64, 8, 32, 1), (64, 20, 4, 2), (32, 9, 3, 1),
                         (64, 2, 6, 70), (128, 3, 32, 64)):
        c = Case("flash_attn_combine_f32", f"Dv{dv}-splits{ns}-H{h}-T{t}", F32_DOT)
        part = c.rng.standard_normal((t, h, ns, dv + 2)).astype(np.float32)
        part[..., dv] *= 3.0
        part[..., dv + 1] = c.rng.uniform(0.5, 10.0, (t, h, ns))
        empty = c.rng.random((t, h, ns)) < 0.3          # splits that saw nothing: (0, -inf, 0)
        part[empty] = 0.0
        part[..., dv][empty] = -np.inf
        part[0, -1, :, :] = 0.0                          # a fully masked row: zeros
        part[0, -1, :, dv] = -np.inf
        out.append(c.set(c.output(G.F32, dv, h, t), c.put(G.F32, part)))
    return out


def top_k_cases() -> list[Case]:
    out = []
    c = Case("top_k_f32", "experts", 0.0)
    out.append(c.set(c.output(G.I32, 4, 5), c.randn(G.F32, 64, 5), ip=(4,)))
    c = Case("top_k_f32", "ties", 0.0)
    x = np.round(c.rng.standard_normal((3, 32)), 0).astype(np.float32)   # many equal values
    out.append(c.set(c.output(G.I32, 8, 3), c.put(G.F32, x), ip=(8,)))
    # the MoE router's descending ARGSORT (llama.cpp's ggml_argsort_top_k): every index, ranked; distinct values
    # (an unstable GPU sort may order ties either way)
    for n in (64, 60):
        c = Case("argsort_f32_i32_desc", f"router n={n}", 0.0)
        out.append(c.set(c.output(G.I32, n, 5), c.randn(G.F32, n, 5)))
    return out


def rng_fill_cases() -> list[Case]:
    """The weight generator: bit-exact (bound 0) against its numpy twin, several blocks of 256 threads."""
    from graphdiag.backends import rng
    out = []
    for w in W_TYPES:
        for ne, seed, index in (((4096, 3), 0, 0), ((64, 5, 2), 0x1_2345_6789, 41)):
            c = Case(f"rng_fill_{w}", f"{'x'.join(map(str, ne))}-s{seed}-t{index}", 0.0)
            out.append(c.set(c.output(WT[w], *ne), ip=(*rng.seed_words(seed), index),
                             fp=(rng.multiplier(0.02), 0.5)))
    return out


# The catalogue, one builder a group. A case's buffers are built when its test runs (CaseRef.build), one group
# held at a time: built all at once at collection, the catalogue's 230 MB of inputs stayed resident in every
# pytest-xdist worker for the whole suite (twice: test_kernels.py and test_kernel_cases_sim.py each built it).
GROUPS = (mat_vec_cases, mat_mat_cases, glu_cases, mmv_add_cases, quantize_cases, moe_cases, get_rows_cases,
          norm_cases, elementwise_cases, rope_cases, set_rows_cases, flash_attn_cases, top_k_cases, rng_fill_cases,
          quant_cases, op_cases)


@dataclass(frozen=True)
class CaseRef:
    """A case of the catalogue by position (GROUPS[group]()[index]), named as its test id: kernel[id]."""

    group: int
    index: int
    kernel: str
    id: str

    def __str__(self) -> str:
        return f"{self.kernel}[{self.id}]"

    def build(self) -> Case:
        """The case with its buffers (its group is built once and kept until another group is asked for)."""
        return _group(self.group)[self.index]


@functools.lru_cache(maxsize=1)
def _group(g: int) -> list[Case]:
    return GROUPS[g]()


@functools.cache
def all_cases() -> tuple[CaseRef, ...]:
    """Every case of the catalogue, by reference (each group built once here for the names, then let go)."""
    refs = tuple(CaseRef(g, i, c.kernel, c.id) for g, build in enumerate(GROUPS) for i, c in enumerate(build()))
    missing = set(KERNELS) - {r.kernel for r in refs}
    assert not missing, f"kernels without a test case: {sorted(missing)}"
    return refs

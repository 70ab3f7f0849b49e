"""Kernel cases of the Gemma 3 / Qwen ops and fusions (scale, GEGLU, the norm fusions with add and rope,
NEOX rope, per-head QK-norm rows, broadcast bias adds, GEGLU mat-vec, flash attention at head size 256), and of
0c1e57098's RMS_NORM + SCALE fusion and GLU SWIGLU_CLAMP (alone and in the fused gate/up mat-vecs), and of
gpt-oss's ADD_ID, GLU SWIGLU_OAI and attention sinks (in the combine)."""

from __future__ import annotations

import itertools

import numpy as np

from graphdiag.backends.geometry import FAM_ROWS, fa_mma_blocks, fa_split
from graphdiag.backends.kernels import fa_direct_kernel, fa_mma_kernel, fa_vec_kernel
from graphdiag.ir.dtypes import GGMLType as G
from kernel_cases import F16_OUT, F32_DOT, F32_ELEM, FA_MMA, ROPE, Case

NEOX = 2
WT = {"f32": G.F32, "f16": G.F16, "q8_0": G.Q8_0}


def elementwise_op_cases() -> list[Case]:
    out = []
    c = Case("scale_f32", "scale-bias", 0.0)       # bytes equal: no FMA in the kernel
    out.append(c.set(c.output(G.F32, 640, 3), c.randn(G.F32, 640, 3, scale=3), fp=(25.298221, 0.5)))
    c = Case("scale_f32", "q-heads-view", 0.0)     # Gemma's Q scale on (D, H, T); x a strided view
    xb = c.randn(G.F32, 256, 6, 2)
    out.append(c.set(c.output(G.F32, 256, 4, 2), c.view(xb, (256, 4, 2), (4, xb.nb[1], xb.nb[2])), fp=(0.0625, 0.0)))
    c = Case("glu_geglu_f32", "rows", F32_ELEM)
    out.append(c.set(c.output(G.F32, 2048, 3), c.randn(G.F32, 2048, 3, scale=4), c.randn(G.F32, 2048, 3)))
    c = Case("glu_geglu_f32", "odd-strided", F32_ELEM)
    gb = c.randn(G.F32, 101, 2, scale=4)
    out.append(c.set(c.output(G.F32, 99, 2), c.view(gb, (99, 2), (4, gb.nb[1])), c.randn(G.F32, 99, 2)))
    c = Case("add_f32", "bias-row", F32_ELEM)      # Qwen2's Q bias (M,) over a batch (M, T)
    out.append(c.set(c.output(G.F32, 896, 7), c.randn(G.F32, 896, 7), c.randn(G.F32, 896)))
    return out


def norm_op_cases() -> list[Case]:
    out = []
    c = Case("rms_norm_mul_f32", "qk-norm-heads", F32_ELEM)   # (D, H, T) rows per head, w (D,)
    out.append(c.set(c.output(G.F32, 256, 4, 3), c.randn(G.F32, 256, 4, 3), c.randn(G.F32, 256), fp=(1e-6,)))
    c = Case("rms_norm_mul_f32", "qk-norm-view", F32_ELEM)    # heads viewed out of a wider mat-mul result
    xb = c.randn(G.F32, 128 * 3, 5)
    out.append(c.set(c.output(G.F32, 128, 2, 5), c.view(xb, (128, 2, 5), (4, 512, xb.nb[1]), off=4 * 128),
                     c.randn(G.F32, 128), fp=(1e-6,)))
    for tag, n, t, r_rows in (("decode-640", 640, 1, 1), ("batch-640", 640, 5, 5), ("r-broadcast", 1000, 3, 1)):
        c = Case("rms_norm_mul_add_f32", tag, F32_ELEM)
        out.append(c.set(c.output(G.F32, n, t), c.randn(G.F32, n, t), c.randn(G.F32, n), c.randn(G.F32, n, r_rows),
                         fp=(1e-6,)))
    for mode in (0, NEOX):
        # a pair per thread (D 256, 128; D 96: threads past the pairs), and D 1024: pairs strided over the block
        for d, h, t, n_dims in ((256, 4, 3, 256), (128, 2, 2, 64), (96, 3, 2, 64), (1024, 1, 2, 128)):
            c = Case("rms_norm_mul_rope_f32", f"mode{mode}-D{d}-H{h}-T{t}-ndims{n_dims}", ROPE)
            pos = c.ints(c.rng.integers(0, 100, t))
            out.append(c.set(c.output(G.F32, d, h, t), c.randn(G.F32, d, h, t), c.randn(G.F32, d), pos,
                             ip=(n_dims, mode), fp=(1e-6, 1e6 if d == 256 else 1e4, 1.0)))
    c = Case("rms_norm_mul_rope_set_rows_f16", "neox-cache", F16_OUT)
    out.append(c.set(c.output(G.F16, 256, 12), c.randn(G.F32, 256, 1, 3), c.randn(G.F32, 256), c.ints([5, 6, 7]),
                     c.ints([2, 9, 4]), ip=(256, NEOX), fp=(1e-6, 10000.0, 1.0)))
    c = Case("rms_norm_mul_rope_set_rows_f16", "normal-2heads", F16_OUT)
    out.append(c.set(c.output(G.F16, 128, 8), c.randn(G.F32, 64, 2, 2), c.randn(G.F32, 64), c.ints([3, 4]),
                     c.ints([7, 1]), ip=(64, 0), fp=(1e-5, 10000.0, 1.0)))
    return out


def rope_neox_cases() -> list[Case]:
    out = []
    for n_dims, base in ((256, 1e6), (64, 1e4)):
        c = Case("rope_f32", f"neox-ndims{n_dims}-base{base:g}", ROPE)
        pos = c.ints(c.rng.integers(0, 100, 3))
        out.append(c.set(c.output(G.F32, 256, 4, 3), c.randn(G.F32, 256, 4, 3), pos, ip=(n_dims, NEOX),
                         fp=(base, 1.0)))
    c = Case("rope_set_rows_f16", "neox-cache", F16_OUT)
    out.append(c.set(c.output(G.F16, 128, 10), c.randn(G.F32, 128, 1, 3), c.ints([5, 6, 7]), c.ints([2, 9, 4]),
                     ip=(128, NEOX), fp=(10000.0, 1.0)))
    return out


def geglu_mat_vec_cases() -> list[Case]:
    out = []
    for w in ("f16", "q8_0", "f32"):
        for k, m, n in ((640, 2048, 1), (512, 77, 3)):
            c = Case(f"mul_mat_vec_glu_{w}", f"geglu-K{k}-M{m}-N{n}", F32_DOT)
            x = c.q8_1(k, n) if w == "q8_0" else c.randn(G.F32, k, n)
            out.append(c.set(c.output(G.F32, m, n), c.randn(WT[w], k, m), c.randn(WT[w], k, m), x, ip=(1,)))
    return out


def _causal(c: Case, t: int, n_kv: int, t_pad: int, visible: int) -> np.ndarray:
    m = c.rng.standard_normal((t_pad, n_kv)).astype(np.float32) * 0.5
    m[:, visible:] = -np.inf
    for i in range(t):
        m[i, visible - t + i + 1:] = -np.inf
    return m


def flash_attn_256_cases() -> list[Case]:
    """Gemma 3's attention: D = 256, 4 query heads on one kv head (and the other groups of the vec entries)."""
    out = []
    cfgs = [("vec", 256, 4, 1, 1, 300, G.F16, 280), ("vec", 256, 1, 1, 1, 70, G.F32, None),
            ("vec", 256, 2, 1, 2, 100, G.F16, 90), ("vec", 256, 8, 1, 1, 520, G.F16, 512),
            ("vec", 256, 16, 4, 3, 64, None, None),
            ("mma", 256, 4, 1, 40, 300, G.F16, 290), ("mma", 256, 4, 1, 100, 128, G.F16, 128),
            ("mma", 256, 8, 2, 17, 96, G.F32, None), ("mma", 256, 4, 1, 9, 64, None, None)]
    for kind, d, h, hkv, t, n_kv, mask_t, vis in cfgs:
        name = fa_vec_kernel(d, h // hkv) if kind == "vec" else fa_mma_kernel(d)
        c = Case(name, f"D{d}-H{h}-Hkv{hkv}-T{t}-kv{n_kv}-{'nomask' if mask_t is None else mask_t.name}",
                 FA_MMA if kind == "mma" else F32_DOT)
        kc, vc = c.randn(G.F16, d * hkv, n_kv + 3), c.randn(G.F16, d * hkv, n_kv + 3)
        kview = c.view(kc, (d, hkv, n_kv), (2, 2 * d, kc.nb[1]))
        vview = c.view(vc, (d, hkv, n_kv), (2, 2 * d, vc.nb[1]))
        mask = None if mask_t is None else c.put(mask_t, _causal(c, t, n_kv, -(-t // 8) * 8, vis or n_kv))
        if kind == "mma":
            tq, blocks, cap = FAM_ROWS, fa_mma_blocks(h, hkv, t), max(1, n_kv // (d + 2))
        else:
            tq, blocks, cap = 1, hkv * t, None
        n_split, chunk = fa_split(n_kv, blocks, cap)
        out.append(c.set(c.output(G.F32, d + 2, n_split, h, t), c.randn(G.F32, d, h, t), kview, vview, mask,
                         ip=(chunk, tq), fp=(1.0 / 16.0,)))
    # the vec kernel alone, writing the node (ip[2]: one split, no combine, as upstream at one KV tile of D):
    # Gemma 3's shape, a GQA group of 2, no mask, and a fully masked row (zeros)
    # (per head, ip[3]: flash_attn_vec_direct_f16_d256, one block per query head, as the lowering launches it)
    for (h, hkv, n_kv, mask_t, vis), per_head in itertools.product(
            ((4, 1, 256, G.F16, 200), (8, 4, 256, G.F16, 256), (4, 1, 224, None, None), (2, 1, 256, G.F32, 0)),
            (False, True)):
        d = 256
        c = Case(fa_direct_kernel(d) if per_head else fa_vec_kernel(d, h // hkv), f"D{d}-H{h}-Hkv{hkv}-T1-kv{n_kv}-direct-"
                 f"{'nomask' if mask_t is None else mask_t.name}{'-masked' if vis == 0 else ''}"
                 f"{'-per-head' if per_head else ''}", F32_DOT)
        kc, vc = c.randn(G.F16, d * hkv, n_kv + 3), c.randn(G.F16, d * hkv, n_kv + 3)
        kview = c.view(kc, (d, hkv, n_kv), (2, 2 * d, kc.nb[1]))
        vview = c.view(vc, (d, hkv, n_kv), (2, 2 * d, vc.nb[1]))
        mask = None
        if mask_t is not None:
            m = _causal(c, 1, n_kv, 8, max(vis, 1))
            if vis == 0:
                m[...] = -np.inf
            mask = c.put(mask_t, m)
        out.append(c.set(c.output(G.F32, d, h, 1), c.randn(G.F32, d, h, 1), kview, vview, mask,
                         ip=(-(-n_kv // 32) * 32, 1, 1, int(per_head)), fp=(1.0 / 16.0,)))
    # fa_vec_direct at every head size (its lanes per position differ: 4 at D 32, 8 from D 64; p . V takes
    # D / 8 lanes), position counts that leave a warp's last step part empty, and unaligned K/V rows (the
    # element-wise load path)
    for d, h, hkv, n_kv, mask_t, unaligned in ((32, 2, 1, 27, None, False), (64, 8, 2, 50, G.F16, False),
                                               (64, 4, 2, 61, G.F32, True), (128, 4, 4, 100, G.F32, False),
                                               (256, 4, 1, 250, G.F16, False)):
        c = Case(fa_direct_kernel(d), f"D{d}-H{h}-Hkv{hkv}-T1-kv{n_kv}-direct-"
                 f"{'nomask' if mask_t is None else mask_t.name}{'-unaligned' if unaligned else ''}-per-head",
                 F32_DOT)
        off, width = (2, d * hkv + 1) if unaligned else (0, d * hkv)
        kc, vc = c.randn(G.F16, width, n_kv + 1), c.randn(G.F16, width, n_kv + 1)
        kview = c.view(kc, (d, hkv, n_kv), (2, 2 * d, kc.nb[1]), off)
        vview = c.view(vc, (d, hkv, n_kv), (2, 2 * d, vc.nb[1]), off)
        mask = None if mask_t is None else c.put(mask_t, _causal(c, 1, n_kv, 8, n_kv - 5))
        out.append(c.set(c.output(G.F32, d, h, 1), c.randn(G.F32, d, h, 1), kview, vview, mask,
                         ip=(-(-n_kv // 32) * 32, 1, 1, 1), fp=(1.0 / np.sqrt(d),)))
    c = Case("flash_attn_combine_f32", "Dv256-splits6-H4-T1", F32_DOT)
    part = c.rng.standard_normal((1, 4, 6, 258)).astype(np.float32)
    part[..., 257] = c.rng.uniform(0.5, 10.0, (1, 4, 6))
    out.append(c.set(c.output(G.F32, 256, 4, 1), c.put(G.F32, part)))
    return out


def norm_scale_swiglu_clamp_cases() -> list[Case]:
    """rms_norm_scale_f32 on its float4 path and its strided loop; SWIGLU_CLAMP (limit fp[0]) with most values
    beyond the limit: alone, and in the fused gate/up mat-vec and expert mat-vec kernels (ip[0] = 6)."""
    out = []
    for tag, n, t in (("decode-4096", 4096, 1), ("odd-1002", 1002, 3)):
        c = Case("rms_norm_scale_f32", tag, F32_ELEM)
        out.append(c.set(c.output(G.F32, n, t), c.randn(G.F32, n, t, scale=3), fp=(1e-6, 0.125)))
    c = Case("rms_norm_scale_f32", "strided-view", F32_ELEM)
    xb = c.randn(G.F32, 64, 6)
    out.append(c.set(c.output(G.F32, 40, 3), c.view(xb, (40, 3), (4, 2 * xb.nb[1]), off=8), fp=(1e-5, -2.5)))
    c = Case("glu_swiglu_clamp_f32", "rows", F32_ELEM)
    out.append(c.set(c.output(G.F32, 2048, 3), c.randn(G.F32, 2048, 3, scale=4), c.randn(G.F32, 2048, 3, scale=4),
                     fp=(1.5,)))
    c = Case("glu_swiglu_clamp_f32", "odd-strided", F32_ELEM)
    gb = c.randn(G.F32, 101, 2, scale=4)
    out.append(c.set(c.output(G.F32, 99, 2), c.view(gb, (99, 2), (4, gb.nb[1])), c.randn(G.F32, 99, 2, scale=4),
                     fp=(1.5,)))
    for w in ("f16", "q8_0", "f32"):
        for k, m, n in ((640, 2048, 1), (512, 77, 3)):
            # the dots' rounding (~1e-6 of |dot|, up to ~25 here) is measured against max|ref|, which the
            # clamp caps at 7 * silu(7): 2.3e-6 seen on the H200 at K640 (F16, F32), 4.4e-6 on the H100 at
            # K512-M77-N3 (F16, 2026-12-07), so four times F32_DOT
            c = Case(f"mul_mat_vec_glu_{w}", f"swiglu-clamp-K{k}-M{m}-N{n}", 4 * F32_DOT)
            x = c.q8_1(k, n) if w == "q8_0" else c.randn(G.F32, k, n)
            out.append(c.set(c.output(G.F32, m, n), c.randn(WT[w], k, m), c.randn(WT[w], k, m), x, ip=(6,),
                             fp=(7.0,)))
        c = Case(f"mul_mat_id_vec_glu_{w}", "swiglu-clamp-E4-nb2", F32_DOT)
        ids = c.ints(c.rng.permutation(4)[:2], (2, 1))
        x = c.q8_1(256, 2, 1) if w == "q8_0" else c.randn(G.F32, 256, 2, 1)   # Q8_0 experts read Q8_1 x (mmvq)
        out.append(c.set(c.output(G.F32, 100, 2, 1), c.randn(WT[w], 256, 100, 4), c.randn(WT[w], 256, 100, 4),
                         x, ids, ip=(6,), fp=(7.0,)))
    return out


def moe_norm_cases() -> list[Case]:
    """llama's MoE weight norm unfused: sum_rows_f32 over k = 2 weights per token and over a long strided row;
    clamp_f32 with values on both sides of its bounds and a NaN; div_f32 by a broadcast row sum (and by 0)."""
    out = []
    for tag, ne, strided in (("k2-T7", (2, 7), False), ("row-3000-strided", (3000, 3), True)):
        c = Case("sum_rows_f32", tag, F32_DOT)
        if strided:
            x = c.randn(G.F32, ne[0] + 5, ne[1])
            x = c.view(x, ne, (4, 4 * (ne[0] + 5)))
        else:
            x = c.randn(G.F32, *ne)
        out.append(c.set(c.output(G.F32, 1, ne[1]), x))
    c = Case("clamp_f32", "bounds-nan")
    v = c.rng.standard_normal((5, 64)).astype(np.float32)
    v[0, :4] = (np.nan, np.inf, -np.inf, 6e-5)
    out.append(c.set(c.output(G.F32, 64, 5), c.put(G.F32, v), fp=(6.103515625e-5, 0.75)))
    c = Case("div_f32", "by-row-sum")
    den = np.abs(c.rng.standard_normal((9, 1)).astype(np.float32)) + 0.1
    den[3, 0] = 0.0                                          # a zero sum: inf / nan, as numpy
    out.append(c.set(c.output(G.F32, 2, 9), c.randn(G.F32, 2, 9), c.put(G.F32, den)))
    return out


def gpt_oss_cases() -> list[Case]:
    """gpt-oss's ops: ADD_ID over the experts' rows (ids cover every expert, one repeated), a strided a; the
    clamped SwiGLU with most values beyond its limit; the attention combine folding the heads' sinks, one
    (token, head) with every split empty (its output is 0 / (0 + e^0) = 0) and a sink above every split's max."""
    out = []
    c = Case("add_id_f32", "experts-n256-k4-T3", F32_ELEM)
    ids = c.ints(np.array([[7, 0, 3, 3], [1, 2, 5, 6], [4, 0, 7, 1]]))
    out.append(c.set(c.output(G.F32, 256, 4, 3), c.randn(G.F32, 256, 4, 3), c.randn(G.F32, 256, 8), ids))
    c = Case("add_id_f32", "strided-a-n96", F32_ELEM)
    ab = c.randn(G.F32, 100, 2, 2)
    out.append(c.set(c.output(G.F32, 96, 2, 2), c.view(ab, (96, 2, 2), (4, ab.nb[1], ab.nb[2])),
                     c.randn(G.F32, 96, 3), c.ints(np.array([[2, 0], [1, 1]]))))
    for tag, n, t in (("rows-2048", 2048, 3), ("odd-1001", 1001, 2)):
        c = Case("glu_swiglu_oai_f32", tag, F32_ELEM)
        out.append(c.set(c.output(G.F32, n, t), c.randn(G.F32, n, t, scale=8), c.randn(G.F32, n, t, scale=8),
                         fp=(7.0, 1.702)))
    c = Case("flash_attn_combine_f32", "Dv64-splits4-H8-T3-sinks", F32_DOT)
    part = c.rng.standard_normal((3, 8, 4, 66)).astype(np.float32)
    part[..., 65] = c.rng.uniform(0.5, 10.0, (3, 8, 4))
    part[1, 2, :, :64], part[1, 2, :, 64], part[1, 2, :, 65] = 0.0, -np.inf, 0.0     # every split empty
    sinks = c.rng.standard_normal(8).astype(np.float32)
    sinks[5] = 6.0                                                                    # above every m
    out.append(c.set(c.output(G.F32, 64, 8, 3), c.put(G.F32, part), c.put(G.F32, sinks)))
    # the experts' biases fused (MUL_MAT_ID + ADD_ID [+ MUL_MAT_ID + ADD_ID + GLU]): F16 experts at one token
    # (F32 x), Q8_0 and MXFP4 ones on Q8_1 x at 3 tokens; SWIGLU_OAI past its limit (gate and up large)
    from quant_cases import qweights
    for w in ("f16", "q8_0", "mxfp4"):
        t = 1 if w == "f16" else 3
        def x_of(c, k=256):
            return c.randn(G.F32, k, 2, t) if w == "f16" else c.q8_1(k, 2, t)
        def experts(c, k=256, m=96):
            return qweights(c, w, k, m, 4) if w == "mxfp4" else c.randn(WT[w], k, m, 4, scale=4)
        c = Case(f"mul_mat_id_vec_{w}", f"bias-E4-T{t}", F32_DOT)
        ids = c.ints(np.array([c.rng.permutation(4)[:2] for _ in range(t)]), (2, t))
        out.append(c.set(c.output(G.F32, 96, 2, t), experts(c), x_of(c), ids, c.randn(G.F32, 96, 4)))
        c = Case(f"mul_mat_id_vec_glu_{w}", f"bias-swiglu-oai-E4-T{t}", 2 * F32_DOT)
        ids = c.ints(np.array([c.rng.permutation(4)[:2] for _ in range(t)]), (2, t))
        gate_b = c.randn(G.F32, 96, 4, scale=4)
        c.set(c.output(G.F32, 96, 2, t), experts(c), experts(c), x_of(c), ids, c.randn(G.F32, 96, 4, scale=4),
              ip=(3, 0, 0))
        c.ip_addr = {1: gate_b}
        out.append(c)
    # gpt-oss-20b's YaRN (factor 32 over 4096 positions, base 150 000: corr dims 8 and 18), NEOX, pairs on
    # either side of the ramp and in it; the K-cache write takes the same fp
    yarn_fp = (150000.0, 1.0 / 32, 1.0, 1.0, 8.0, 18.0)
    c = Case("rope_f32", "yarn-neox-D64", ROPE)
    out.append(c.set(c.output(G.F32, 64, 8, 5), c.randn(G.F32, 64, 8, 5), c.ints(c.rng.integers(0, 100, 5)),
                     ip=(64, NEOX), fp=yarn_fp))
    c = Case("rope_set_rows_f16", "yarn-neox-D64-cache", F16_OUT)
    out.append(c.set(c.output(G.F16, 128, 16), c.randn(G.F32, 64, 2, 3), c.ints([3, 40, 99]), c.ints([5, 0, 11]),
                     ip=(64, NEOX), fp=yarn_fp))
    return out


def op_cases() -> list[Case]:
    return (elementwise_op_cases() + norm_op_cases() + rope_neox_cases() + geglu_mat_vec_cases()
            + flash_attn_256_cases() + norm_scale_swiglu_clamp_cases() + moe_norm_cases() + gpt_oss_cases())

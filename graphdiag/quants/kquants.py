"""ggml's reference K-quant quantisers (quantize_row_q4_K_ref / q5_K_ref / q6_K_ref), vectorised in numpy.

Hand-written because no library has them (gguf 0.19 dequantises K-quants but cannot quantise them). The
arithmetic is ggml's, operation for operation in float32: every product and quotient in the order the C
writes it, nearest_int as round-half-even (what its 1.5 * 2**23 trick computes), and each sum accumulated
left to right (a cumulative sum, never numpy's pairwise reduction), so the bytes equal an x86-64 build of
ggml-quants.c (no FMA contraction there) — tests/unit/test_quants_ggml.py checks them against that C.

Each function takes (n, 256) float32 super-blocks and returns (n, block bytes) uint8; the search loops
(make_qkx2_quants' 16 or 21 candidate scales, make_qx_quants' 18) run over all sub-blocks at once.
"""

from __future__ import annotations

import numpy as np

from .layouts import Q4_K, Q5_K, Q6_K

F = np.float32
GROUP_MAX_EPS = F(1e-15)


def _seqsum(a: np.ndarray) -> np.ndarray:
    """Sum over axis 0 of an (n, m) array, left to right in float32 (C's `s += a[i]`): numpy reduces a
    non-contiguous axis one row after another (its pairwise summation acts only along a contiguous one)."""
    return np.add.reduce(a, axis=0, dtype=F)


def _nearest(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """nearest_int(v) clamped to [lo, hi], as float32."""
    v = np.rint(v)
    return np.clip(v, lo, hi, out=v)


def make_qkx2(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, mad: bool = False):
    """make_qkx2_quants over rows of x (m, n) with weights w: (scale (m,), the_min (m,), L (m, n) float32);
    `mad`: its use_mad (errors weighted by |diff|, as Q2_K asks; squared otherwise).
    Works on the transposed (n, m) arrays: element i of every row is one contiguous vector."""
    x, w = np.ascontiguousarray(x.T), np.ascontiguousarray(w.T)
    err = np.abs if mad else np.square
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mn, mx = np.minimum(x.min(axis=0), F(0)), x.max(axis=0)
        sum_w, sum_x = _seqsum(w), _seqsum(w * x)
        flat = mx == mn
        span = np.where(flat, F(1), mx - mn)
        iscale = F(nmax) / span
        scale = F(1) / iscale
        L = _nearest(iscale * (x - mn), 0, nmax)
        diff = scale * L + mn - x
        best = _seqsum(w * err(diff))
        for step in range(nstep + 1):
            span = np.where(flat, F(1), mx - mn)          # min moves as better fits are found: C reuses it
            iscale = (F(rmin) + F(rdelta) * F(step) + F(nmax)) / span
            lx = _nearest(iscale * (x - mn), 0, nmax)
            wl = w * lx
            sum_l, sum_l2, sum_xl = _seqsum(wl), _seqsum(wl * lx), _seqsum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            d2 = this_scale * lx + this_min - x
            cur = _seqsum(w * err(d2))
            better = (D > 0) & (cur < best) & ~flat
            L = np.where(better, lx, L)
            best = np.where(better, cur, best)
            scale = np.where(better, this_scale, scale)
            mn = np.where(better, this_min, mn)
    L[:, flat] = 0
    return np.where(flat, F(0), scale).astype(F), (-mn).astype(F), np.ascontiguousarray(L.T)


def make_qx(x: np.ndarray, nmax: int):
    """make_qx_quants(rmse_type 1, no importance weights) over rows of x (m, n): (scale (m,), L (m, n)),
    L = l + nmax as float32. Transposed inside as make_qkx2."""
    vmax = signed_absmax(x)
    amax = np.abs(vmax)
    x = np.ascontiguousarray(x.T)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        zero = amax < GROUP_MAX_EPS
        vmax = np.where(zero, F(1), vmax)
        w = x * x
        wx = w * x

        def fit(iscale):
            lx = _nearest(iscale * x, -nmax, nmax - 1)
            return lx, _seqsum(wx * lx), _seqsum((w * lx) * lx)
        lx, sumlx, suml2 = fit(F(-nmax) / vmax)
        L = lx + F(nmax)
        scale = np.where(suml2 != 0, sumlx / suml2, F(0))
        best = scale * sumlx
        for step in (*range(-9, 0), *range(1, 10)):
            lx, sumlx, suml2 = fit(-(F(nmax) + F(0.1) * F(step)) / vmax)
            upd = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(upd, lx + F(nmax), L)
            scale = np.where(upd, sumlx / suml2, scale)
            best = np.where(upd, scale * sumlx, best)
    L[:, zero] = 0
    return np.where(zero, F(0), scale).astype(F), np.ascontiguousarray(L.T)


def signed_absmax(scales: np.ndarray) -> np.ndarray:
    """Per row of (n, m), the entry of largest magnitude with its sign (the first of equal magnitudes, as C's
    strict `>`): a row's max for make_qx / make_q3, the super-block scale the K- and IQ-quantisers divide by."""
    return np.take_along_axis(scales, np.abs(scales).argmax(axis=-1)[:, None], -1)[:, 0]


def _pack_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins (n, 8) -> ggml's 12-byte packing (n, 12) (get_scale_min_k4 inverts it)."""
    hi_s, hi_m = (ls[:, 4:] >> 4) << 6, (lm[:, 4:] >> 4) << 6
    return np.concatenate([ls[:, :4] | hi_s, lm[:, :4] | hi_m, (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)],
                          axis=1).astype(np.uint8)


def _k_scales(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """The shared first half of Q4_K/Q5_K: x (n, 256) -> (d f16 (n,), dmin f16 (n,), scales (n, 12), L (n, 256))."""
    n = len(x)
    xs = x.reshape(n * 8, 32)
    av_x = np.sqrt(_seqsum(np.ascontiguousarray(xs.T) ** 2) / F(32))
    scales, mins, L = make_qkx2(xs, av_x[:, None] + np.abs(xs), nmax, rmin, F(0.1), nstep)
    scales, mins, L = scales.reshape(n, 8), mins.reshape(n, 8), L.reshape(n, 8, 32)
    max_scale = np.maximum(scales.max(axis=1), F(0))
    max_min = np.maximum(mins.max(axis=1), F(0))
    with np.errstate(divide="ignore"):
        inv_s = np.where(max_scale > 0, F(63) / max_scale, F(0)).astype(F)
        inv_m = np.where(max_min > 0, F(63) / max_min, F(0)).astype(F)
    # nearest_int's int stored in a uint8 (modulo 256), then capped at 63
    ls = np.minimum(np.rint(inv_s[:, None] * scales).astype(np.int64) & 0xFF, 63)
    lm = np.minimum(np.rint(inv_m[:, None] * mins).astype(np.int64) & 0xFF, 63)
    d, dmin = (max_scale / F(63)).astype(np.float16), (max_min / F(63)).astype(np.float16)
    dd = d.astype(F)[:, None] * ls.astype(F)                 # (n, 8): the scale each sub-block decodes with
    dm = dmin.astype(F)[:, None] * lm.astype(F)
    with np.errstate(divide="ignore", invalid="ignore"):
        again = _nearest((x.reshape(n, 8, 32) + dm[..., None]) / dd[..., None], 0, nmax)
    L = np.where((dd != 0)[..., None], again, L).reshape(n, 256).astype(np.uint8)
    return d, dmin, _pack_scales(ls, lm), L


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_K_ref on (n, 256) float32 -> (n, 144) uint8."""
    d, dmin, sc, L = _k_scales(x, 15, -1.0, 20)
    out = np.empty(len(x), Q4_K)
    out["d"], out["dmin"], out["scales"] = d, dmin, sc
    q = L.reshape(-1, 4, 2, 32)
    out["qs"] = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    return out.view(np.uint8).reshape(len(x), -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q5_K_ref on (n, 256) float32 -> (n, 176) uint8."""
    d, dmin, sc, L = _k_scales(x, 31, -0.5, 15)
    out = np.empty(len(x), Q5_K)
    out["d"], out["dmin"], out["scales"] = d, dmin, sc
    q = L.reshape(-1, 4, 2, 32)                                # (n, 64-group k, half, j)
    hi = (q >> 4).astype(np.uint8)
    shift = (2 * np.arange(4, dtype=np.uint8))[None, :, None]
    out["qh"] = ((hi[:, :, 0] << shift) | (hi[:, :, 1] << (shift + 1))).sum(axis=1, dtype=np.uint8)
    out["qs"] = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(-1, 128)
    return out.view(np.uint8).reshape(len(x), -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref on (n, 256) float32 -> (n, 210) uint8."""
    n = len(x)
    scales, L = make_qx(x.reshape(n * 16, 16), 32)
    scales, L = scales.reshape(n, 16), L.reshape(n, 16, 16)
    max_scale = signed_absmax(scales)
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F(-128) / np.where(zero, F(1), max_scale)
        d = (F(1) / iscale).astype(np.float16)
        sc = np.minimum(np.rint(iscale[:, None] * scales), 127).astype(np.int8)
        dd = d.astype(F)[:, None] * sc.astype(F)
        again = _nearest(x.reshape(n, 16, 16) / dd[..., None], -32, 31) + F(32)
    L = np.where((dd != 0)[..., None], again, L).reshape(n, 2, 4, 32).astype(np.uint8)
    a, b, c, e = (L[:, :, i] for i in range(4))
    out = np.empty(n, Q6_K)
    out["ql"] = np.concatenate([(a & 0xF) | ((c & 0xF) << 4), (b & 0xF) | ((e & 0xF) << 4)], axis=2).reshape(n, 128)
    out["qh"] = ((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)).reshape(n, 64)
    out["scales"], out["d"] = sc, d
    out[zero] = np.zeros(1, Q6_K)
    return out.view(np.uint8).reshape(n, -1)

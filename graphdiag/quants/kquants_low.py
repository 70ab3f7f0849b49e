"""ggml's reference quantisers of the 2- and 3-bit K-quants (quantize_row_q2_K_ref / q3_K_ref) in numpy.

Same contract as kquants.py (no library has them: gguf 0.19 only dequantises Q2_K and Q3_K): float32
operations in the C's order, sums left to right, and nearest_int as its 1.5 * 2**23 trick computes it (bit
for bit, also for the out-of-range values make_q3_quants' refinement can divide out), so the bytes equal an
x86-64 build of ggml-quants.c; tests/unit/test_quants_ggml.py checks them against that C.

Both work on 16 sub-blocks of 16 per 256-value super-block: Q2_K fits a scale and a min per sub-block
(make_qkx2_quants on |x| weights, absolute errors) and stores them as 4-bit multiples of two f16 super-scales;
Q3_K fits a signed scale per sub-block (make_q3_quants, a coordinate-descent refinement) stored as 6 bits
of one f16 super-scale, its 3-bit quants split into 2 low bits (qs) and a high bit (hmask).
"""

from __future__ import annotations

import numpy as np

from .kquants import GROUP_MAX_EPS, _seqsum, make_qkx2, signed_absmax
from .layouts import Q2_K, Q3_K

F = np.float32
_MAGIC = F(12582912.0)   # 1.5 * 2**23


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: (bits(v + 1.5 * 2**23) & 0x7fffff) - 0x400000, as int64 (round half to even
    inside +-2**22, the C's wrapped value outside it)."""
    bits = (np.asarray(v, F) + _MAGIC).astype(F).view(np.int32).astype(np.int64)
    return (bits & 0x7FFFFF) - 0x400000


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """(n, 256) values 0..3 -> the 64 bytes ggml packs them in: byte 32 h + l holds L[128 h + 32 k + l] at
    bits 2 k (k = 0..3)."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q2_K_ref on (n, 256) float32 -> (n, 84) uint8."""
    n = len(x)
    xs = x.reshape(n * 16, 16)
    scales, mins, L = make_qkx2(xs, np.abs(xs), 3, -0.5, 0.1, 15, mad=True)
    scales, mins, L = scales.reshape(n, 16), mins.reshape(n, 16), L.reshape(n, 16, 16)
    max_scale = np.maximum(scales.max(axis=1), F(0))
    max_min = np.maximum(mins.max(axis=1), F(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = nearest_int(np.where(max_scale > 0, F(15) / max_scale, F(0)).astype(F)[:, None] * scales)
        lm = nearest_int(np.where(max_min > 0, F(15) / max_min, F(0)).astype(F)[:, None] * mins)
    ls = np.where((max_scale > 0)[:, None], ls, 0)
    lm = np.where((max_min > 0)[:, None], lm, 0)
    sc = ((ls & 0xFF) | ((lm << 4) & 0xFF)).astype(np.uint8)          # the C's uint8 stores
    d = np.where(max_scale > 0, max_scale / F(15), F(0)).astype(np.float16)
    dmin = np.where(max_min > 0, max_min / F(15), F(0)).astype(np.float16)
    dl = d.astype(F)[:, None] * (sc & 0xF).astype(F)                 # (n, 16): the scale each decodes with
    ml = dmin.astype(F)[:, None] * (sc >> 4).astype(F)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        again = np.clip(nearest_int((x.reshape(n, 16, 16) + ml[..., None]) / dl[..., None]), 0, 3)
    L = np.where((dl != 0)[..., None], again, L.astype(np.int64))
    out = np.empty(n, Q2_K)
    out["scales"], out["qs"], out["d"], out["dmin"] = sc, _pack_2bit(L.reshape(n, 256)), d, dmin
    return out.view(np.uint8).reshape(n, -1)


def make_q3(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_q3_quants(do_rmse true) over rows of x (m, n): (scale (m,) float32, L (m, n) int64 in 0..2 nmax - 1).
    The refinement visits the elements of a row in order (each step sees the sums the last one left), so it
    runs element by element over all rows at once; a row whose pass changed nothing would change nothing
    again, so every row takes the C's 5 passes."""
    vmax = signed_absmax(x)
    amax = np.abs(vmax)
    zero = amax < GROUP_MAX_EPS
    xt = np.ascontiguousarray(x.T)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F(-nmax) / np.where(zero, F(1), vmax)
        L = np.clip(nearest_int(iscale * xt), -nmax, nmax - 1).astype(F)       # (n, m)
        w = xt * xt
        wx = w * xt
        sumlx, suml2 = _seqsum(wx * L), _seqsum((w * L) * L)
        for _ in range(5):
            for i in range(len(xt)):
                li = L[i]
                slx = sumlx - wx[i] * li
                sl2 = suml2 - (w[i] * li) * li
                new = np.clip(nearest_int((xt[i] * sl2) / slx), -nmax, nmax - 1).astype(F)
                slx_new = slx + wx[i] * new
                sl2_new = sl2 + (w[i] * new) * new
                take = ((slx > 0) & (new != li) & (sl2_new > 0)
                        & ((slx_new * slx_new) * suml2 > (sumlx * sumlx) * sl2_new))
                L[i] = np.where(take, new, li)
                sumlx = np.where(take, slx_new, sumlx)
                suml2 = np.where(take, sl2_new, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, F(0)).astype(F)
    L = L.T.astype(np.int64) + nmax
    L[zero] = 0
    return np.where(zero, F(0), scale), L


def _pack_scales_6bit(l: np.ndarray) -> np.ndarray:
    """16 six-bit scales (n, 16) -> Q3_K's 12 bytes: low nibbles of 0-7 then (in the high nibbles) of 8-15 in
    bytes 0-7; the top 2 bits of scale j in byte 8 + j % 4 at bits 2 (j // 4)."""
    out = np.zeros((len(l), 12), np.int64)
    out[:, :8] = (l[:, :8] & 0xF) | ((l[:, 8:] & 0xF) << 4)
    hi = (l >> 4).reshape(-1, 4, 4)                               # (n, j // 4, j % 4)
    out[:, 8:] = (hi << (2 * np.arange(4))[None, :, None]).sum(axis=1)
    return out.astype(np.uint8)


def scales_6bit(b: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes (..., 12) -> the 16 scales (..., 16) as stored, 0..63 (ggml subtracts 32)."""
    b = b.astype(np.int64)
    lo = np.concatenate([b[..., :8] & 0xF, b[..., :8] >> 4], axis=-1)
    hi = (b[..., None, 8:] >> (2 * np.arange(4))[:, None]) & 3      # (..., j // 4, j % 4)
    return lo | (hi.reshape(*b.shape[:-1], 16) << 4)


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q3_K_ref on (n, 256) float32 -> (n, 110) uint8."""
    n = len(x)
    scales, L = make_q3(x.reshape(n * 16, 16), 4)
    scales, L = scales.reshape(n, 16), L.reshape(n, 16, 16)
    max_scale = signed_absmax(scales)
    some = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F(-32) / np.where(some, max_scale, F(1))
        l8 = ((nearest_int(iscale[:, None] * scales) + 128) & 0xFF) - 128            # the C's int8_t
        sc = _pack_scales_6bit(np.clip(l8, -32, 31) + 32)
        d = (F(1) / iscale).astype(np.float16)
    sc[~some] = 0
    d[~some] = 0
    dl = d.astype(F)[:, None] * (scales_6bit(sc) - 32).astype(F)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        again = np.clip(nearest_int(x.reshape(n, 16, 16) / dl[..., None]), -4, 3) + 4
    L = np.where((dl != 0)[..., None], again, L).reshape(n, 8, 32)
    high = L > 3                                                  # element 32 k + m: bit k of hmask[m]
    out = np.empty(n, Q3_K)
    out["hmask"] = (high.astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    out["qs"] = _pack_2bit(np.where(high, L - 4, L).reshape(n, 256))
    out["scales"], out["d"] = sc, d
    return out.view(np.uint8).reshape(n, -1)

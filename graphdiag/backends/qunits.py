"""numpy twin of kernels/quants.cuh: ggml's Q4_0/Q4_1/Q5_0/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS/MXFP4 blocks
(and BF16 rows) decoded into units of 32 weights, the kernels' dequantisation (bit for bit) and their integer
dots with Q8_1 x. The IQ4 types' quants are their levels (kvalues_iq4nl, signed), not the 4-bit indices, and
MXFP4's its levels (kvalues_mxfp4).

A unit is the 32 consecutive weights of a row that meet one Q8_1 block of x. `decode` gives each unit's
quants as integers (before ggml's offsets) and its float / integer scales; `dequantize` applies the
float32 formulas of quants.cuh in the same order (numpy float32 operations round like the kernel's
explicit _rn operations); `q8_dot` computes the integer dots exactly (float64 holds every sum) and then
the per-unit float32 combination of quants.cuh, summed over units: equal to the kernels within float32
rounding (the kernels' sums run in another order, and the compiler may fuse a multiply-add).
Hand-written, not gguf.quants: the kernels need the integer quants and scales, which gguf does not expose.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..ir.dtypes import GGMLType as G
from ..quants.iquants import KVALUES
from ..quants.mxfp4 import KVALUES as MXFP4_KVALUES, e8m0_half
from ..quants.kquants_low import scales_6bit

F32 = np.float32
# bytes per block, units (of 32 weights) per block
LAYOUT = {G.Q4_0: (18, 1), G.Q5_0: (22, 1), G.Q5_1: (24, 1), G.Q4_K: (144, 8), G.Q5_K: (176, 8),
          G.Q6_K: (210, 8), G.BF16: (64, 1), G.Q2_K: (84, 8), G.Q3_K: (110, 8), G.Q4_1: (20, 1),
          G.IQ4_NL: (18, 1), G.IQ4_XS: (136, 8), G.MXFP4: (17, 1)}
QUANT_TYPES = (G.Q4_0, G.Q5_0, G.Q5_1, G.Q4_K, G.Q5_K, G.Q6_K, G.Q2_K, G.Q3_K, G.Q4_1, G.IQ4_NL, G.IQ4_XS,
               G.MXFP4)
_LEVELS = KVALUES.astype(np.int32)   # IQ4_NL / IQ4_XS: index -> level
_MX_LEVELS = MXFP4_KVALUES.astype(np.int32)   # MXFP4: index -> level
_OFFSET = {G.Q4_0: 8, G.Q5_0: 16, G.Q6_K: 32, G.Q3_K: 4}
_HALVES = (G.Q6_K, G.Q3_K)     # a scale per 16-half of the unit, quants offset: x = d * sc * (q - offset)
_CHUNK = 1 << 24   # float64 elements of one integer-dot temporary


class Units(NamedTuple):
    v: np.ndarray     # int32 (..., nu, 32): quants before the offset
    d: np.ndarray     # float32 (..., nu)
    m: np.ndarray     # float32 (..., nu): Q4_1's and Q5_1's m, the K-quants' dmin (0 otherwise)
    sc0: np.ndarray   # int32 (..., nu): Q4_K/Q5_K's 6-bit scale; Q6_K's / Q3_K's first-half scale (Q3_K's
                      # less 32); Q2_K's first-half byte (scale | min << 4); IQ4_XS's ls - 32
    sc1: np.ndarray   # int32 (..., nu): Q4_K/Q5_K's 6-bit min; the second half's as sc0 for Q6_K, Q3_K, Q2_K


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[..., at:at + 2]).view("<f2")[..., 0].astype(F32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.int32)


def _high_bits(b: np.ndarray, at: int) -> np.ndarray:
    qh = np.ascontiguousarray(b[..., at:at + 4]).view("<u4")[..., 0]
    return ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32)


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all 8 sub-blocks: s (..., 12) uint8 -> (sc, mn) int32 (..., 8)."""
    s = s.astype(np.int32)
    lo_sc, lo_mn = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    hi_mn = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return np.concatenate([lo_sc, hi_sc], -1), np.concatenate([lo_mn, hi_mn], -1)


def _kquant(b: np.ndarray, t: int):
    qs = b[..., 16:144] if t == G.Q4_K else b[..., 48:176]
    pairs = qs.reshape(*qs.shape[:-1], 4, 32).astype(np.int32)              # (..., nsb, 4, 32)
    v = np.stack([pairs & 0xF, pairs >> 4], axis=-2).reshape(*qs.shape[:-1], 8, 32)
    if t == G.Q5_K:
        qh = b[..., 16:48].astype(np.int32)                                  # (..., nsb, 32)
        v = v | (((qh[..., None, :] >> np.arange(8)[:, None]) & 1) << 4)
    sc, mn = _scale_min_k4(b[..., 4:16])
    return v, _f16(b, 0), _f16(b, 2), sc, mn


def _q6k(b: np.ndarray):
    ql, qh = b[..., 0:128].astype(np.int32), b[..., 128:192].astype(np.int32)
    sc = b[..., 192:208].view(np.int8).astype(np.int32)
    units, s0, s1 = [], [], []
    for j in range(8):
        n, g = j >> 2, j & 3
        lo = (ql[..., 64 * n + 32 * (g & 1): 64 * n + 32 * (g & 1) + 32] >> (4 * (g >> 1))) & 0xF
        units.append(lo | (((qh[..., 32 * n: 32 * n + 32] >> (2 * g)) & 3) << 4))
        s0.append(sc[..., 8 * n + 2 * g])
        s1.append(sc[..., 8 * n + 2 * g + 1])
    return np.stack(units, -2), _f16(b, 208), np.zeros(b.shape[:-1], F32), np.stack(s0, -1), np.stack(s1, -1)


def _q23k(b: np.ndarray, t: int):
    """Q2_K / Q3_K: unit u = 32 k + ... of the 128-half h = u >> 2 reads 2 bits of qs[32 h: 32 h + 32] at
    shift 2 (u & 3) and, for Q3_K, bit u of hmask[0:32] (set: no -4); its halves take scales 2 u and 2 u + 1."""
    at = 16 if t == G.Q2_K else 32
    qs = b[..., at:at + 64].reshape(*b.shape[:-1], 2, 1, 32).astype(np.int32)
    v = ((qs >> (2 * np.arange(4))[:, None]) & 3).reshape(*b.shape[:-1], 8, 32)
    if t == G.Q2_K:
        sc = b[..., 0:16].astype(np.int32)
        return v, _f16(b, 80), _f16(b, 82), sc[..., 0::2], sc[..., 1::2]
    hm = b[..., 0:32].astype(np.int32)
    v = v | (((hm[..., None, :] >> np.arange(8)[:, None]) & 1) << 2)
    sc = scales_6bit(b[..., 96:108]).astype(np.int32) - 32
    return v, _f16(b, 108), np.zeros(b.shape[:-1], F32), sc[..., 0::2], sc[..., 1::2]


def _iq4xs(b: np.ndarray):
    """IQ4_XS super-blocks -> (levels (..., 8, 32), 6-bit scales ls (..., 8))."""
    qs = b[..., 8:136].reshape(*b.shape[:-1], 8, 16)
    sh = np.ascontiguousarray(b[..., 2:4]).view("<u2")[..., 0].astype(np.int32)
    sl = b[..., 4:8].astype(np.int32)
    j = np.arange(8)
    ls = ((sl[..., j // 2] >> (4 * (j % 2))) & 0xF) | (((sh[..., None] >> (2 * j)) & 3) << 4)
    return _LEVELS[_nibbles(qs)], ls


def decode(raw: np.ndarray, t: int) -> Units:
    """raw (..., row bytes) uint8 rows of type t (quantized) -> their units."""
    size, upb = LAYOUT[G(t)]
    b = raw.reshape(*raw.shape[:-1], raw.shape[-1] // size, size)
    zero = np.zeros(b.shape[:-1], np.int32)
    if t == G.Q4_0:
        return Units(_nibbles(b[..., 2:18]), _f16(b, 0), zero.astype(F32), zero, zero)
    if t == G.Q5_0:
        return Units(_nibbles(b[..., 6:22]) | (_high_bits(b, 2) << 4), _f16(b, 0), zero.astype(F32), zero, zero)
    if t == G.Q5_1:
        return Units(_nibbles(b[..., 8:24]) | (_high_bits(b, 4) << 4), _f16(b, 0), _f16(b, 2), zero, zero)
    if t == G.Q4_1:
        return Units(_nibbles(b[..., 4:20]), _f16(b, 0), _f16(b, 2), zero, zero)
    if t == G.IQ4_NL:
        return Units(_LEVELS[_nibbles(b[..., 2:18])], _f16(b, 0), zero.astype(F32), zero, zero)
    if t == G.MXFP4:
        return Units(_MX_LEVELS[_nibbles(b[..., 1:17])], e8m0_half(b[..., 0]), zero.astype(F32), zero, zero)
    lead = b.shape[:-2]
    nu = b.shape[-2] * upb
    if t in (G.Q4_K, G.Q5_K):
        v, d, dmin, sc, mn = _kquant(b, t)
        rep = lambda a: np.repeat(a[..., None], 8, -1).reshape(*lead, nu)
        return Units(v.reshape(*lead, nu, 32), rep(d), rep(dmin), sc.reshape(*lead, nu), mn.reshape(*lead, nu))
    if t == G.IQ4_XS:
        v, ls = _iq4xs(b)
        return Units(v.reshape(*lead, nu, 32), np.repeat(_f16(b, 0)[..., None], 8, -1).reshape(*lead, nu),
                     np.zeros((*lead, nu), F32), ls.reshape(*lead, nu) - 32, np.zeros((*lead, nu), np.int32))
    if t in (G.Q6_K, G.Q2_K, G.Q3_K):
        v, d, m, s0, s1 = _q6k(b) if t == G.Q6_K else _q23k(b, t)
        rep = lambda a: np.repeat(a[..., None], 8, -1).reshape(*lead, nu)
        return Units(v.reshape(*lead, nu, 32), rep(d), rep(m), s0.reshape(*lead, nu), s1.reshape(*lead, nu))
    raise ValueError(f"no unit decoding for {G(t).name}")


def dequantize(raw: np.ndarray, t: int) -> np.ndarray:
    """raw (..., row bytes) rows of type t -> float32 (..., K), as quants.cuh unit_f32 computes them."""
    if t == G.BF16:
        return (np.ascontiguousarray(raw).view("<u2").astype(np.uint32) << 16).view(F32)
    u = decode(raw, t)
    q = (u.v - _OFFSET.get(G(t), 0)).astype(F32)
    d = u.d[..., None]
    if t in (G.Q5_1, G.Q4_1):
        y = d * q + u.m[..., None]
    elif t == G.IQ4_XS:
        y = (u.d * u.sc0.astype(F32))[..., None] * q
    elif t in (G.Q4_K, G.Q5_K):
        y = (d * u.sc0.astype(F32)[..., None]) * q - (u.m * u.sc1.astype(F32))[..., None]
    elif t in _HALVES:
        a = np.stack([u.d * u.sc0.astype(F32), u.d * u.sc1.astype(F32)], -1)   # (..., nu, 2)
        y = np.repeat(a, 16, -1) * q
    elif t == G.Q2_K:
        sc = np.stack([u.sc0, u.sc1], -1)                                       # (..., nu, 2)
        a = u.d[..., None] * (sc & 0xF).astype(F32)
        c = u.m[..., None] * (sc >> 4).astype(F32)
        y = np.repeat(a, 16, -1) * q - np.repeat(c, 16, -1)
    else:
        y = d * q
    return y.reshape(*y.shape[:-2], -1)


def _int_dots(v: np.ndarray, qx: np.ndarray) -> np.ndarray:
    """Exact sum_i v[m, u, i] * qx[n, u, i]: v (M, nu, L), qx (N, nu, L) -> float64 (nu, N, M)."""
    return np.matmul(qx.transpose(1, 0, 2).astype(np.float64), v.transpose(1, 2, 0).astype(np.float64))


def _combine(t: int, u: Units, xq: np.ndarray) -> np.ndarray:
    """One weight matrix's units (M, nu) against Q8_1 rows xq (N, nu) -> float32 (N, M)."""
    qx = xq["qs"].astype(np.int32)
    d8 = xq["d"].astype(F32).T[:, :, None]                      # (nu, N, 1)
    s8 = xq["s"].astype(F32).T[:, :, None]
    d, m = u.d.T[:, None, :], u.m.T[:, None, :]                 # (nu, 1, M)
    if t in _HALVES or t == G.Q2_K:
        sx = [qx[..., h * 16:(h + 1) * 16].sum(-1).T[:, :, None] for h in (0, 1)]
        dots = [_int_dots(u.v[..., h * 16:(h + 1) * 16], qx[..., h * 16:(h + 1) * 16]) for h in (0, 1)]
        s0, s1 = u.sc0.T[:, None, :], u.sc1.T[:, None, :]
        if t == G.Q2_K:
            isum = (s0 & 0xF) * dots[0] + (s1 & 0xF) * dots[1]
            msum = (s0 >> 4) * sx[0] + (s1 >> 4) * sx[1]
            per = d8 * (d * isum.astype(F32) - m * msum.astype(F32))
        else:
            off = _OFFSET[G(t)]
            isum = s0 * (dots[0] - off * sx[0]) + s1 * (dots[1] - off * sx[1])
            per = d * d8 * isum.astype(F32)
    else:
        idot = _int_dots(u.v, qx)
        dot = idot.astype(F32)
        if t == G.Q4_0:
            per = d * (dot * d8 - F32(8) * s8)
        elif t == G.Q5_0:
            per = d * (dot * d8 - F32(16) * s8)
        elif t in (G.Q5_1, G.Q4_1):
            per = d * d8 * dot + m * s8
        elif t in (G.IQ4_NL, G.MXFP4):
            per = d * d8 * dot
        elif t == G.IQ4_XS:
            per = d * d8 * (idot * u.sc0.T[:, None, :]).astype(F32)   # the integer sum times ls - 32, exact
        else:
            sx = qx.sum(-1).T[:, :, None]
            per = d8 * (d * (dot * u.sc0.T[:, None, :]) - m * (sx * u.sc1.T[:, None, :]).astype(F32))
    return per.sum(axis=0, dtype=F32)


def _unit_range(u: Units, units: slice) -> Units:
    return Units(u.v[..., units, :], u.d[..., units], u.m[..., units], u.sc0[..., units], u.sc1[..., units])


def q8_dot(raw: np.ndarray, t: int, xq: np.ndarray, units: slice = slice(None)) -> np.ndarray:
    """dst[b3, b2, n, m] = W[m] . x[n] as the MMVQ kernels compute it. raw: (W3, W2, M, row bytes) rows of
    quantized type t, broadcast over x's batch dims by division; xq: (B3, B2, N, nu) Q8_1 records; `units`:
    the units of the row summed (a k part of a split mat-mul; all by default)."""
    xq = xq[..., units]
    b3n, b2n, n, nu = xq.shape
    m = raw.shape[2]
    out = np.zeros((b3n, b2n, n, m), F32)
    step = max(1, _CHUNK // max(nu * 32 * max(n, 1), 1))
    for b3 in range(b3n):
        for b2 in range(b2n):
            wb = raw[b3 // (b3n // raw.shape[0]), b2 // (b2n // raw.shape[1])]
            for m0 in range(0, m, step):
                u = _unit_range(decode(wb[m0:m0 + step], t), units)
                out[b3, b2, :, m0:m0 + step] = _combine(t, u, xq[b3, b2])
    return out

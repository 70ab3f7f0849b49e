"""ggml's 4-bit non-linear quantisers (IQ4_NL, IQ4_XS) without an importance matrix, vectorised in numpy.

What llama-quantize writes without --imatrix: ggml_quantize_chunk calls quantize_iq4_nl / quantize_iq4_xs
with no weights, both over quantize_row_iq4_nl_impl with 7 extra tries of the scale (ntry = 7). (ggml's
quantize_row_iq4_nl_ref passes ntry = -1 instead — no tries, and a block under GROUP_MAX_EPS keeps the
previous block's quants — so it is not what a file holds; IQ4_XS's _ref is quantize_iq4_xs.) gguf 0.19
dequantises both types but cannot quantise them.

The arithmetic is ggml's in float32, as kquants.py does it: products in the C's order, every sum left to
right, nearest_int as round-half-even, best_index_int8's binary search as a sorted search with its tie rule;
tests/unit/test_quants_ggml.py checks the bytes against ggml-quants.c of llama.cpp 0c1e57098.

Each function takes (n, block) float32 blocks and returns (n, block bytes) uint8.
"""

from __future__ import annotations

import numpy as np

from .kquants import GROUP_MAX_EPS, _nearest, _seqsum, signed_absmax
from .layouts import IQ4_NL, IQ4_XS

F = np.float32
# ggml-common.h kvalues_iq4nl: the 16 levels a 4-bit index selects
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
_KV = KVALUES.astype(F)
NTRY = 7          # quantize_iq4_nl / quantize_iq4_xs: scales tried either side of -max / 127


# best_index_int8(16, kvalues_iq4nl, x) picks the upper level when x - lo >= hi - x in float32. Both
# differences are exact wherever x is near a midpoint (|x| >= 4.5 there and each difference under 2^(e+1), e
# x's binade), so the choice is x >= (lo + hi) / 2 exactly; elsewhere rounding cannot flip it. The midpoints
# are multiples of 1/2, so floor(2x) selects the answer from a table: index k holds the count of midpoints
# <= (k - 256) / 2.
_MIDS = (_KV[:-1] + _KV[1:]) / 2
_BY_HALF = np.searchsorted(_MIDS, (np.arange(512) - 256) / 2, side="right").astype(np.uint8)


def best_index(x: np.ndarray) -> np.ndarray:
    """best_index_int8(16, kvalues_iq4nl, x) elementwise: the nearest level's index, a tie going up; x at or
    beyond either end -> that end, NaN -> 15 as ggml's search ends (uint8)."""
    k = np.fmin(np.floor(x * F(2)), F(255))          # fmin: NaN -> 255
    np.maximum(k, F(-256), out=k)
    return _BY_HALF[k.astype(np.int32) + 256]


def _sums(x: np.ndarray, w: np.ndarray, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sumqx, sumq2) of the levels nearest inv * x: sum w*q*x and w*q*q, left to right over axis 0."""
    q = _KV[best_index(inv * x)]
    wq = w * q
    return _seqsum(wq * x), _seqsum(wq * q)


def block_scales(blocks: np.ndarray) -> np.ndarray:
    """The fitted scale of each 32-block (quantize_row_iq4_nl_impl's first loop, weights x^2, NTRY tries):
    (m, 32) float32 -> (m,) float32, 0 for a block whose max |x| is under GROUP_MAX_EPS."""
    x = np.ascontiguousarray(blocks.T)                 # (32, m): element j of every block is one vector
    w = x * x
    j = np.abs(x).argmax(axis=0)                       # C keeps the first largest |x| (a strict >)
    mx = x[j, np.arange(x.shape[1])]
    small = np.abs(mx) < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = -mx / _KV[0]
        sumqx, sumq2 = _sums(x, w, F(1) / d)
        d = np.where(sumq2 > 0, sumqx / sumq2, F(0))
        best = d * sumqx
        for itry in range(-NTRY, NTRY + 1):
            sumqx, sumq2 = _sums(x, w, F(itry + int(KVALUES[0])) / mx)
            better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            nd = sumqx / sumq2
            d = np.where(better, nd, d)
            best = np.where(better, nd * sumqx, best)
    return np.where(small, F(0), d).astype(F)


def _pack(L: np.ndarray) -> np.ndarray:
    """Level indices (n, 32 * k) -> nibble bytes (n, 16 * k): byte j of a 32-block holds j and j + 16."""
    L = L.reshape(L.shape[0], -1, 2, 16)
    return (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(L.shape[0], -1).astype(np.uint8)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F(1) / d, F(0)).astype(F)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """(n, 32) float32 -> (n, 18) uint8: d = the fitted scale (f16), quants re-picked against it in float32."""
    d = block_scales(x)
    out = np.empty(len(x), IQ4_NL)
    out["d"] = d.astype(np.float16)
    out["qs_nl"] = _pack(best_index(_inverse(d)[:, None] * x))
    return out.view(np.uint8).reshape(len(x), -1)


def quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 136) uint8: 8 sub-block scales as 6-bit multiples l - 32 of d = -max / 32 (the
    sub-block scale of largest magnitude), quants re-picked against d * l."""
    n = len(x)
    sub = x.reshape(n * 8, 32)
    scales = block_scales(sub).reshape(n, 8)
    max_scale = signed_absmax(scales)
    d = -max_scale / F(32)
    lv = _nearest(_inverse(d)[:, None] * scales, -32, 31)           # (n, 8) float32 integers
    dl = (d[:, None] * lv).reshape(-1)
    L = best_index(_inverse(dl)[:, None] * sub).reshape(n, 256)
    ls = (lv + 32).astype(np.uint16)
    out = np.empty(n, IQ4_XS)
    out["d"] = d.astype(np.float16)
    out["scales_h"] = ((ls >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
    lo = (ls & 0xF).astype(np.uint8)
    out["scales_l"] = lo[:, 0::2] | (lo[:, 1::2] << 4)
    out["qs"] = _pack(L)
    return out.view(np.uint8).reshape(n, -1)

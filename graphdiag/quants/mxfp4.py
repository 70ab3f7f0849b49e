"""MXFP4 (ggml type 39, gpt-oss's expert weights): blocks of 32, one E8M0 scale byte and 16 bytes of E2M1 nibbles.

ggml's block_mxfp4: `e` (an E8M0 exponent) then `qs` (element j in the low nibble of byte j, element j + 16 in
its high nibble); a nibble indexes kvalues_mxfp4 (the E2M1 values doubled: 0, 1, 2, 3, 4, 6, 8, 12 and their
negatives, index 8 being -0 stored as 0) and x = kvalues[q] * 2^(e - 128) (ggml_e8m0_to_fp32_half: half the
E8M0 value, to undo the doubling; e < 2 as subnormal float32 bits).

quantize_row_mxfp4_ref, what llama-quantize writes (quantize_mxfp4 ignores an importance matrix): e =
floor(log2f(amax)) - 2 + 127 (0 for an all-zero block), then each element's nearest level by |kvalues[i] * d -
x| in float32, the first index on a tie (best_index_mxfp4's strict <), so a midpoint goes to the level of
smaller magnitude listed first (0 before -0.5 d's -1, 1 before 1.5 d's 2 ...). log2f is taken as the
float64 log2 rounded to float32 (glibc's log2f is correctly rounded), which decides e where a block's maximum
sits just below a power of two. tests/unit/test_quants_ggml.py checks the bytes against ggml-quants.c (its
inputs and MXFP4 edge blocks: maxima one ulp below powers of two, level midpoints; gguf 0.19's quantiser, on
numpy's float32 log2, gives the same bytes there), tests/unit/test_mxfp4.py the values against gguf's
dequantiser for every exponent and nibble.
"""

from __future__ import annotations

import numpy as np

from .layouts import MXFP4

F = np.float32
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)   # ggml-common.h kvalues_mxfp4
_KV = KVALUES.astype(F)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2^(e - 128) as float32 (e < 2: the subnormals 2^-128, 2^-127)."""
    e = np.asarray(e, np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
    return bits.view(F)


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """(n, 32) float32 -> (n, 17) uint8: quantize_row_mxfp4_ref's bytes."""
    n = len(x)
    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore"):
        lg = np.log2(amax.astype(np.float64)).astype(F)         # log2f, correctly rounded
    e = np.where(amax > 0, np.floor(lg) - F(2) + F(127), F(0)).astype(np.uint8)
    d = e8m0_half(e)
    err = np.abs(_KV[None, None, :] * d[:, None, None] - x[:, :, None])    # (n, 32, 16) float32
    q = np.argmin(err, axis=-1).astype(np.uint8)                            # first minimum: ggml's strict <
    out = np.empty(n, MXFP4)
    out["e"] = e
    out["qs"] = q[:, :16] | (q[:, 16:] << np.uint8(4))
    return out.view(np.uint8).reshape(n, -1)


def dequantize_mxfp4(raw: np.ndarray) -> np.ndarray:
    """(n, 17) uint8 -> (n, 32) float32: dequantize_row_mxfp4's values."""
    b = np.ascontiguousarray(raw).reshape(-1).view(MXFP4)
    d = e8m0_half(b["e"])[:, None]
    with np.errstate(over="ignore"):              # e 255: 12 * 2^127 is inf, as in ggml
        return np.concatenate([_KV[b["qs"] & 0x0F], _KV[b["qs"] >> 4]], axis=-1) * d

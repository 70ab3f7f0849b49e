"""ggml's block layouts (ggml-common.h) as numpy structured dtypes, one record per block.

A quantised tensor of ggml ne = (ne0, ne1, ...) is held as a numpy array of records, axes outermost first:
shape (..., ne1, ne0 // block_size). The field order and sizes are ggml's, so a contiguous array's bytes
are the bytes ggml stores (checked against dtypes.type_size in the tests). Plain types are numpy scalars
(F32, F16), except BF16, which numpy lacks: one record holding the 16 raw bits, so every non-float32/16
array is a record array and `a.dtype.names` says "decode me first".
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import Q8_0_BLOCK, GGMLType

G = GGMLType

BF16 = np.dtype([("bits", "<u2")])                                          # the top half of an f32
Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])                        # x = d * (q - 8)
Q5_0 = np.dtype([("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))])    # x = d * (q - 16), 5th bit in qh
Q5_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))])   # x = d * q + m
Q8_1 = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))])          # s = d * sum(q)
Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])          # x = d * q + m
# IQ4_NL: x = d * kvalues_iq4nl[q]. Byte for byte Q4_0's layout, so its quants field has its own name: a
# dtype names exactly one type (type_of).
IQ4_NL = np.dtype([("d", "<f2"), ("qs_nl", "u1", (16,))])
# K-quants: super-blocks of 256. Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scale and min packed in 12 bytes,
# x = d * sc * q - dmin * m; Q6_K: 16 sub-blocks of 16 with int8 scales, x = d * sc * (q - 32).
Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)), ("qs", "u1", (128,))])
Q6_K = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])
Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))])
# IQ4_XS: 8 sub-blocks of 32, x = d * (ls - 32) * kvalues_iq4nl[q], ls 6 bits: low 4 in scales_l (two a
# byte), high 2 in scales_h (bits 2j, 2j + 1 for sub-block j).
IQ4_XS = np.dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", (4,)), ("qs", "u1", (128,))])
# Q2_K: 16 sub-blocks of 16, x = d * (sc & 15) * q - dmin * (sc >> 4), q 2-bit; Q3_K: 16 sub-blocks of 16,
# x = d * (sc - 32) * (q - 4), q's low 2 bits in qs and its third in hmask, sc 6-bit packed in 12 bytes.
Q2_K = np.dtype([("scales", "u1", (16,)), ("qs", "u1", (64,)), ("d", "<f2"), ("dmin", "<f2")])
Q3_K = np.dtype([("hmask", "u1", (32,)), ("qs", "u1", (64,)), ("scales", "u1", (12,)), ("d", "<f2")])
# MXFP4: x = kvalues_mxfp4[q] * 2^(e - 128), e an E8M0 exponent (quants/mxfp4.py)
MXFP4 = np.dtype([("e", "u1"), ("qs", "u1", (16,))])

# GGMLType -> numpy dtype of one stored element (plain types) or one block (block types).
BLOCK_DTYPE: dict[GGMLType, np.dtype] = {
    G.F32: np.dtype(np.float32), G.F16: np.dtype(np.float16), G.BF16: BF16,
    G.Q4_0: Q4_0, G.Q5_0: Q5_0, G.Q5_1: Q5_1, G.Q8_0: Q8_0_BLOCK, G.Q8_1: Q8_1,
    G.Q4_K: Q4_K, G.Q5_K: Q5_K, G.Q6_K: Q6_K, G.Q8_K: Q8_K, G.Q2_K: Q2_K, G.Q3_K: Q3_K,
    G.Q4_1: Q4_1, G.IQ4_NL: IQ4_NL, G.IQ4_XS: IQ4_XS, G.MXFP4: MXFP4,
}

_BY_DTYPE = {dt: t for t, dt in BLOCK_DTYPE.items()}


def type_of(a: np.ndarray) -> GGMLType:
    """The GGMLType whose layout `a`'s dtype is (each layout is distinct); ValueError for another dtype."""
    t = _BY_DTYPE.get(a.dtype)
    if t is None:
        raise ValueError(f"dtype {a.dtype} is no ggml layout graphdiag knows")
    return t

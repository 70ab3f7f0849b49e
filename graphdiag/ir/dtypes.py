"""Tensor element types, with ggml's enum values and block layouts."""

from __future__ import annotations

import enum

import numpy as np


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ4_NL = 20
    IQ4_XS = 23
    I32 = 26
    BF16 = 30
    MXFP4 = 39


QK8_0 = 32
# Q8_0 block: one f16 scale then 32 int8 quants (34 bytes), as in ggml's block_q8_0.
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (QK8_0,))])

QK_K = 256   # super-block of the K-quants
# ggml's block sizes (elements) and block byte sizes (ggml-common.h): Q4_0 = f16 d + 16 nibble bytes; Q5_0 =
# f16 d + 4 bytes of high bits + 16 nibble bytes; Q5_1 = Q5_0 with an f16 min m after d; Q8_1 = f16 d, f16 d*sum + 32 int8; Q4_K = f16 d, f16 dmin,
# 12 bytes of 6-bit scales/mins + 128 nibble bytes; Q5_K = Q4_K + 32 bytes of high bits; Q6_K = 128 low-nibble
# bytes + 64 high-bit bytes + 16 int8 scales + f16 d; Q8_K = f32 d + 256 int8 + 16 int16 block sums.
# Q4_1 = f16 d, f16 min m + 16 nibble bytes; IQ4_NL = f16 d + 16 nibble bytes (indices into kvalues_iq4nl);
# IQ4_XS = f16 d, u16 scales_h, 4 bytes scales_l (8 6-bit sub-block scales) + 128 nibble bytes.
# Q2_K = 16 bytes of 4-bit scale | 4-bit min + 64 bytes of 2-bit quants + f16 d, f16 dmin; Q3_K = 32 bytes of high
# bits + 64 bytes of 2-bit low quants + 12 bytes of 6-bit scales + f16 d.
# MXFP4 = one E8M0 exponent byte + 16 bytes of E2M1 nibbles (quants/mxfp4.py).
_BLOCK = {GGMLType.F32: 1, GGMLType.F16: 1, GGMLType.BF16: 1, GGMLType.I32: 1,
          GGMLType.Q4_0: 32, GGMLType.Q5_0: 32, GGMLType.Q5_1: 32, GGMLType.Q8_0: QK8_0, GGMLType.Q8_1: 32,
          GGMLType.Q4_K: QK_K, GGMLType.Q5_K: QK_K, GGMLType.Q6_K: QK_K, GGMLType.Q8_K: QK_K,
          GGMLType.Q2_K: QK_K, GGMLType.Q3_K: QK_K}
_BLOCK.update({GGMLType.Q4_1: 32, GGMLType.IQ4_NL: 32, GGMLType.IQ4_XS: QK_K, GGMLType.MXFP4: 32})
_SIZE = {GGMLType.F32: 4, GGMLType.F16: 2, GGMLType.BF16: 2, GGMLType.I32: 4,
         GGMLType.Q4_0: 18, GGMLType.Q5_0: 22, GGMLType.Q5_1: 24, GGMLType.Q8_0: Q8_0_BLOCK.itemsize, GGMLType.Q8_1: 36,
         GGMLType.Q4_K: 144, GGMLType.Q5_K: 176, GGMLType.Q6_K: 210, GGMLType.Q8_K: 292,
         GGMLType.Q2_K: 84, GGMLType.Q3_K: 110}
_SIZE.update({GGMLType.Q4_1: 20, GGMLType.IQ4_NL: 18, GGMLType.IQ4_XS: 136, GGMLType.MXFP4: 17})
NUMPY = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32}


def block_size(t: int) -> int:
    """Elements per block (1 for plain types)."""
    n = _BLOCK.get(t)        # IntEnum keys: an int finds its member's entry (no enum call)
    return n if n is not None else _BLOCK[GGMLType(t)]


def type_size(t: int) -> int:
    """Bytes per block."""
    n = _SIZE.get(t)
    return n if n is not None else _SIZE[GGMLType(t)]


def row_size(t: int, ne0: int) -> int:
    """Bytes of one row of ne0 elements."""
    bs = block_size(t)
    if ne0 % bs:
        raise ValueError(f"row of {ne0} elements is not a multiple of the {GGMLType(t).name} block ({bs})")
    return type_size(t) * ne0 // bs


def is_quantized(t: int) -> bool:
    """A block type (ggml_is_quantized): every type whose block holds more than one element."""
    return block_size(t) > 1

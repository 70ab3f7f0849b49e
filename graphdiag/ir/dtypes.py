"""Tensor element types, with ggml's enum values and block layouts."""

from __future__ import annotations

import enum

import numpy as np


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q8_0 = 8
    I32 = 26


QK8_0 = 32
# Q8_0 block: one f16 scale then 32 int8 quants (34 bytes), as in ggml's block_q8_0.
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (QK8_0,))])

_BLOCK = {GGMLType.F32: 1, GGMLType.F16: 1, GGMLType.Q8_0: QK8_0, GGMLType.I32: 1}
_SIZE = {GGMLType.F32: 4, GGMLType.F16: 2, GGMLType.Q8_0: Q8_0_BLOCK.itemsize, GGMLType.I32: 4}
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
    return GGMLType(t) == GGMLType.Q8_0

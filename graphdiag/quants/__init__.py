"""ggml's weight types on the host: block layouts, quantisers and dequantisers in numpy.

    from graphdiag.quants import quantize, dequantize, BLOCK_DTYPE

`quantize(x, t)`: float32 (..., n) -> stored array of type t: (..., n // block) records of BLOCK_DTYPE[t]
(F32/F16: (..., n) floats), the bytes ggml's reference quantiser (quantize_row_*_ref, what llama-quantize uses
without an importance matrix) writes. `dequantize(a, t=None)`: stored array -> float32 (..., n), the values
ggml's dequantize_row_* gives (t defaults to the type a's dtype is). Both take any leading shape.
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import GGMLType, block_size
from ..parallel import over_spans
from .codecs import CHUNK_ELEMENTS, dequantize_bytes, quantize_bytes
from .layouts import BLOCK_DTYPE, type_of

__all__ = ["BLOCK_DTYPE", "QUANT_TYPES", "dequantize", "q8_1_activations", "quantize", "type_of"]

G = GGMLType
# Types both directions work for (Q8_K is a layout only: ggml uses it for activations on the CPU).
QUANT_TYPES = (G.F32, G.F16, G.BF16, G.Q4_0, G.Q5_0, G.Q5_1, G.Q8_0, G.Q8_1, G.Q4_K, G.Q5_K, G.Q6_K,
               G.Q2_K, G.Q3_K, G.Q4_1, G.IQ4_NL, G.IQ4_XS, G.MXFP4)

# Weight types whose CUDA products (ggml's MMVQ mat-vec, MMQ mat-mul) run on Q8_1-quantised activations.
Q8_1_ACTIVATION_TYPES = (G.Q4_0, G.Q5_0, G.Q5_1, G.Q8_0, G.Q4_K, G.Q5_K, G.Q6_K, G.Q2_K, G.Q3_K,
                         G.Q4_1, G.IQ4_NL, G.IQ4_XS, G.MXFP4)


def q8_1_activations(t) -> bool:
    """Whether a GPU mat-mul against a weight of type `t` first rounds its activations to Q8_1."""
    return int(t) in Q8_1_ACTIVATION_TYPES


def _check(t) -> GGMLType:
    t = GGMLType(int(t))
    if t not in QUANT_TYPES:
        raise ValueError(f"{t.name}: graphdiag has no numpy codec for it "
                         f"(it has {', '.join(q.name for q in QUANT_TYPES)})")
    return t


def quantize(x: np.ndarray, t) -> np.ndarray:
    """float32 (..., n) -> the stored array of type `t` (n a multiple of its block size)."""
    t = _check(t)
    x = np.ascontiguousarray(x, np.float32)
    if t == G.F32:
        return x.copy()
    if t == G.F16:   # a cast per span over the host's cores (round to nearest even, as any split)
        out = np.empty(x.shape, np.float16)
        src, dst = x.reshape(-1), out.reshape(-1)

        def cast(a: int, b: int) -> None:
            dst[a:b] = src[a:b]
        over_spans(src.size, CHUNK_ELEMENTS, cast)
        return out
    bs = block_size(t)
    if x.ndim == 0 or x.shape[-1] % bs:
        raise ValueError(f"{t.name} needs rows that are a multiple of {bs} elements, got shape {x.shape}")
    raw = quantize_bytes(x.reshape(-1, bs), t)                     # (n_blocks, block bytes) uint8
    return raw.view(BLOCK_DTYPE[t]).reshape(*x.shape[:-1], x.shape[-1] // bs)


def dequantize(a: np.ndarray, t=None) -> np.ndarray:
    """A stored array (records, or F32/F16 floats) -> float32 (..., n); a new array (never a view)."""
    t = type_of(a) if t is None else _check(t)
    if a.dtype != BLOCK_DTYPE[t]:
        raise ValueError(f"a {a.dtype} array is not {t.name} data ({BLOCK_DTYPE[t]})")
    if t in (G.F32, G.F16):
        return a.astype(np.float32)
    bs = block_size(t)
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(-1, a.dtype.itemsize)
    out = dequantize_bytes(flat, t)
    return out.reshape(*a.shape[:-1], a.shape[-1] * bs) if a.ndim else out.reshape(bs)

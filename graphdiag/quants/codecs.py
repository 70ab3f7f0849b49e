"""Byte-level codecs: (n_blocks, block) float32 <-> (n_blocks, block bytes) uint8, one table row per type.

Where the `gguf` package (pinned) has a codec it is used: its dequantisers for every type here but Q8_1, its
quantisers for BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0. Each is checked bit for bit against ggml's own C
(quantize_row_*_ref / dequantize_row_* of llama.cpp 0c1e57098, compiled from the vendored source) by
tests/unit/test_quants_ggml.py over tests/data/quants_ggml.npz. The K-quant and IQ4 quantisers, which gguf
lacks, are graphdiag's (kquants.py, kquants_low.py, iquants.py), as is MXFP4's codec (mxfp4.py: gguf's
quantiser takes numpy's float32 log2); Q8_1 is a few lines here.

Work goes in chunks of blocks (bounded temporaries, and gguf's row grouping never loops per block), spread
over the host's cores: numpy releases the GIL inside each operation, so threads overlap the arithmetic.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir.dtypes import GGMLType, block_size, type_size
from ..parallel import over_spans
from . import iquants, kquants, kquants_low, mxfp4

G = GGMLType
CHUNK_ELEMENTS = 1 << 18        # elements per chunk of work (a few MB of float32 temporaries per thread)


def _gguf_type(t: GGMLType):
    from gguf import GGMLQuantizationType
    return GGMLQuantizationType(int(t))


def _gguf_quantize(blocks: np.ndarray, t: GGMLType) -> np.ndarray:
    from gguf import quants
    return quants.quantize(blocks.reshape(1, -1), _gguf_type(t)).reshape(blocks.shape[0], type_size(t))


def _gguf_dequantize(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    from gguf import quants
    return quants.dequantize(raw.reshape(1, -1), _gguf_type(t)).reshape(raw.shape[0], block_size(t))


def _round_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero."""
    return np.copysign(np.floor(np.abs(x) + np.float32(0.5)), x)


def _quantize_q8_1(blocks: np.ndarray) -> np.ndarray:
    """quantize_row_q8_1_ref: d = amax/127 (f16), q = roundf(x/d), s = f16(sum(q) * d) with d the f32 scale."""
    d = np.abs(blocks).max(axis=-1) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = _round_away(blocks * inv[:, None]).astype(np.int8)
    out = np.empty(len(blocks), _q8_1_dtype())
    out["d"] = d.astype(np.float16)
    out["s"] = (q.astype(np.int32).sum(axis=-1).astype(np.float32) * d).astype(np.float16)
    out["qs"] = q
    return out.view(np.uint8).reshape(len(blocks), -1)


def _dequantize_q8_1(raw: np.ndarray) -> np.ndarray:
    b = raw.reshape(-1).view(_q8_1_dtype())
    return b["d"].astype(np.float32)[:, None] * b["qs"].astype(np.float32)


def _q8_1_dtype():
    from .layouts import Q8_1
    return Q8_1


QUANTIZERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    G.BF16: lambda b: _gguf_quantize(b, G.BF16), G.Q4_0: lambda b: _gguf_quantize(b, G.Q4_0),
    G.Q5_0: lambda b: _gguf_quantize(b, G.Q5_0), G.Q5_1: lambda b: _gguf_quantize(b, G.Q5_1),
    G.Q8_0: lambda b: _gguf_quantize(b, G.Q8_0), G.Q8_1: _quantize_q8_1,
    G.Q4_K: kquants.quantize_q4_k, G.Q5_K: kquants.quantize_q5_k, G.Q6_K: kquants.quantize_q6_k,
    G.Q2_K: kquants_low.quantize_q2_k, G.Q3_K: kquants_low.quantize_q3_k,
    G.Q4_1: lambda b: _gguf_quantize(b, G.Q4_1),
    G.IQ4_NL: iquants.quantize_iq4_nl, G.IQ4_XS: iquants.quantize_iq4_xs, G.MXFP4: mxfp4.quantize_mxfp4,
}
DEQUANTIZERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    **{t: (lambda r, t=t: _gguf_dequantize(r, t))
       for t in (G.BF16, G.Q4_0, G.Q5_0, G.Q5_1, G.Q8_0, G.Q4_K, G.Q5_K, G.Q6_K, G.Q2_K, G.Q3_K, G.Q4_1, G.IQ4_NL,
                 G.IQ4_XS)},
    G.Q8_1: _dequantize_q8_1, G.MXFP4: mxfp4.dequantize_mxfp4,
}


def _chunked(fn, src: np.ndarray, out: np.ndarray, per_chunk: int) -> np.ndarray:
    """out[a:b] = fn(src[a:b]) over chunks of `per_chunk` blocks, on a thread pool when there are several."""
    def one(a: int, b: int) -> None:
        out[a:b] = fn(src[a:b])
    over_spans(len(src), per_chunk, one)
    return out


def quantize_bytes(blocks: np.ndarray, t: GGMLType) -> np.ndarray:
    """(n_blocks, block_size(t)) float32 -> (n_blocks, type_size(t)) uint8, ggml's reference bytes."""
    out = np.empty((len(blocks), type_size(t)), np.uint8)
    return _chunked(QUANTIZERS[t], blocks, out, max(1, CHUNK_ELEMENTS // block_size(t)))


def dequantize_bytes(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    """(n_blocks, type_size(t)) uint8 -> (n_blocks, block_size(t)) float32, ggml's dequantised values."""
    out = np.empty((len(raw), block_size(t)), np.float32)
    return _chunked(DEQUANTIZERS[t], raw, out, max(1, CHUNK_ELEMENTS // block_size(t)))

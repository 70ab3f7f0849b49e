"""Random ggml weight blocks for the quant kernel tests: random quant bytes, f16 scales in a small range
(magnitudes like real weights, no inf/NaN), MXFP4's exponent bytes likewise; BF16 rows from standard-normal
floats."""

from __future__ import annotations

import numpy as np

from graphdiag.backends.qunits import LAYOUT
from graphdiag.ir.dtypes import GGMLType as G

# f16 scale ranges (offset in the block, low, high) per type: magnitudes like real weights, no inf/NaN
_SCALES = {G.Q4_0: [(0, -0.05, 0.05)], G.Q5_0: [(0, -0.05, 0.05)], G.Q5_1: [(0, 0.001, 0.05), (2, -0.1, 0.1)],
           G.Q4_K: [(0, 0.001, 0.01), (2, 0.0, 0.01)], G.Q5_K: [(0, 0.001, 0.01), (2, 0.0, 0.01)],
           G.Q6_K: [(208, 0.001, 0.01)], G.Q2_K: [(80, 0.001, 0.01), (82, 0.0, 0.01)], G.Q3_K: [(108, 0.001, 0.01)]}
# IQ4 levels reach 127 (IQ4_XS times a sub-block scale up to 32): smaller d for weights of the same size
_SCALES.update({G.Q4_1: [(0, 0.001, 0.05), (2, -0.1, 0.1)], G.IQ4_NL: [(0, -0.005, 0.005)],
                G.IQ4_XS: [(0, -0.0005, 0.0005)]})


def random_rows(rng: np.random.Generator, t: int, k: int, rows: int) -> np.ndarray:
    """(rows, row bytes) uint8 of type t: random quants and scales, f16 scales set from _SCALES."""
    if t == G.BF16:
        x = rng.standard_normal((rows, k)).astype(np.float32)
        return np.frombuffer((x.view(np.uint32) >> 16).astype("<u2").tobytes(), np.uint8).reshape(rows, -1).copy()
    size, upb = LAYOUT[G(t)]
    raw = rng.integers(0, 256, (rows, k // (32 * upb), size), dtype=np.uint8)
    if t == G.MXFP4:   # the E8M0 exponent byte: d = 2^(e - 128) from 2^-10 to 2^-5 (levels up to 12)
        raw[..., 0] = rng.integers(118, 124, raw.shape[:2], dtype=np.uint8)
    for at, lo, hi in _SCALES.get(G(t), ()):
        f = rng.uniform(lo, hi, raw.shape[:2]).astype("<f2")
        raw[..., at:at + 2] = np.frombuffer(f.tobytes(), np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)

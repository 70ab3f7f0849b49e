"""graphdiag.quants against ggml's own C: bytes of quantize_row_*_ref and values of dequantize_row_*.

tests/data/quants_ggml.npz holds what ggml-quants.c of llama.cpp 0c1e57098 computes on `quants_inputs()`
(tools/quants_ggml_golden.py compiles it and writes the file). Equal bytes are the contract: the GPU
kernels and the oracle read these blocks as llama.cpp's files hold them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphdiag.backends import rng
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.quants import dequantize, quantize

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "quants_ggml.npz"
TYPES = (G.Q4_0, G.Q5_0, G.Q5_1, G.Q8_0, G.Q8_1, G.Q4_K, G.Q5_K, G.Q6_K, G.Q2_K, G.Q3_K, G.Q4_1, G.IQ4_NL, G.IQ4_XS,
         G.MXFP4)


def quants_inputs() -> np.ndarray:
    """40 super-blocks (40 x 256 float32) covering each quantiser's branches, from the seeded generator."""
    x = rng.draw_f32(7, 0, 40 * 256, rng.multiplier(1.0), np.float32(0)).reshape(40, 256)
    x[16:20] *= np.float32(0.02)                        # weight-sized values (1/sqrt(2048))
    x[20:24] = np.abs(x[20:24]) + np.float32(0.5)       # all positive: the fitted min turns positive
    x[24:28] = -np.abs(x[24:28]) - np.float32(0.25)     # all negative
    x[28:32].reshape(4, 8, 32)[:, ::3] = 0              # zero sub-blocks of 32 (and of 16)
    x[28:32].reshape(4, 16, 16)[:, 1::5] = 0
    x[32:34] = 0                                        # zero super-blocks
    x[34:36].reshape(2, 8, 32)[:, 1::2] = np.float32(0.25)   # flat sub-blocks
    x[36:38].reshape(2, 8, 32)[:, :, 5] *= np.float32(50)    # an outlier in every sub-block
    x[38] *= np.float32(1e-17)                          # near GROUP_MAX_EPS
    x[39] = (np.arange(256, dtype=np.float32) % 17 - 8) * np.float32(0.5)   # exact halves: rounding ties
    return np.ascontiguousarray(x.reshape(-1))


def mxfp4_edge_inputs() -> np.ndarray:
    """64 MXFP4 blocks at its edges: a block maximum one ulp below each power of two 2^-60 .. 2^3 (where log2f
    decides the exponent), the rest of the block on exact level midpoints of that exponent (best_index_mxfp4's
    tie rule), both signs."""
    x = np.zeros((64, 32), np.float32)
    k = np.arange(-60, 4).astype(np.float32)
    x[:, 0] = np.nextafter(np.float32(2) ** k, np.float32(0))
    d = np.float32(2) ** (k - np.float32(3))                      # the block's d: 2^(floor(log2 amax) - 3)
    mids = np.array([0.5, 1.5, 2.5, 3.5, 5, 7, 10, 11.5, 3, 0.25], np.float32)
    x[:, 1:11] = mids * d[:, None]
    x[:, 11:21] = -mids * d[:, None]
    x[:, 21:] = x[:, :11] * np.float32(-0.75)
    return np.ascontiguousarray(x.reshape(-1))


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_quantize_bytes_equal_ggml(golden, t):
    got = quantize(quants_inputs().reshape(8, -1), t)
    want = golden[f"{t.name.lower()}_bytes"]
    assert got.nbytes == want.nbytes
    diff = np.nonzero(np.ascontiguousarray(got).view(np.uint8).reshape(-1) != want)[0]
    assert diff.size == 0, f"{t.name}: {diff.size} bytes differ from ggml's, first at {diff[:8]}"


@pytest.mark.parametrize("t", [t for t in TYPES if t != G.Q8_1], ids=lambda t: t.name)
def test_dequantize_values_equal_ggml(golden, t):
    raw = golden[f"{t.name.lower()}_bytes"]
    from graphdiag.quants import BLOCK_DTYPE
    got = dequantize(raw.view(BLOCK_DTYPE[t]).reshape(4, -1))
    want = golden[f"{t.name.lower()}_values"].reshape(4, -1)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{t.name}: values differ from ggml's"


def test_mxfp4_edges_equal_ggml(golden):
    got = quantize(mxfp4_edge_inputs().reshape(2, -1), G.MXFP4)
    assert np.array_equal(np.ascontiguousarray(got).view(np.uint8).reshape(-1), golden["mxfp4_edge_bytes"])

"""MXFP4 on the host: ggml's type number and block layout, the dequantiser against gguf's for every exponent
byte and nibble, quantisation of exact levels (ggml's bytes on its golden inputs: test_quants_ggml.py)."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag.ir.dtypes import GGMLType, block_size, row_size, type_size
from graphdiag.quants import BLOCK_DTYPE, dequantize, quantize
from graphdiag.quants.mxfp4 import KVALUES, e8m0_half

gguf = pytest.importorskip("gguf")


def test_type_39_is_32_elements_in_17_bytes_as_ggml():
    assert int(GGMLType.MXFP4) == int(gguf.GGMLQuantizationType.MXFP4) == 39
    assert (block_size(GGMLType.MXFP4), type_size(GGMLType.MXFP4)) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.MXFP4]
    assert BLOCK_DTYPE[GGMLType.MXFP4].itemsize == 17 and row_size(GGMLType.MXFP4, 2880) == 90 * 17


def test_every_exponent_and_nibble_dequantises_as_gguf():
    """256 blocks, one per exponent byte (the two subnormal scales included), each holding all 256 nibble
    pairs' worth of levels over the blocks."""
    raw = np.zeros((256, 17), np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:] = (np.arange(256 * 16).reshape(256, 16) * 7) % 256
    with np.errstate(over="ignore"):             # exponent byte 255: 12 * 2^127 is inf
        want = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType.MXFP4).reshape(256, 32)
    got = dequantize(raw.view(BLOCK_DTYPE[GGMLType.MXFP4]).reshape(256, 1))
    assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_exact_levels_survive_a_round_trip():
    """Blocks made of kvalues * 2^(e - 128) with the block maximum 12 (or -12) quantise back to the same values."""
    rng = np.random.default_rng(3)
    e = rng.integers(100, 160, 64).astype(np.uint8)
    q = rng.integers(0, 16, (64, 32))
    q[:, 5] = 7                                    # |level| 12 in every block: amax = 12 d, so e comes back
    x = KVALUES[q].astype(np.float32) * e8m0_half(e)[:, None]
    back = quantize(x, GGMLType.MXFP4)
    assert np.array_equal(back["e"].reshape(-1), e)
    assert np.array_equal(dequantize(back), x)


def test_the_kernels_unit_twin_dequantises_and_dots_as_the_codec():
    """qunits (the numpy twin of quants.cuh's MXFP4 units): its dequantisation equals the codec's to the bit,
    and its MMVQ dot with Q8_1 x equals the float64 product of the dequantised rows within float32 rounding."""
    from graphdiag.backends import qunits
    from graphdiag.backends.sim_kernels import quantize_q8_1
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 256)).astype(np.float32) * np.float32(0.05)
    w = quantize(x, GGMLType.MXFP4)
    raw = np.ascontiguousarray(w).view(np.uint8).reshape(6, -1)
    assert np.array_equal(qunits.dequantize(raw, GGMLType.MXFP4).view(np.uint32), dequantize(w).view(np.uint32))
    xq = quantize_q8_1(rng.standard_normal((1, 1, 3, 256)).astype(np.float32))
    got = qunits.q8_dot(raw[None, None], GGMLType.MXFP4, xq)[0, 0]                     # (3, 6)
    xf = (xq["qs"].astype(np.float64) * xq["d"].astype(np.float64)[..., None]).reshape(3, 256)
    want = xf @ dequantize(w).astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())

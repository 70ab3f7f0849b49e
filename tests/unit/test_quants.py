"""graphdiag.quants: layouts, hand-made blocks with known values, round-trip error bounds, shapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from graphdiag.ir.dtypes import GGMLType as G, block_size, type_size
from graphdiag.quants import BLOCK_DTYPE, QUANT_TYPES, dequantize, q8_1_activations, quantize, type_of

BLOCKS = [t for t in QUANT_TYPES if block_size(t) > 1]


def test_each_layout_has_ggml_block_bytes_and_names_its_type():
    for t, dt in BLOCK_DTYPE.items():
        assert dt.itemsize == type_size(t), t.name
        assert type_of(np.zeros(2, dt)) == t
    with pytest.raises(ValueError, match="no ggml layout"):
        type_of(np.zeros(2, np.int64))


def _raw(dt, **fields) -> np.ndarray:
    b = np.zeros(1, dt)
    for k, v in fields.items():
        b[k] = v
    return b


def test_hand_made_legacy_blocks_decode_to_known_values():
    qs = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)   # low: 0..15, high: 15..0
    want_q = np.concatenate([np.arange(16), np.arange(16)[::-1]]).astype(np.float32)
    assert np.array_equal(dequantize(_raw(BLOCK_DTYPE[G.Q4_0], d=0.5, qs=qs)), 0.5 * (want_q - 8))
    qh = np.array([0x01, 0x00, 0x00, 0x80], np.uint8)          # bit 0 -> element 0, bit 31 -> element 31
    q5 = want_q.copy()
    q5[0] += 16
    q5[31] += 16
    assert np.array_equal(dequantize(_raw(BLOCK_DTYPE[G.Q5_0], d=0.25, qh=qh, qs=qs)), 0.25 * (q5 - 16))
    assert np.array_equal(dequantize(_raw(BLOCK_DTYPE[G.Q5_1], d=0.25, m=-1.0, qh=qh, qs=qs)), 0.25 * q5 - 1)
    q8 = np.arange(-16, 16, dtype=np.int8)
    assert np.array_equal(dequantize(_raw(BLOCK_DTYPE[G.Q8_0], d=2.0, qs=q8)), 2.0 * q8)


def test_hand_made_k_quant_blocks_decode_to_known_values():
    # Q4_K: sub-block j has scale j + 1 and min 2j (j >= 4 use the high bits of bytes 0..7 and bytes 8..11)
    ls, lm = np.arange(1, 9), 2 * np.arange(8)
    sc = np.zeros(12, np.uint8)
    sc[:4] = ls[:4] | ((ls[4:] >> 4) << 6)
    sc[4:8] = lm[:4] | ((lm[4:] >> 4) << 6)
    sc[8:] = (ls[4:] & 0xF) | ((lm[4:] & 0xF) << 4)
    q = np.tile(np.arange(32, dtype=np.uint8) % 16, 8).reshape(4, 2, 32)     # sub-block pairs share bytes
    qs = (q[:, 0] | (q[:, 1] << 4)).reshape(128)
    got = dequantize(_raw(BLOCK_DTYPE[G.Q4_K], d=0.5, dmin=0.25, scales=sc, qs=qs)).reshape(8, 32)
    want = 0.5 * ls[:, None] * (np.arange(32) % 16)[None, :] - 0.25 * lm[:, None]
    assert np.array_equal(got, want.astype(np.float32))
    # Q6_K: every quant 33 (value 1 after the -32), sub-block scale k - 8
    L = np.full((2, 4, 32), 33, np.uint8)
    ql = np.concatenate([(L[:, 0] & 0xF) | ((L[:, 2] & 0xF) << 4), (L[:, 1] & 0xF) | ((L[:, 3] & 0xF) << 4)], 1)
    qh = (L[:, 0] >> 4) | ((L[:, 1] >> 4) << 2) | ((L[:, 2] >> 4) << 4) | ((L[:, 3] >> 4) << 6)
    s6 = np.arange(16, dtype=np.int8) - 8
    got = dequantize(_raw(BLOCK_DTYPE[G.Q6_K], ql=ql.reshape(128), qh=qh.reshape(64), scales=s6, d=0.125))
    assert np.array_equal(got, np.repeat(0.125 * s6.astype(np.float32), 16))


def test_hand_made_2_and_3_bit_k_quant_blocks_decode_to_known_values():
    # element 32 k + l (k = 0..7) sits in qs[32 (k // 4) + l] at bits 2 (k % 4); sub-block j = element // 16
    L = (np.arange(256) * 7 % 4).astype(np.uint8).reshape(2, 4, 32)
    qs = (L[:, 0] | (L[:, 1] << 2) | (L[:, 2] << 4) | (L[:, 3] << 6)).reshape(64)
    q = L.reshape(256).astype(np.float32)
    j = np.arange(16)
    sc2 = ((j % 16) | ((15 - j) << 4)).astype(np.uint8)                  # Q2_K: scale j, min 15 - j
    got = dequantize(_raw(BLOCK_DTYPE[G.Q2_K], scales=sc2, qs=qs, d=0.5, dmin=0.25))
    assert np.array_equal(got, (np.repeat(0.5 * j, 16) * q - np.repeat(0.25 * (15 - j), 16)).astype(np.float32))
    # Q3_K: 6-bit scale j + 40 (value j + 8), low nibbles in bytes 0..7 (high nibble: j >= 8), top 2 bits in
    # byte 8 + j % 4 at bit 2 (j // 4); hmask bit k of byte l set for even l: those quants are not lowered by 4
    s6 = j + 40
    sc3 = np.zeros(12, np.uint8)
    sc3[:8] = (s6[:8] & 0xF) | ((s6[8:] & 0xF) << 4)
    for i in range(16):
        sc3[8 + i % 4] |= (s6[i] >> 4) << (2 * (i // 4))
    hm = np.where(np.arange(32) % 2 == 0, 0xFF, 0).astype(np.uint8)
    got = dequantize(_raw(BLOCK_DTYPE[G.Q3_K], hmask=hm, qs=qs, scales=sc3, d=0.125))
    high = (np.arange(256) % 32 % 2 == 0)
    assert np.array_equal(got, (np.repeat(0.125 * (j + 8), 16) * (q - 4 * ~high)).astype(np.float32))


def test_nearest_int_is_ggmls_trick_inside_and_outside_its_range():
    from graphdiag.quants.kquants_low import nearest_int
    v = np.array([0.5, 1.5, -2.5, 2.49, -3.7, 4194303.0, 3e7, -1e9], np.float32)
    want = [(((np.float32(x) + np.float32(12582912.0)).view(np.int32) & 0x7FFFFF) - 0x400000) for x in v]
    assert nearest_int(v).tolist() == want and want[:6] == [0, 2, -2, 2, -4, 4194303]


def test_bf16_rounds_to_nearest_even_and_keeps_nans_quiet():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf, np.nan], np.float32)
    b = quantize(x, G.BF16)
    assert b["bits"][:5].tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80]
    assert b["bits"][5] & 0x7FC0 == 0x7FC0
    assert np.array_equal(dequantize(b)[:5], np.array([1.0, 1.0, 1 + 2**-6, -2.5, np.inf], np.float32))


# rms error of unit-normal values, just above what ggml's reference quantisers give (measured)
RMS_BOUND = {G.BF16: 0.0025, G.Q4_0: 0.095, G.Q5_0: 0.048, G.Q5_1: 0.042, G.Q8_0: 0.006, G.Q8_1: 0.006,
             G.Q4_K: 0.078, G.Q5_K: 0.04, G.Q6_K: 0.02, G.Q2_K: 0.31, G.Q3_K: 0.16}


@pytest.mark.parametrize("t", sorted(RMS_BOUND), ids=lambda t: t.name)
def test_round_trip_error_is_within_each_types_bound(t):
    x = np.random.default_rng(5).standard_normal((16, 1024)).astype(np.float32)
    y = dequantize(quantize(x, t))
    assert y.shape == x.shape and y.dtype == np.float32
    assert float(np.sqrt(np.mean((x - y) ** 2))) < RMS_BOUND[t]
    if t in (G.Q4_0, G.Q5_0, G.Q8_0):           # one step of a block's absmax-scaled grid at most
        steps = {G.Q4_0: 8, G.Q5_0: 16, G.Q8_0: 127}[t]
        amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
        assert np.all(np.abs((x - y).reshape(-1, 32)) <= amax / steps * 1.01)


@pytest.mark.parametrize("t", BLOCKS, ids=lambda t: t.name)
def test_zeros_stay_zero_and_bad_rows_are_refused(t):
    assert not dequantize(quantize(np.zeros((2, 256), np.float32), t)).any()
    with pytest.raises(ValueError, match="multiple of"):
        quantize(np.zeros(block_size(t) + 16, np.float32), t)


@settings(max_examples=25, deadline=None)
@given(t=st.sampled_from(BLOCKS), lead=st.lists(st.integers(1, 3), max_size=2), nblk=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_any_leading_shape_quantises_row_by_row(t, lead, nblk, seed):
    n = nblk * block_size(t)
    x = np.random.default_rng(seed).standard_normal((*lead, n)).astype(np.float32)
    q = quantize(x, t)
    assert q.shape == (*lead, nblk) and q.dtype == BLOCK_DTYPE[t]
    flat = quantize(x.reshape(-1, n), t)                       # rows are independent: the same bytes
    assert q.reshape(-1, nblk).tobytes() == flat.tobytes()
    assert dequantize(q).shape == x.shape


def test_which_types_take_q8_1_activations_on_a_gpu():
    assert all(q8_1_activations(t) for t in (G.Q4_0, G.Q5_0, G.Q5_1, G.Q8_0, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K,
                                             G.Q6_K))
    assert not any(q8_1_activations(t) for t in (G.F32, G.F16, G.BF16))


def test_a_type_without_a_codec_is_refused_naming_the_ones_there_are():
    with pytest.raises(ValueError, match="no numpy codec.*Q4_K"):
        quantize(np.zeros(256, np.float32), G.Q8_K)

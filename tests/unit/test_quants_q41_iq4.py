"""Q4_1, IQ4_NL and IQ4_XS on the host: ggml's numbers and layouts, hand-made and edge blocks, the IQ4 level
search, round-trip error, and the simulator's kernels (the numpy twins of kernels/mmvq.cu) against float64
products and gguf's dequantisation. Bytes against ggml's C: test_quants_ggml.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from graphdiag.backends import qunits
from graphdiag.backends.abi import Q8_1, new_params, set_desc
from graphdiag.backends.sim_kernels import quantize_q8_1, run_kernel
from graphdiag.ir.build import contiguous_nb
from graphdiag.ir.dtypes import GGMLType as G, block_size, row_size, type_size
from graphdiag.memory import AddressSpace
from graphdiag.quants import BLOCK_DTYPE, dequantize, q8_1_activations, quantize, type_of
from graphdiag.quants.iquants import KVALUES, best_index

NEW = (G.Q4_1, G.IQ4_NL, G.IQ4_XS)
RNG = np.random.default_rng(41)


def _raw(t, **fields) -> np.ndarray:
    b = np.zeros(1, BLOCK_DTYPE[t])
    for k, v in fields.items():
        b[k] = v
    return b


def _bytes(a: np.ndarray) -> np.ndarray:
    """Stored records -> (rows, row bytes) uint8, the kernels' raw rows."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(*a.shape[:-1], -1)


def _both(a: np.ndarray, t) -> np.ndarray:
    """The host dequantisation (gguf's) and the kernels' twin must agree to the bit; returns the values."""
    host = dequantize(a)
    twin = qunits.dequantize(_bytes(a), t).reshape(host.shape)
    assert host.tobytes() == twin.tobytes(), f"{G(t).name}: qunits differs from gguf"
    return host


def test_ggml_type_numbers_block_sizes_and_bytes():
    assert (int(G.Q4_1), int(G.IQ4_NL), int(G.IQ4_XS)) == (3, 20, 23)
    assert [(block_size(t), type_size(t)) for t in NEW] == [(32, 20), (32, 18), (256, 136)]
    for t in NEW:
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(t))] == (block_size(t), type_size(t))
    # IQ4_NL's bytes are laid out as Q4_0's; its dtype still names it alone
    assert type_of(np.zeros(1, BLOCK_DTYPE[G.IQ4_NL])) == G.IQ4_NL
    assert type_of(np.zeros(1, BLOCK_DTYPE[G.Q4_0])) == G.Q4_0
    assert all(q8_1_activations(t) for t in NEW)


def test_hand_made_blocks_decode_to_known_values():
    idx = np.arange(32) % 16                                    # element j: index j % 16, both halves
    qs = (idx[:16] | (idx[16:][::-1] << 4)).astype(np.uint8)     # low nibbles 0..15, high 15..0
    want = np.concatenate([np.arange(16), np.arange(16)[::-1]])
    assert np.array_equal(_both(_raw(G.Q4_1, d=0.5, m=-2.0, qs=qs), G.Q4_1), 0.5 * want - 2.0)
    got = _both(_raw(G.IQ4_NL, d=0.25, qs_nl=qs), G.IQ4_NL)
    assert np.array_equal(got, 0.25 * KVALUES[want].astype(np.float32))
    # IQ4_XS: sub-block j has ls = 8 j + 3 (low 4 bits in scales_l, two a byte; high 2 in scales_h bits 2j..)
    ls = 8 * np.arange(8) + 3
    lo = ls & 0xF
    scales_h = int(sum(int(ls[j] >> 4) << (2 * j) for j in range(8)))
    got = _both(_raw(G.IQ4_XS, d=0.125, scales_h=scales_h, scales_l=lo[0::2] | (lo[1::2] << 4),
                     qs=np.tile(qs, 8)), G.IQ4_XS).reshape(8, 32)
    want_xs = (0.125 * (ls - 32))[:, None] * KVALUES[want][None, :]
    assert np.array_equal(got, want_xs.astype(np.float32))


def _best_index_ggml(x: float) -> int:
    """best_index_int8 as ggml writes it, scalar, in float32."""
    v = [np.float32(k) for k in KVALUES]
    x = np.float32(x)
    if x <= v[0]:   # (NaN compares false everywhere: the search ends at the top)
        return 0
    if x >= v[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < v[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - v[mu - 1] < v[mu] - x else mu


def test_the_level_search_is_ggml_binary_search_ties_included():
    lv = KVALUES.astype(np.float32)
    mids = (lv[:-1] + lv[1:]) / 2                                 # exact ties: x - lo == hi - x
    at = np.concatenate([mids, lv])
    near = at[:, None] + np.spacing(at)[:, None] * np.array([-3, -2, -1, 1, 2, 3], np.float32)   # a few ulps off
    x = np.concatenate([RNG.uniform(-140, 140, 4000), RNG.uniform(-1, 1, 500), lv, mids, near.reshape(-1),
                        np.nextafter(mids, np.float32(-200)), np.nextafter(mids, np.float32(200)),
                        [-0.0, 0.0, -1e30, 1e30, -np.inf, np.inf, np.nan]]).astype(np.float32)
    assert best_index(x).tolist() == [_best_index_ggml(v) for v in x]


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
def test_zero_blocks_store_ggmls_bytes(t):
    raw = _bytes(quantize(np.zeros(256, np.float32), t)).reshape(-1, type_size(t))
    if t == G.Q4_1:
        assert not raw.any()
    elif t == G.IQ4_NL:                                           # d 0, every index 8 (level 1, nearest 0)
        assert not raw[:, :2].any() and (raw[:, 2:] == 0x88).all()
    else:   # d = -0/32 = -0.0 (f16 0x8000), every sub-block l = 0 stored as 32: scales_h 0b10 per sub-block
        assert raw[0, :2].tolist() == [0x00, 0x80] and raw[0, 2:4].view("<u2")[0] == 0xAAAA
        assert not raw[0, 4:8].any() and (raw[0, 8:] == 0x88).all()
    assert not _both(quantize(np.zeros(256, np.float32), t), t).any()


EDGES = {
    "constant": np.full(256, 0.75, np.float32),
    "negative-constant": np.full(256, -3.0, np.float32),
    "large": np.linspace(-6e4, 6e4, 256, dtype=np.float32),
    "tiny": np.linspace(-1e-3, 1e-3, 256, dtype=np.float32),
    "outlier": np.where(np.arange(256) == 77, 40.0, 0.01).astype(np.float32),
    "halves": ((np.arange(256) % 17 - 8) * 0.5).astype(np.float32),
}


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
@pytest.mark.parametrize("edge", EDGES)
def test_edge_blocks_round_trip_within_one_step_and_the_twin_agrees(t, edge):
    x = EDGES[edge]
    y = _both(quantize(x, t), t)
    assert np.isfinite(y).all()
    blk = x.reshape(-1, 32)
    amax = np.abs(blk).max(1)
    # Q4_1: half a step of (max - min) / 15, plus f16 rounding of d and m; IQ4_NL: half the levels' widest gap
    # (24 of 127 at the top) is about a tenth of the block's max |x|; IQ4_XS: that, plus its sub-block scale's
    # rounding to a multiple of d = (largest sub-block scale) / 32, about a 40th of the super-block's max |x|
    if t == G.Q4_1:
        step = (blk.max(1) - blk.min(1)) / 15 * 0.52 + amax * 2.0**-10
    elif t == G.IQ4_NL:
        step = 0.11 * amax
    else:
        step = 0.11 * amax + np.repeat(amax.reshape(-1, 8).max(1), 8) / 40
    assert np.all(np.abs(y - x).reshape(-1, 32).max(1) <= step + 1e-30), edge
    if edge.endswith("constant") and t != G.IQ4_XS:
        assert np.allclose(y, x, rtol=2.0**-9)


@pytest.mark.parametrize("t, bound", [(G.Q4_1, 0.08), (G.IQ4_NL, 0.079), (G.IQ4_XS, 0.079)], ids=lambda v: str(v))
def test_round_trip_error_of_unit_normal_values(t, bound):
    x = np.random.default_rng(5).standard_normal((16, 1024)).astype(np.float32)
    y = dequantize(quantize(x, t))
    assert float(np.sqrt(np.mean((x - y) ** 2))) < bound            # measured 0.0778, 0.0764, 0.0770


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
def test_random_blocks_dequantise_as_gguf_in_the_kernels_twin(t):
    from support.quant_data import random_rows
    raw = random_rows(RNG, t, 1024, 11)
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType(int(t))).astype(np.float32)
    assert qunits.dequantize(raw, t).tobytes() == ref.tobytes()


# -- the simulator's kernels ----------------------------------------------------------------------------
class _Mem:
    def __init__(self):
        self.space = AddressSpace(0x7000_0000_0000, name="sim")

    def put(self, t, ne, raw=None):
        nb = contiguous_nb(t, ne)
        addr = self.space.alloc(nb[3] * ne[3])
        if raw is not None:
            buf, off = self.space.locate(addr, raw.nbytes)
            np.frombuffer(buf, np.uint8, raw.nbytes, off)[...] = raw.reshape(-1).view(np.uint8)
        return addr, int(t), ne, nb

    def get(self, d, dtype=np.float32):
        addr, _, ne, nb = d
        buf, off = self.space.locate(addr, nb[3] * ne[3])
        return np.frombuffer(buf, dtype, nb[3] * ne[3] // np.dtype(dtype).itemsize, off).copy()


def _params(*descs, ip=()):
    p = new_params()
    for slot, d in enumerate(descs):
        if d is not None:
            set_desc(p, slot, *d)
    p["ip"][: len(ip)] = ip
    return p


def _weights(t, k, m):
    """Quantised normal weights of std 1/sqrt(k) (what the presets draw): (m, row bytes) uint8 and float64."""
    raw = _bytes(quantize((RNG.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32), t))
    return raw, gguf_dequantize(raw, gguf.GGMLQuantizationType(int(t))).astype(np.float64)


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
def test_the_simulated_mat_vec_is_the_float64_product_on_q8_1_x(t):
    """mul_mat_vec_{w} (N 1..8) and its fused ADD against float64 W . dequant(xq): float32 rounding only, a bound
    far below a 2 % error in any row (which the same check must reject)."""
    k, m, n = 1024, 48, 5
    w = t.name.lower()
    raw, wf = _weights(t, k, m)
    x = RNG.standard_normal((n, k)).astype(np.float32)
    xq = quantize_q8_1(x)
    mem = _Mem()
    dw, dx = mem.put(t, (k, m, 1, 1), raw), mem.put(Q8_1, (k, n, 1, 1), xq)
    r = RNG.standard_normal((n, m)).astype(np.float32)
    dst, dr, dst2 = mem.put(G.F32, (m, n, 1, 1)), mem.put(G.F32, (m, n, 1, 1), r), mem.put(G.F32, (m, n, 1, 1))
    run_kernel(mem.space, f"mul_mat_vec_{w}", _params(dst, dw, dx))
    run_kernel(mem.space, f"mul_mat_vec_add_{w}", _params(dst2, dw, dx, dr))
    got = mem.get(dst).reshape(n, m)
    xf = (xq["d"].astype(np.float64)[..., None] * xq["qs"]).reshape(n, k)
    ref = xf @ wf.T
    scale = np.abs(xf) @ np.abs(wf).T                                 # sum |w x|: float32 rounding's scale
    s_err = (np.abs(xq["s"].astype(np.float64)) * 2.0**-11).sum(-1)[:, None] * np.abs(wf).max()   # Q4_1's m s8

    def within(v):
        return bool(np.all(np.abs(v - ref) <= 2e-6 * scale + s_err))
    assert within(got)
    assert not within(got * 1.02) and not within(got + 0.02 * np.abs(ref).max())
    assert np.array_equal(mem.get(dst2).reshape(n, m), got + r)


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
def test_the_simulated_prefill_and_get_rows_dequantise_bit_for_bit(t):
    """dequantize_f16_{w} (the prefill's weights for mul_mat_f16) and get_rows_{w}, to the bit of gguf's values."""
    k, m = 512, 6
    w = t.name.lower()
    raw, wf = _weights(t, k, m)
    mem = _Mem()
    dw = mem.put(t, (k, m, 1, 1), raw)
    dh = mem.put(G.F16, (k, m, 1, 1))
    run_kernel(mem.space, f"dequantize_f16_{w}", _params(dh, dw))
    assert np.array_equal(mem.get(dh, np.float16), wf.astype(np.float32).astype(np.float16).reshape(-1))
    ids = mem.put(G.I32, (3, 1, 1, 1), np.array([5, 0, 5], np.int32))
    rows = mem.put(G.F32, (k, 3, 1, 1))
    run_kernel(mem.space, f"get_rows_{w}", _params(rows, dw, ids))
    assert mem.get(rows).tobytes() == wf[[5, 0, 5]].astype(np.float32).tobytes()
    assert row_size(t, k) == raw.shape[1]

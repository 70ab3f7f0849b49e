"""cpu_ops against straightforward loops (float64) on small random inputs, strided views included."""

import math

import numpy as np
import pytest

from graphdiag.backends import cpu_ops as ops
from graphdiag.ir.build import contiguous_nb
from graphdiag.ir.dtypes import GGMLType
from graphdiag.memory import AddressSpace, dequantize_q8_0, quantize_q8_0

RNG = np.random.default_rng(0)


def rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def place(space: AddressSpace, t: GGMLType, values: np.ndarray, ne, nb=None) -> np.ndarray:
    """A view of `values` (given in numpy order for ne) written at a fresh address with strides nb."""
    nb = nb or contiguous_nb(t, ne)
    span = sum((n - 1) * s for n, s in zip(ne if t != GGMLType.Q8_0 else (ne[0] // 32, *ne[1:]), nb)) + nb[0]
    v = space.ndarray(space.alloc(span), t, ne, nb)
    v[...] = values
    return v


def weights(t: GGMLType, k: int, m: int, batch=1) -> tuple[np.ndarray, np.ndarray]:
    """(the array cpu_ops reads, its exact float64 values), shape (1, batch, m, k)."""
    w = rand(1, batch, m, k)
    if t == GGMLType.Q8_0:
        q = quantize_q8_0(w)
        return q, dequantize_q8_0(q).astype(np.float64)
    a = w.astype(np.float16 if t == GGMLType.F16 else np.float32)
    return a, a.astype(np.float64)


def test_add_mul_repeat_divisor_dims_like_ggml_repeat():
    a, b = rand(2, 3, 4, 8), rand(1, 3, 2, 4)
    got_add, got_mul = ops.add(a, b), ops.mul(a, b)
    for i in np.ndindex(a.shape):
        j = tuple(x % n for x, n in zip(i, b.shape))
        assert got_add[i] == pytest.approx(a[i] + b[j], rel=1e-6)
        assert got_mul[i] == pytest.approx(a[i] * b[j], rel=1e-6)
    with pytest.raises(ValueError):
        ops.add(a, rand(1, 1, 3, 8))


def test_rms_norm_on_a_strided_view():
    space = AddressSpace(0x1000)
    x = place(space, GGMLType.F32, rand(1, 2, 3, 16), (16, 3, 2, 1), nb=(4, 128, 512, 1024))
    got = ops.rms_norm(x, 1e-5)
    for i in np.ndindex(x.shape[:-1]):
        row = x[i].astype(np.float64)
        np.testing.assert_allclose(got[i], row / math.sqrt(np.mean(row * row) + 1e-5), rtol=1e-5)


@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0])
def test_get_rows_dequantises_the_selected_rows(t):
    table, exact = weights(t, 64, 10)
    ids = np.array([[[[3, 0, 9], [9, 9, 1]]]], np.int32)  # (1, 1, 2, 3): ids.ne = (3, 2)
    got = ops.get_rows(table, ids)
    assert got.shape == (1, 2, 3, 64) and got.dtype == np.float32
    for i2, i1 in np.ndindex(2, 3):
        np.testing.assert_allclose(got[0, i2, i1], exact[0, 0, ids[0, 0, i2, i1]], rtol=1e-6)


@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0])
def test_mul_mat_any_weight_type_strided_x_and_blocked_batch_broadcast(t):
    space = AddressSpace(0x1000)
    w, wx = weights(t, 64, 5, batch=2)
    # x (K=64, N=3, B2=4): rows padded to 80 floats, so the view is not contiguous
    x = place(space, GGMLType.F32, rand(1, 4, 3, 64), (64, 3, 4, 1), nb=(4, 320, 960, 3840))
    got = ops.mul_mat(w, x)
    assert got.shape == (1, 4, 3, 5)
    for b2, n, m in np.ndindex(4, 3, 5):
        ref = sum(wx[0, b2 // 2, m, k] * float(x[0, b2, n, k]) for k in range(64))
        assert got[0, b2, n, m] == pytest.approx(ref, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("n", [1, 3, 9])
def test_mul_mat_dequantises_a_big_block_weight_a_slice_of_rows_at_a_time(monkeypatch, n):
    """A block-type weight past MUL_MAT_SLICE_BYTES is dequantised a slice of rows at a time (never whole: the LM
    head of a real vocabulary took 671 MB), each slice giving its columns of dst, x's batch broadcast over the
    weight's by blocks as before. Values exact in float32 (small integers, power-of-two scales), so every sum is
    exact whatever BLAS's order: the same bits as the whole product's; an F16 weight takes the one product."""
    w = quantize_q8_0(np.zeros((1, 2, 300, 64), np.float32))
    w["d"], w["qs"] = 0.25, RNG.integers(-8, 9, w["qs"].shape)
    q = dequantize_q8_0(w)
    x = RNG.integers(-8, 9, (1, 4, n, 64)).astype(np.float32)
    whole = np.matmul(x, np.swapaxes(np.repeat(q, 2, axis=1), -1, -2))
    widened = []
    to_f32 = ops.to_f32
    monkeypatch.setattr(ops, "to_f32", lambda a: widened.append(a.shape) or to_f32(a))
    monkeypatch.setattr(ops, "MUL_MAT_SLICE_BYTES", 64 * 64 * 4)        # 64 rows of 64 floats a slice
    got = ops.mul_mat(w, x)
    assert [s[2] for s in widened[1:]] == [64, 64, 64, 64, 44]         # x first, then W's five slices
    assert got.dtype == np.float32 and np.array_equal(got, whole)
    widened.clear()
    ops.mul_mat(q.astype(np.float16), x)
    assert [s[2] for s in widened[1:]] == [300]


@pytest.mark.parametrize("n_b", [1, 2])
def test_mul_mat_id_routes_each_token_slot_to_its_expert(n_b):
    ex, exact = weights(GGMLType.Q8_0, 32, 6, batch=4)  # (1, E=4, M=6, K=32)
    x = rand(1, 3, n_b, 32)
    ids = np.array([[[[2, 0], [2, 3], [1, 2]]]], np.int32)  # (n_used=2, T=3)
    got = ops.mul_mat_id(ex, x, ids)
    assert got.shape == (1, 3, 2, 6)
    for t, s in np.ndindex(3, 2):
        ref = exact[0, ids[0, 0, t, s]] @ x[0, t, s if n_b > 1 else 0].astype(np.float64)
        np.testing.assert_allclose(got[0, t, s], ref, rtol=1e-5, atol=1e-5)


def test_rope_mode0_rotates_adjacent_pairs_and_copies_the_tail():
    x, pos = rand(1, 3, 2, 12), np.array([0, 5, 17], np.int32)
    got = ops.rope(x, pos, n_dims=8, freq_base=10000.0, freq_scale=0.5)
    for t, h in np.ndindex(3, 2):
        for i in range(4):
            th = pos[t] * 0.5 * 10000.0 ** (-2 * i / 8)
            x0, x1 = float(x[0, t, h, 2 * i]), float(x[0, t, h, 2 * i + 1])
            assert got[0, t, h, 2 * i] == pytest.approx(x0 * math.cos(th) - x1 * math.sin(th), abs=1e-5)
            assert got[0, t, h, 2 * i + 1] == pytest.approx(x0 * math.sin(th) + x1 * math.cos(th), abs=1e-5)
        np.testing.assert_array_equal(got[0, t, h, 8:], x[0, t, h, 8:])


def test_set_rows_writes_f16_rows_in_place_flattening_heads():
    space = AddressSpace(0x1000)
    cache = place(space, GGMLType.F16, np.zeros((1, 1, 6, 8), np.float16), (8, 6, 1, 1))
    k = rand(1, 2, 2, 4)  # (D=4, Hkv=2, T=2): one cache row of 8 per token
    ops.set_rows(cache, k, np.array([4, 1], np.int32))
    for t, row in enumerate([4, 1]):
        np.testing.assert_array_equal(cache[0, 0, row], k[0, t].reshape(8).astype(np.float16))
    assert not cache[0, 0, [0, 2, 3, 5]].any()


def test_copy_f32_into_a_strided_f16_view():
    space = AddressSpace(0x1000)
    addr = space.alloc(48)
    dst = space.ndarray(addr, GGMLType.F16, (4, 3, 1, 1), (2, 16, 48, 48))  # rows of 4 halves, 8 apart
    src = rand(1, 1, 3, 4)
    ops.copy(dst, src)
    halves = space.bytes(addr, 48).view(np.float16).reshape(3, 8)
    np.testing.assert_array_equal(halves[:, :4], src[0, 0].astype(np.float16))
    assert not halves[:, 4:].any()  # the padding between rows is untouched


def test_soft_max_rows():
    x = rand(1, 2, 3, 7)
    got = ops.soft_max(x, scale=0.3)
    for i in np.ndindex(x.shape[:-1]):
        e = np.exp(0.3 * x[i].astype(np.float64))
        np.testing.assert_allclose(got[i], e / e.sum(), rtol=1e-5)


def test_top_k_descending_ties_lower_index_first():
    x = np.array([[[[1.0, 3.0, 3.0, -2.0, 3.0, 0.5]]]], np.float32)
    np.testing.assert_array_equal(ops.top_k(x, 4), [[[[1, 2, 4, 0]]]])
    assert ops.top_k(x, 2).dtype == np.int32


def test_swiglu_is_silu_gate_times_up():
    g, u = rand(1, 1, 2, 9) * 5, rand(1, 1, 2, 9)
    ref = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u
    np.testing.assert_allclose(ops.swiglu(g, u), ref, rtol=1e-5, atol=1e-6)
    assert ops.silu(np.array([-200.0], np.float32))[0] == 0.0


def test_flash_attn_gqa_with_mask_against_a_loop():
    H, Hkv, D, T, n_kv = 4, 2, 8, 2, 5
    q = rand(1, T, H, D)
    k, v = rand(1, n_kv, Hkv, D).astype(np.float16), rand(1, n_kv, Hkv, D).astype(np.float16)
    mask = np.zeros((1, 1, 4, n_kv), np.float32)  # T_pad = 4 > T
    mask[0, 0, 0, 3:] = -np.inf
    mask[0, 0, 1, 0] = -np.inf
    mask[0, 0, 1, 2] = 0.25
    got = ops.flash_attn_ext(q, k, v, mask, scale=0.35)
    assert got.shape == (1, T, H, D)
    for t, h in np.ndindex(T, H):
        kv = h // (H // Hkv)
        s = np.array([0.35 * q[0, t, h].astype(np.float64) @ k[0, j, kv].astype(np.float64) + mask[0, 0, t, j]
                      for j in range(n_kv)])
        p = np.exp(s - s.max())
        ref = (p / p.sum()) @ v[0, :, kv].astype(np.float64)
        np.testing.assert_allclose(got[0, t, h], ref, rtol=1e-4, atol=1e-5)


def test_flash_attn_fully_masked_row_gives_zeros():
    q, k, v = rand(1, 1, 2, 4), rand(1, 3, 1, 4), rand(1, 3, 1, 4)
    mask = np.full((1, 1, 1, 3), -np.inf, np.float32)
    assert not ops.flash_attn_ext(q, k, v, mask, 1.0).any()

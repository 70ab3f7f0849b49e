"""The Gemma 3 / Qwen ops (SCALE with bias, GEGLU, NEOX rope, per-head RMS_NORM + broadcast MUL, broadcast
bias ADD): cpu_ops against independent float64 formulas, the CPU backend's dispatch, and the simulator's twins
(new kernels and fused ones) against the CPU ops."""

import math

import numpy as np
import pytest

from graphdiag.backends import cpu_ops as ops
from graphdiag.backends.cpu import CpuBackend
from graphdiag.backends.sim_kernels import run_kernel
from graphdiag.errors import GraphdiagError
from graphdiag.ir import Arena, GGMLType as G, GluOp, Graph, Tensor
from graphdiag.ir.build import Ctx
from graphdiag.model import reference
from test_sim_kernels import Mem, params

RNG = np.random.default_rng(27)


def rand(*shape, s=1.0):
    return (s * RNG.standard_normal(shape)).astype(np.float32)


def gelu64(x):
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_neox64(x, pos, n_dims, base):
    """x (T, H, D) float64: element i < n_dims/2 rotates with i + n_dims/2 by pos * base^(-2i/n_dims)."""
    x = np.asarray(x, np.float64)
    out = x.copy()
    half = n_dims // 2
    for t, p in enumerate(pos):
        for i in range(half):
            th = p * base ** (-2.0 * i / n_dims)
            a, b = x[t, :, i], x[t, :, i + half]
            out[t, :, i] = a * math.cos(th) - b * math.sin(th)
            out[t, :, i + half] = a * math.sin(th) + b * math.cos(th)
    return out


# -- cpu_ops against independent formulas --------------------------------------------------------------
def test_scale_is_x_times_s_plus_bias_in_two_float32_roundings():
    x = rand(3, 640, s=5)
    got = ops.scale(x, 25.298221, 0.5)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (x * np.float32(25.298221)).astype(np.float32) + np.float32(0.5))
    np.testing.assert_allclose(got, x.astype(np.float64) * 25.298221 + 0.5, rtol=1e-6, atol=1e-5)


def test_gelu_tanh_and_geglu_against_the_float64_formula():
    x = np.linspace(-8, 8, 2001, dtype=np.float32)
    np.testing.assert_allclose(ops.gelu_tanh(x), gelu64(x), rtol=2e-6, atol=2e-7)
    assert abs(float(ops.gelu_tanh(np.float32([1.0]))[0]) - 0.8411920) < 1e-6     # not erf-GELU's 0.8413447
    g, u = rand(4, 100, s=3), rand(4, 100)
    np.testing.assert_allclose(ops.geglu(g, u), gelu64(g) * u, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ops.glu(int(GluOp.GEGLU), g, u), ops.geglu(g, u))
    np.testing.assert_array_equal(ops.glu(int(GluOp.SWIGLU), g, u), ops.swiglu(g, u))
    with pytest.raises(GraphdiagError, match="op 0"):
        ops.glu(int(GluOp.REGLU), g, u)


@pytest.mark.parametrize("n_dims", [16, 8])
def test_rope_neox_rotates_i_with_i_plus_half_and_copies_the_tail(n_dims):
    x, pos = rand(1, 3, 2, 16), np.array([0, 5, 77], np.int32)
    got = ops.rope(x, pos, n_dims, 1e6, 1.0, mode=2)
    np.testing.assert_allclose(got[0], rope_neox64(x[0], pos, n_dims, 1e6), rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(got[0, 0], x[0, 0])                   # position 0: no rotation
    np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])  # dims past n_dims copied
    np.testing.assert_array_equal(ops.rope_neox(x, pos, n_dims, 1e6), got)
    assert not np.allclose(got, ops.rope(x, pos, n_dims, 1e6, 1.0, mode=0))   # not the adjacent pairs
    with pytest.raises(GraphdiagError, match="mode 1"):
        ops.rope(x, pos, n_dims, 1e6, 1.0, mode=1)


def test_rms_norm_per_head_rows_times_a_broadcast_weight_and_a_bias_row():
    x, w = rand(1, 3, 4, 256), rand(256)            # (T, H, D): QK-norm normalises each head's row
    got = ops.mul(ops.rms_norm(x, 1e-6), w.reshape(1, 1, 1, 256))
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    a, b = rand(1, 1, 7, 896), rand(896)            # Qwen2's Q bias over a batch
    np.testing.assert_array_equal(ops.add(a, b.reshape(1, 1, 1, 896)), a + b)


def test_the_oracle_has_its_own_float64_helpers():
    x, pos = rand(3, 2, 16).astype(np.float64), np.array([1, 2, 40])
    np.testing.assert_allclose(reference.rope_neox(x, pos, 1e4), rope_neox64(x, pos, 16, 1e4), rtol=1e-12)
    np.testing.assert_allclose(reference.gelu_tanh(x), gelu64(x), rtol=1e-12)
    np.testing.assert_allclose(reference.geglu(x, x + 1), gelu64(x) * (x + 1), rtol=1e-12)
    np.testing.assert_allclose(reference.rope(x, pos, 1e4, neox=False), reference._rope(x, pos, 1e4))


# -- the CPU backend's dispatch --------------------------------------------------------------------------
def _run_cpu(build):
    """Build with Ctx, place every tensor, fill the leaves with seeded values, compute; (outputs, leaves)."""
    arena = Arena()
    outs, leaves = build(Ctx(arena))
    g = Graph(arena)
    for o in outs:
        g.build_forward_expand(o)
    be = CpuBackend()
    for idx in list(g.leafs) + list(g.nodes):
        t = arena.rec[idx]
        if t["view_src"]:
            t["data"] = arena.rec[arena.index(int(t["view_src"]))]["data"] + t["view_offs"]
        elif not t["data"]:
            t["data"] = be.buffer_alloc(Tensor(arena, int(idx)).nbytes())
    vals = {}
    for name, t in leaves.items():
        v = np.array([[[[3, 9]]]], np.int32) if t.type == G.I32 else rand(*t.ne[::-1])
        be.space.ndarray(t.data, t.type, t.ne, t.nb)[...] = v
        vals[name] = v
    be.graph_compute(g, 0)
    return [be.space.ndarray(o.data, o.type, o.ne, o.nb).copy() for o in outs], vals


def test_cpu_backend_computes_scale_geglu_neox_rope_and_qk_norm():
    D, H, T = 8, 2, 2

    def build(c: Ctx):
        L = {"x": c.new_tensor(G.F32, (D, H, T), "x"), "w": c.new_tensor(G.F32, (D,), "w"),
             "u": c.new_tensor(G.F32, (D, H, T), "u"), "pos": c.new_input(G.I32, (T,), "pos")}
        s = c.scale(L["x"], 0.5, "s", bias=2.0)
        gg = c.glu_split(L["x"], L["u"], GluOp.GEGLU, "gg")
        qk = c.rope(c.mul(c.rms_norm(L["x"], 1e-6, "n"), L["w"], "nw"), L["pos"], D, 1e6, "r", mode=2)
        return [s, gg, qk], L

    (s, gg, qk), v = _run_cpu(build)
    np.testing.assert_array_equal(s, ops.scale(v["x"], 0.5, 2.0))
    np.testing.assert_array_equal(gg, ops.geglu(v["x"], v["u"]))
    want = ops.rope(ops.mul(ops.rms_norm(v["x"], 1e-6), v["w"]), v["pos"], D, 1e6, 1.0, 2)
    np.testing.assert_array_equal(qk, want)
    assert not np.array_equal(qk, ops.rope(ops.mul(ops.rms_norm(v["x"], 1e-6), v["w"]), v["pos"], D, 1e6, 1.0, 0))


def test_cpu_backend_refuses_a_glu_it_does_not_compute():
    def build(c: Ctx):
        L = {"a": c.new_tensor(G.F32, (4, 2), "a"), "b": c.new_tensor(G.F32, (4, 2), "b")}
        return [c.glu_split(L["a"], L["b"], GluOp.REGLU, "re")], L

    with pytest.raises(GraphdiagError, match="GLU op 0"):
        _run_cpu(build)


# -- the simulator's twins against the CPU ops ---------------------------------------------------------
def test_sim_scale_and_geglu_follow_cpu_ops():
    m = Mem()
    x, u = rand(1, 1, 3, 40, s=4), rand(1, 1, 3, 40)
    dx, du, dst = m.put(G.F32, (40, 3, 1, 1), x), m.put(G.F32, (40, 3, 1, 1), u), m.put(G.F32, (40, 3, 1, 1))
    run_kernel(m.space, "scale_f32", params(dst, dx, fp=(0.0625, -1.5)))
    np.testing.assert_array_equal(m.view(dst), ops.scale(x, 0.0625, -1.5))
    run_kernel(m.space, "glu_geglu_f32", params(dst, dx, du))
    np.testing.assert_array_equal(m.view(dst), ops.geglu(x, u))


def test_sim_rms_norm_mul_add_equals_the_three_ops():
    m = Mem()
    x, w, r = rand(1, 1, 4, 64), rand(1, 1, 1, 64), rand(1, 1, 4, 64)
    dx, dw, dr = m.put(G.F32, (64, 4, 1, 1), x), m.put(G.F32, (64, 1, 1, 1), w), m.put(G.F32, (64, 4, 1, 1), r)
    fused = m.put(G.F32, (64, 4, 1, 1))
    run_kernel(m.space, "rms_norm_mul_add_f32", params(fused, dx, dw, dr, fp=(1e-6,)))
    np.testing.assert_array_equal(m.view(fused), ops.add(ops.mul(ops.rms_norm(x, 1e-6), w), r))


@pytest.mark.parametrize("mode", [0, 2])
def test_sim_rms_norm_mul_rope_and_its_cache_write_equal_the_unfused_ops(mode):
    m = Mem()
    D, Hkv, T, n_rows = 16, 2, 3, 7
    x, w = rand(1, T, Hkv, D), rand(1, 1, 1, D)
    dx, dw = m.put(G.F32, (D, Hkv, T, 1), x), m.put(G.F32, (D, 1, 1, 1), w)
    dpos, didx = m.put(G.I32, (T, 1, 1, 1), [[[[3, 4, 50]]]]), m.put(G.I32, (T, 1, 1, 1), [[[[6, 0, 2]]]])
    roped, cache = m.put(G.F32, (D, Hkv, T, 1)), m.put(G.F16, (D * Hkv, n_rows, 1, 1), np.zeros((1, 1, 7, 32)))
    fp = (1e-6, 1e6, 1.0)
    run_kernel(m.space, "rms_norm_mul_rope_f32", params(roped, dx, dw, dpos, ip=(D, mode), fp=fp))
    want = ops.rope(ops.mul(ops.rms_norm(x, 1e-6), w), np.array([3, 4, 50], np.int32), D, 1e6, 1.0, mode)
    np.testing.assert_array_equal(m.view(roped), want)
    run_kernel(m.space, "rms_norm_mul_rope_set_rows_f16", params(cache, dx, dw, dpos, didx, ip=(D, mode), fp=fp))
    got = m.view(cache)[0, 0]
    np.testing.assert_array_equal(got[[6, 0, 2]], want[0].reshape(T, D * Hkv).astype(np.float16))
    assert not got[[1, 3, 4, 5]].any()


def test_sim_mul_mat_vec_glu_takes_geglu():
    m = Mem()
    wg, wu = rand(1, 1, 16, 64).astype(np.float16), rand(1, 1, 16, 64).astype(np.float16)
    dg, du = m.put(G.F16, (64, 16, 1, 1), wg), m.put(G.F16, (64, 16, 1, 1), wu)
    x = rand(1, 1, 1, 64)
    dx, dst = m.put(G.F32, (64, 1, 1, 1), x), m.put(G.F32, (16, 1, 1, 1))
    run_kernel(m.space, "mul_mat_vec_glu_f16", params(dst, dg, du, dx, ip=(int(GluOp.GEGLU),)))
    np.testing.assert_allclose(m.view(dst), ops.geglu(ops.mul_mat(wg, x), ops.mul_mat(wu, x)), rtol=1e-6)
    with pytest.raises(Exception, match="glu op 0"):
        run_kernel(m.space, "mul_mat_vec_glu_f16", params(dst, dg, du, dx, ip=(0,)))

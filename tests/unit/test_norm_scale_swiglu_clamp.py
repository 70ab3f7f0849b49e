"""0c1e57098's RMS_NORM + SCALE fusion (ggml_cuda_can_fuse's RMS_NORM, SCALE branch: bias 0, an F32 SCALE) and
its GLU SWIGLU_CLAMP (the limit in op param 3), with the gate/up mat-vec + GLU fusion carrying the limit into the
fused kernel (fusion_data.glu_limit): the matchers, the lowering, the simulated twins against the CPU reference,
and a simulated GPU run of a small hand-built graph fusing both and meeting the CPU backend. ggml d99724f2 has
neither: the norm is not fused there and a graph with SWIGLU_CLAMP is refused."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends import cpu_ops as ops
from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.cpu import CpuBackend
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.fusion import MMID_GLU, MMV_GLU, RMS_NORM_MUL, RMS_NORM_SCALE, fusion_plan
from graphdiag.backends.gpu.lowering import lower_node, op_launches, refuse_ops_after
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.backends.sim_kernels import run_kernel
from graphdiag.backends.sim_view import AddressSpace
from graphdiag.errors import GraphdiagError
from graphdiag.ir.arena import Arena
from graphdiag.ir.build import Ctx
from graphdiag.ir.dtypes import GGMLType
from graphdiag.ir.graph import Graph
from graphdiag.ir.ops import GluOp, Op
from graphdiag.ir.tensor import Tensor
from support.placement import place_tensors

F32, F16 = GGMLType.F32, GGMLType.F16
EPS, S, LIMIT = 1e-6, 0.125, 0.75


def _graph(*outs: Tensor) -> Graph:
    g = Graph(outs[0].arena)
    for o in outs:
        g.build_forward_expand(o)
    return g


def _norm_scale(bias: float = 0.0, scale_type: GGMLType = F32, of_norm: bool = True, norm_readers: int = 1):
    """x -> RMS_NORM -> SCALE (the next node): `of_norm` False scales another input instead (the norm then
    read by an ADD after it); `norm_readers` 2 gives the norm a second reader."""
    c = Ctx(Arena())
    x = c.new_input(F32, (64, 3), "x")
    norm = c.rms_norm(x, EPS, "norm")
    src = norm if of_norm else c.new_input(F32, (64, 3), "y")
    s = c.new_tensor(scale_type, norm.ne, "scaled", Op.SCALE, (src,))
    s.set_param_f32(0, S)
    s.set_param_f32(1, bias)
    if not of_norm:
        return _graph(c.add(norm, s, "sum"))
    return _graph(s, c.add(norm, x, "again")) if norm_readers == 2 else _graph(s)


def test_a_norm_scaled_without_bias_fuses_into_one_rms_norm_launch():
    """Tried after the MUL forms (upstream's order); the launch writes the SCALE with eps and the factor."""
    g = _norm_scale()
    plan = fusion_plan(g)
    assert {i: (f.pattern, f.absorbed) for i, f in plan.items()} == {0: (RMS_NORM_SCALE, 1)}
    (launch,) = op_launches(lower_node(g, 0, plan[0], 900))
    assert launch.kernel == "rms_norm_scale_f32"
    assert tuple(launch.params["fp"][:2]) == (np.float32(EPS), np.float32(S))
    assert fusion_plan(g, upstream="d99724f2") == {}
    c = Ctx(Arena())       # a MUL after the norm is still rms_norm+mul
    norm = c.rms_norm(c.new_input(F32, (64, 3), "x"), EPS, "norm")
    assert [f.pattern for f in fusion_plan(_graph(c.mul(norm, c.new_input(F32, (64,), "w"), "w"))).values()] == [
        RMS_NORM_MUL]


@pytest.mark.parametrize("kw", [{"bias": 0.5}, {"scale_type": F16}, {"of_norm": False}, {"norm_readers": 2}],
                         ids=["bias", "f16-scale", "scale-of-another", "norm-read-twice"])
def test_a_bias_a_non_f32_scale_another_scaled_tensor_or_a_second_reader_does_not_fuse(kw):
    """Each graph is the fusing one with one thing changed: that change alone refuses the fusion."""
    assert [f.pattern for f in fusion_plan(_norm_scale()).values()] == [RMS_NORM_SCALE]
    g = _norm_scale(**kw)
    assert g.node(0).op == Op.RMS_NORM and g.node(1).op == Op.SCALE
    assert all(f.pattern != RMS_NORM_SCALE for f in fusion_plan(g).values())


def _run(space, name, slots, ip=(), fp=()):
    p = new_params()
    for i, s in enumerate(slots):
        if s is not None:
            set_desc(p, i, *s)
    p["ip"][:len(ip)] = ip
    p["fp"][:len(fp)] = fp
    run_kernel(space, name, p)


def _put(space, a: np.ndarray, t: GGMLType = F32):
    a = np.ascontiguousarray(a, {F16: np.float16, GGMLType.I32: np.int32}.get(t, np.float32))
    addr = space.alloc(a.nbytes)
    space.bytes(addr, a.nbytes)[...] = np.frombuffer(a.tobytes(), np.uint8)
    ne = tuple(reversed(a.shape)) + (1,) * (4 - a.ndim)
    nb = [a.itemsize]
    for n in ne[:-1]:
        nb.append(nb[-1] * n)
    return addr, int(t), ne, tuple(nb)


def _get(space, d) -> np.ndarray:
    return space.ndarray(d[0], d[1], d[2], d[3]).reshape(tuple(reversed(d[2]))[2:])


def test_the_fused_norm_kernel_is_rms_norm_then_scale():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 300)) * 4).astype(np.float32)
    space = AddressSpace(0x7F00_0000_0000)
    dx, norm, fused, unfused = (_put(space, a) for a in (x, *(np.zeros_like(x) for _ in range(3))))
    _run(space, "rms_norm_scale_f32", [fused, dx], fp=(EPS, S))
    _run(space, "rms_norm_f32", [norm, dx], fp=(EPS,))
    _run(space, "scale_f32", [unfused, norm], fp=(S, 0.0))
    np.testing.assert_array_equal(_get(space, fused), _get(space, unfused))
    np.testing.assert_allclose(_get(space, fused), ops.rms_norm(x, EPS) * np.float32(S), rtol=0, atol=0)


def _swiglu_clamp64(g, u, limit):
    g, u = np.minimum(np.float64(g), limit), np.clip(np.float64(u), -limit, limit)
    return g / (1 + np.exp(-g)) * u


def test_the_cpu_reference_clamps_the_gate_from_above_and_up_from_both_sides():
    g = np.float32([-30, -2, -LIMIT, 0, 0.5, LIMIT, 3, 100])
    u = np.float32([5, -7, 0.2, 1, -0.1, 9, -9, 0.5])
    got = ops.swiglu_clamp(g, u, LIMIT)
    np.testing.assert_allclose(got, _swiglu_clamp64(g, u, LIMIT), rtol=1e-6, atol=1e-12)
    # gates LIMIT, 3 and 100 all give silu(LIMIT); up 9 and -9 are cut to the limit, 0.5 is not
    np.testing.assert_array_equal(got[5:], ops.silu(np.float32([LIMIT] * 3)) * np.float32([LIMIT, -LIMIT, 0.5]))
    assert got[0] != 0 and abs(got[0]) < 1e-9                # a very negative gate is not clamped
    np.testing.assert_array_equal(ops.glu(int(GluOp.SWIGLU_CLAMP), g, u, LIMIT), got)
    c = Ctx(Arena())       # the CPU backend reads the limit from op param 3
    a, b = c.new_input(F32, (8,), "g"), c.new_input(F32, (8,), "u")
    out = c.swiglu_clamp(a, b, LIMIT, "glu")
    assert out.param_i32(0) == GluOp.SWIGLU_CLAMP == 6 and out.param_f32(3) == np.float32(LIMIT)
    cpu = CpuBackend()
    for t, v in ((a, g), (b, u), (out, np.zeros(8, np.float32))):
        t.data = cpu.buffer_alloc(32)
        cpu.tensor_set(t.data, v)
    cpu.graph_compute(_graph(out), 0)
    np.testing.assert_array_equal(cpu.tensor_get(out.data, 32).view(np.float32), got)


def _gate_up(rng, k=96, m=40, n=1, e=0):
    """Weights scaled so that many gate and up values pass the limit."""
    shape = (e, m, k) if e else (m, k)
    wg, wu = ((rng.standard_normal(shape) * 0.4).astype(np.float32) for _ in range(2))
    return wg, wu, rng.standard_normal((n, k)).astype(np.float32)


@pytest.mark.parametrize("w", ["f32", "f16"])
def test_unfused_and_fused_swiglu_clamp_kernels_meet_the_cpu_reference(w):
    rng = np.random.default_rng(9)
    t = F16 if w == "f16" else F32
    wg, wu, x = _gate_up(rng, n=2)
    wg, wu = (a.astype(np.float16).astype(np.float32) for a in (wg, wu))
    gate, up = x @ wg.T, x @ wu.T
    assert (gate > LIMIT).any() and (up > LIMIT).any() and (up < -LIMIT).any()
    want = ops.swiglu_clamp(gate, up, LIMIT)
    space = AddressSpace(0x7F00_0000_0000)
    dst = _put(space, np.zeros_like(want))
    _run(space, "glu_swiglu_clamp_f32", [dst, _put(space, gate), _put(space, up)], fp=(LIMIT,))
    np.testing.assert_array_equal(_get(space, dst), want)
    fused = _put(space, np.zeros_like(want))
    _run(space, f"mul_mat_vec_glu_{w}", [fused, _put(space, wg, t), _put(space, wu, t), _put(space, x)],
         ip=(int(GluOp.SWIGLU_CLAMP),), fp=(LIMIT,))
    np.testing.assert_allclose(_get(space, fused), want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(_get(space, fused), _swiglu_clamp64(gate, up, LIMIT), rtol=1e-5, atol=1e-6)


def test_the_fused_expert_kernel_clamps_with_the_limit():
    rng = np.random.default_rng(11)
    wg, wu, x = _gate_up(rng, e=4)
    ids = np.int32([[2, 0]])                                    # (1 token, 2 used)
    gate = np.stack([wg[i] @ x[0] for i in ids[0]])[None]       # (T, n_used, M)
    up = np.stack([wu[i] @ x[0] for i in ids[0]])[None]
    space = AddressSpace(0x7F00_0000_0000)
    dst = _put(space, np.zeros_like(gate))
    d_ids = _put(space, ids, GGMLType.I32)
    _run(space, "mul_mat_id_vec_glu_f32", [dst, _put(space, wg), _put(space, wu), _put(space, x), d_ids],
         ip=(int(GluOp.SWIGLU_CLAMP),), fp=(LIMIT,))
    got = space.ndarray(dst[0], dst[1], dst[2], dst[3]).reshape(gate.shape)
    np.testing.assert_allclose(got, ops.swiglu_clamp(gate, up, LIMIT), rtol=2e-6, atol=2e-6)


def _ffn(n_tokens: int, moe: bool = False):
    """x -> RMS_NORM -> SCALE -> gate, up (F16 mat-muls, or the experts' over the ids) -> SWIGLU_CLAMP."""
    c = Ctx(Arena())
    L = {"x": c.new_input(F32, (128, n_tokens), "x")}
    h = c.scale(c.rms_norm(L["x"], EPS, "norm"), 4.0, "scaled")
    if moe:
        L["ids"] = c.new_input(GGMLType.I32, (2, n_tokens), "ids")
        L["wg"], L["wu"] = (c.new_tensor(F16, (128, 48, 4), n) for n in ("wg", "wu"))
        h3 = c.reshape(h, (128, 1, n_tokens), "scaled (reshaped)")
        gate, up = (c.mul_mat_id(L[n], h3, L["ids"], n[1:]) for n in ("wg", "wu"))
    else:
        L["wg"], L["wu"] = (c.new_tensor(F16, (128, 48), n) for n in ("wg", "wu"))
        gate, up = (c.mul_mat(L[n], h, n[1:]) for n in ("wg", "wu"))
    return c.swiglu_clamp(gate, up, LIMIT, "ffn_out"), L


def test_gate_up_swiglu_clamp_fuses_at_one_token_and_carries_its_limit():
    for moe, pattern in ((False, MMV_GLU), (True, MMID_GLU)):
        out, _ = _ffn(1, moe)
        g = _graph(out)
        plan = fusion_plan(g)
        i = next(i for i, f in plan.items() if f.pattern == pattern)
        launch = op_launches(lower_node(g, i, plan[i], 900))[-1]
        assert int(launch.params["ip"][0]) == GluOp.SWIGLU_CLAMP and launch.params["fp"][0] == np.float32(LIMIT)
        assert pattern not in {f.pattern for f in fusion_plan(_graph(_ffn(2, moe)[0])).values()}
        assert pattern not in {f.pattern for f in fusion_plan(g, upstream="d99724f2").values()}
    (launch,) = op_launches(lower_node(g, g.n_nodes - 1, None, 900))
    assert launch.kernel == "glu_swiglu_clamp_f32" and launch.params["fp"][0] == np.float32(LIMIT)


def test_d99724f2_refuses_a_graph_with_swiglu_clamp():
    """ggml d99724f2's ggml_glu_op ends at GEGLU_QUICK: SWIGLU_CLAMP cannot be in one of its graphs."""
    g = _graph(_ffn(1)[0])
    refuse_ops_after(g, "0c1e57098")
    with pytest.raises(GraphdiagError, match="SWIGLU_CLAMP.*'ffn_out'.*d99724f2"):
        refuse_ops_after(g, "d99724f2")
    drv = SimDriver(memory_bytes=16 << 20)
    gpu = GpuBackend(drv, E.EventBus(), RuntimeOptions(upstream="d99724f2"))
    try:
        with pytest.raises(GraphdiagError, match="SWIGLU_CLAMP"):
            gpu.graph_compute(g, 0)
    finally:
        gpu.close()
        drv.close()


def _place_and_fill(g: Graph, leaves: dict[str, Tensor], alloc, write) -> None:
    rng = np.random.default_rng(5)
    place_tensors(g, alloc)
    for name, t in sorted(leaves.items()):
        n = int(np.prod(t.ne))
        if name == "ids":
            v = np.int32([2, 0, 1, 3, 3, 1][:n])
        else:
            v = rng.standard_normal(n) * (0.3 if t.type == F16 else 2)
            v = v.astype(np.float16 if t.type == F16 else np.float32)
        write(t.data, v)


@pytest.mark.parametrize("n_tokens", [1, 3])
def test_a_simulated_gpu_run_fuses_and_meets_the_cpu_backend(n_tokens):
    """At 1 token the norm + scale and the gate/up + SWIGLU_CLAMP are one launch each; at 3 the norm still
    fuses and the GLU runs alone (glu_swiglu_clamp_f32). Either way the output is the CPU backend's."""
    cpu = CpuBackend()
    out, L = _ffn(n_tokens)
    g = _graph(out)
    _place_and_fill(g, L, cpu.buffer_alloc, cpu.tensor_set)
    cpu.graph_compute(g, 0)
    want = cpu.tensor_get(out.data, out.nbytes()).view(np.float32)
    bus, fused = E.EventBus(), []
    bus.subscribe(lambda e: fused.append(e.pattern) if isinstance(e, E.FusionApplied) else None)
    drv = SimDriver(memory_bytes=16 << 20)
    gpu = GpuBackend(drv, bus, RuntimeOptions())
    try:
        out, L = _ffn(n_tokens)
        g = _graph(out)
        _place_and_fill(g, L, gpu.buffer_alloc, gpu.tensor_set)
        gpu.graph_compute(g, 0)
        got = gpu.tensor_get(out.data, out.nbytes()).view(np.float32)
    finally:
        gpu.close()
        drv.close()
    bus.flush()
    assert sorted(fused) == sorted([RMS_NORM_SCALE] + ([MMV_GLU] if n_tokens == 1 else []))
    assert (np.abs(want) > 0).all() and np.abs(want).max() <= LIMIT * LIMIT / (1 + np.exp(-LIMIT)) + 1e-6
    # at 3 tokens the gate/up mat-muls (48 rows: MMF refuses them) take upstream's cuBLAS path, whose GEMM
    # result is F16 (lowering._cublas_f16): half an F16 ulp of each gate and up value (up to ~8 here: 3.4e-3
    # after the GLU), where the CPU backend keeps float32
    tol = 2e-5 if n_tokens == 1 else 5e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)

"""CpuBackend: a small decoder layer built with Ctx runs node by node and matches cpu_ops composed by hand."""

import re

import numpy as np
import pytest

from graphdiag.backends import cpu_ops as ops
from graphdiag.backends.cpu import CpuBackend
from graphdiag.errors import GraphdiagError
from graphdiag.ir import Arena, GGMLType as G, GluOp, Graph, Op, Tensor
from graphdiag.ir.build import Ctx
from graphdiag.memory import AddressSpace, quantize_q8_0

D, H, HKV, T, N_KV, FF, E, N_USED, VOCAB = 16, 4, 2, 2, 8, 64, 4, 2, 32
EPS, BASE, SCALE = 1e-5, 10000.0, 0.25


def build(ctx: Ctx):
    """One attention + MoE/dense FFN layer. Returns (graph output, {name: leaf tensor})."""
    dm, L = D * H, {}
    leaf = lambda t, ne, name: L.setdefault(name, ctx.new_tensor(t, ne, name))  # noqa: E731
    for n, ne in [("tok", (dm, VOCAB)), ("wq", (dm, dm)), ("wk", (dm, D * HKV)), ("wv", (dm, D * HKV)),
                  ("wo", (dm, dm)), ("up", (dm, FF)), ("gate", (dm, FF)), ("down", (FF, dm)), ("router", (dm, E))]:
        leaf(G.Q8_0 if n in ("tok", "wq", "up", "down") else G.F16, ne, n)
    leaf(G.F32, (dm,), "norm")
    leaf(G.F16, (dm, FF, E), "exps")
    kc, vc = leaf(G.F16, (D * HKV, N_KV), "kc"), leaf(G.F16, (D * HKV, N_KV), "vc")
    for n, t, ne in [("ids", G.I32, (T,)), ("pos", G.I32, (T,)), ("kvi", G.I32, (T,)), ("mask", G.F32, (N_KV, T))]:
        L[n] = ctx.new_input(t, ne, n)
    x = ctx.get_rows(L["tok"], L["ids"], "inp")
    h = ctx.mul(ctx.rms_norm(x, EPS, "n"), L["norm"], "nw")
    q = ctx.rope(ctx.reshape(ctx.mul_mat(L["wq"], h, "q"), (D, H, T)), L["pos"], D, BASE, "qr")
    k = ctx.rope(ctx.reshape(ctx.mul_mat(L["wk"], h, "k"), (D, HKV, T)), L["pos"], D, BASE, "kr")
    ks = ctx.set_rows(kc, ctx.reshape(k, (D * HKV, T)), L["kvi"], "ks")
    vs = ctx.set_rows(vc, ctx.mul_mat(L["wv"], h, "v"), L["kvi"], "vs")
    kv_nb = (2, 2 * D, 2 * D * HKV)
    a = ctx.flash_attn_ext(q, ctx.view(ks, (D, HKV, N_KV), kv_nb), ctx.view(vs, (D, HKV, N_KV), kv_nb),
                           L["mask"], SCALE, "fa")
    x = ctx.add(ctx.mul_mat(L["wo"], ctx.reshape(a, (D * H, T)), "o"), x, "res")
    g = ctx.glu_split(ctx.mul_mat(L["gate"], x, "g"), ctx.mul_mat(L["up"], x, "u"), GluOp.SWIGLU, "sw")
    x = ctx.add(ctx.mul_mat(L["down"], g, "d"), x, "res2")
    sel = ctx.top_k(ctx.soft_max(ctx.mul_mat(L["router"], x, "r"), "p"), N_USED, "sel")
    moe = ctx.mul_mat_id(L["exps"], ctx.reshape(x, (dm, 1, T)), sel, "moe")
    return ctx.cpy(moe, ctx.new_tensor(G.F16, moe.ne, "moe16"), "out"), L


def allocate(backend: CpuBackend, g: Graph) -> None:
    """data for every leaf and node: views at view_src.data + view_offs, others a fresh buffer."""
    for idx in list(g.leafs) + list(g.nodes):
        t = g.arena.rec[idx]
        if t["view_src"]:
            t["data"] = g.arena.rec[g.arena.index(int(t["view_src"]))]["data"] + t["view_offs"]
        elif not t["data"]:
            t["data"] = backend.buffer_alloc(Tensor(g.arena, int(idx)).nbytes())


def fill(backend, t, values):
    backend.space.ndarray(t.data, t.type, t.ne, t.nb)[...] = values


def view(backend, t):
    return backend.space.ndarray(t.data, t.type, t.ne, t.nb)


@pytest.fixture
def layer():
    rng = np.random.default_rng(3)
    arena = Arena()
    out, L = build(Ctx(arena))
    g = Graph(arena)
    g.build_forward_expand(out)
    be = CpuBackend()
    allocate(be, g)
    for name, t in L.items():
        shape = t.ne[::-1]
        if name in ("ids", "pos", "kvi"):
            fill(be, t, {"ids": [[[[5, 30]]]], "pos": [[[[3, 4]]]], "kvi": [[[[3, 4]]]]}[name])
        elif name == "mask":
            m = np.zeros(shape, np.float32)
            m[..., 5:] = -np.inf
            m[..., 0, 4] = -np.inf
            fill(be, t, m)
        elif t.type == G.Q8_0:
            fill(be, t, quantize_q8_0(rng.standard_normal(shape).astype(np.float32) * 0.3))
        else:
            fill(be, t, rng.standard_normal(shape) * 0.3)
    return be, g, out, L


def test_layer_matches_cpu_ops_composed_by_hand(layer):
    be, g, out, L = layer
    v = {n: view(be, t).copy() for n, t in L.items()}
    kc, vc = v["kc"], v["vc"]
    x = ops.get_rows(v["tok"], v["ids"])
    h = ops.mul(ops.rms_norm(x, EPS), v["norm"])
    rope = lambda y, heads: ops.rope(y.reshape(1, T, heads, D), v["pos"], D, BASE)  # noqa: E731
    q, k = rope(ops.mul_mat(v["wq"], h), H), rope(ops.mul_mat(v["wk"], h), HKV)
    ops.set_rows(kc, k, v["kvi"])
    ops.set_rows(vc, ops.mul_mat(v["wv"], h), v["kvi"])
    a = ops.flash_attn_ext(q, kc.reshape(1, N_KV, HKV, D), vc.reshape(1, N_KV, HKV, D), v["mask"], SCALE)
    x = ops.add(ops.mul_mat(v["wo"], a.reshape(1, 1, T, D * H)), x)
    x = ops.add(ops.mul_mat(v["down"], ops.swiglu(ops.mul_mat(v["gate"], x), ops.mul_mat(v["up"], x))), x)
    sel = ops.top_k(ops.soft_max(ops.mul_mat(v["router"], x)), N_USED)
    moe = ops.mul_mat_id(v["exps"], x.reshape(1, T, 1, D * H), sel)
    be.graph_compute(g, 0)
    np.testing.assert_allclose(view(be, out), moe.astype(np.float16), rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(view(be, L["kc"]), kc)
    assert be.count == sum(1 for t in g.iter_nodes() if t.op not in (Op.RESHAPE, Op.VIEW))


def test_nodes_without_compute_flag_are_skipped(layer):
    be, g, out, L = layer
    for t in g.iter_nodes():
        t.flags = 0
    be.graph_compute(g, 0)
    assert be.count == 0 and not view(be, out).any()


def test_unknown_op_names_the_op(layer):
    """An op the CPU backend has no method for (every Op graphdiag builds has one: a raw ggml op number here,
    GGML_OP_SUM) is named in the error, with its node."""
    be, g, out, L = layer
    g.node(0).r["op"] = 13
    with pytest.raises(GraphdiagError, match=f"op 13 .*{re.escape(g.node(0).name)}"):
        be.graph_compute(g, 0)


def test_reads_tensors_in_other_address_spaces():
    gpu = CpuBackend("GPU", AddressSpace(0x2000_0000_0000, name="GPU"))
    cpu = CpuBackend("CPU", resolve=None)
    both = CpuBackend("CPU", cpu.space, resolve=[cpu.space, gpu.space])
    a = gpu.buffer_alloc(16)
    both.tensor_set(a, np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(gpu.tensor_get(a, 16).view(np.float32), [0, 1, 2, 3])
    with pytest.raises(GraphdiagError, match="none of"):
        cpu.tensor_get(a, 16)

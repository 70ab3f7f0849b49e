"""The graph allocator: best-fit free list (ggml_dyn_tallocr), tensor lifetimes, stable placement, realloc accounting."""

import pytest

from graphdiag import events as E
from graphdiag.backends.cpu import CpuBackend
from graphdiag.counters import Counters
from graphdiag.ir.ops import TensorFlag
from graphdiag.ir.tensor import Tensor
from graphdiag.model.build import DECODE, GraphParams, build_graph
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model
from graphdiag.sched.alloc import FreeList, GraphAllocator


def test_free_list_merges_and_tracks_the_high_water_mark():
    fl = FreeList()
    a, b, c = fl.alloc(100), fl.alloc(300), fl.alloc(256)
    assert (a, b, c) == (0, 256, 768) and fl.high == 1024
    fl.free(a, 100)
    assert fl.alloc(200) == 0                 # the only hole that fits
    fl.free(0, 256)
    fl.free(b, 300)                           # merges with the hole before it
    assert fl.blocks == [[0, 768]]
    assert fl.alloc(700) == 0 and fl.high == 1024
    fl.free(c, 256)
    fl.free(0, 700)
    assert fl.blocks == [] and fl.top == 0    # all free again: back to the open end


def test_free_list_takes_the_best_fitting_hole_as_ggml_dyn_tallocr_alloc():
    """The smallest free block that fits, the last of equal ones (`<=`), never the top while a hole fits;
    first-fit would take the first hole."""
    fl = FreeList()
    offs = [fl.alloc(n) for n in (512, 256, 256, 256, 256, 256)]   # 0, 512, 768, 1024, 1280, 1536
    for i in (0, 2, 4):                                          # holes: 512 @ 0, 256 @ 768, 256 @ 1280
        fl.free(offs[i], 512 if i == 0 else 256)
    assert fl.blocks == [[0, 512], [768, 256], [1280, 256]]
    assert fl.alloc(200) == 1280              # the best fit, the later of two equal holes
    assert fl.alloc(256) == 768               # the other 256 hole, not the 512 one before it
    assert fl.alloc(300) == 0 and fl.top == 1792
    assert fl.alloc(300) == 1792              # no hole fits: the top


@pytest.fixture(scope="module")
def model():
    return create_model(PRESETS["tiny"], with_data=False)


def build(model, n_tokens, n_kv=256):
    model.arena.reset()
    return build_graph(model, GraphParams(n_tokens, n_tokens, n_tokens, DECODE, n_kv)).graph


def lifetimes(g) -> dict[int, list[int]]:
    """slot -> [first node position, last position it must stay intact] for every allocated tensor: an input
    from before the first node (placed at the split's start) to its last reader, outputs and the token ids
    (llama.cpp keeps them in its CPU buffer: alloc_order.held_inputs) to the end."""
    span = {}
    nodes = list(g.iter_nodes())
    held = nodes[0].src[1].idx
    for i, t in enumerate(nodes):
        for s in [*t.src, t]:
            if s is None:
                continue
            root = s.view_src if s.view_src is not None and s.idx >= g.arena.mark else s
            if root.idx < g.arena.mark:
                continue
            keep = root.flags & TensorFlag.OUTPUT or root.idx == held
            first = -1 if root.flags & TensorFlag.INPUT else span.get(root.idx, [i])[0]
            span[root.idx] = [first, 10**9 if keep else i]
    return span


def test_live_tensors_never_overlap(model):
    g = build(model, 4)
    alloc = GraphAllocator([CpuBackend()])
    alloc.alloc_graph(g, [0] * g.n_nodes, [0] * len(g.leafs))
    span = lifetimes(g)
    rng = {i: (Tensor(g.arena, i).data, Tensor(g.arena, i).data + Tensor(g.arena, i).nbytes()) for i in span}
    assert all(a != 0 for a, _ in rng.values())
    items = sorted(span)
    n_inplace = 0
    for x in items:
        for y in items:
            if x < y and span[x][0] <= span[y][1] and span[y][0] <= span[x][1]:
                if _in_place(g, x, y, span):
                    n_inplace += 1
                    continue
                assert rng[x][1] <= rng[y][0] or rng[y][1] <= rng[x][0], (Tensor(g.arena, x), Tensor(g.arena, y))
    assert n_inplace > 0          # ADD / MUL / ROPE ... take over their last-read parent's memory
    # memory is reused: the buffer is far smaller than the sum of the tensors
    assert alloc.need[0] < sum(b - a for a, b in rng.values()) / 2


def _in_place(g, x, y, span):
    """y took x's memory in place (ggml-alloc): y reads x (or a view of it) and x dies as y is made."""
    from graphdiag.sched.alloc import INPLACE_OPS
    t, u = Tensor(g.arena, x), Tensor(g.arena, y)
    reads = {s.idx for s in u.src if s is not None} | {s.view_src.idx for s in u.src
                                                        if s is not None and s.view_src is not None}
    return u.op in INPLACE_OPS and x in reads and span[x][1] == span[y][0] and t.data == u.data


def test_views_take_their_source_address(model):
    g = build(model, 2)
    GraphAllocator([CpuBackend()]).alloc_graph(g, [0] * g.n_nodes, [0] * len(g.leafs))
    for t in g.iter_nodes():
        if t.view_src is not None and t.view_src.idx >= g.arena.mark:
            assert t.data == t.view_src.data + t.view_offs


def test_placement_is_stable_and_reallocs_are_counted(model):
    bus, counters = E.EventBus(), Counters()
    bus.subscribe(counters)
    alloc = GraphAllocator([CpuBackend()], bus)

    def place(n_tokens, n_kv=256):
        g = build(model, n_tokens, n_kv)
        replanned = alloc.alloc_graph(g, [0] * g.n_nodes, [0] * len(g.leafs))
        return replanned, g.arena.rec["data"][g.nodes].copy(), alloc.buffers[0]

    with counters.expect(reallocs_changed=1, reallocs_same=0):
        r1, d1, buf1 = place(4)
    assert r1
    with counters.expect(reallocs_changed=0, reallocs_same=0):
        r2, d2, buf2 = place(4)               # the same graph rebuilt: same plan, same addresses
    assert not r2 and (d1 == d2).all() and buf1 == buf2
    with counters.expect(reallocs_changed=0):
        r3, d3, _ = place(2)                  # smaller tensors still fit their slots (ggml keeps the plan)
    assert not r3 and (d3 == d1).all()
    with counters.expect(reallocs_changed=1):
        r4, d4, buf4 = place(8)               # larger: re-plan, the buffer grows and addresses move
    assert r4 and buf4[1] > buf1[1] and not (d4 == d1).all()
    with counters.expect(reallocs_same=1):
        alloc.nodes = []                      # force a re-plan of a graph of the same size
        place(8)


def test_a_source_placed_only_at_its_readers_turn_is_still_placed(model, monkeypatch):
    """The walk skips looking for sources to place when every source is an input or an earlier node
    (_late_sources); an owned leaf that is no input must be found and placed, as with the full walk."""
    from graphdiag.ir.columns import Columns
    from graphdiag.sched import alloc
    g = build(model, 4)
    pos = next(i for i in g.leafs.tolist() if Tensor(g.arena, i).name == "inp_pos")
    assert not alloc._late_sources(Columns(g.arena), g.nodes, g.leafs)
    t = Tensor(g.arena, pos)
    t.flags = t.flags & ~TensorFlag.INPUT
    try:
        assert alloc._late_sources(Columns(g.arena), g.nodes, g.leafs)
        plans = []
        for full in (False, True):
            if full:         # the full walk, whatever _late_sources says
                monkeypatch.setattr(alloc, "_late_sources", lambda *a: True)
            a = GraphAllocator([CpuBackend()])
            a.reserve(g, [0] * g.n_nodes, [0] * len(g.leafs), Columns(g.arena))
            plans.append((a.nodes, a.leafs))
        assert plans[0] == plans[1]
        assert plans[0][1][g.leafs.tolist().index(pos)] is not None        # inp_pos got memory
    finally:
        t.flags = t.flags | TensorFlag.INPUT



def test_blocks_start_at_the_buffer_types_alignment():
    """ggml-alloc rounds each block to its buffer type's alignment: 32 bytes for the CPU's (TENSOR_ALIGNMENT),
    128 for CUDA's (ggml_backend_cuda_buffer_type_get_alignment); graphdiag's 256-byte memory alignment is not
    the allocator's."""
    from graphdiag.backends.gpu.backend import GpuBackend
    from graphdiag.ir.arena import Arena
    from graphdiag.ir.build import Ctx
    from graphdiag.ir.dtypes import GGMLType
    from graphdiag.ir.graph import Graph
    assert CpuBackend.alignment == 32 and GpuBackend.alignment == 128

    class Cuda128(CpuBackend):
        alignment = 128

    def offsets(backend):
        c = Ctx(Arena())
        x = c.new_input(GGMLType.F32, (10,), "x")                  # 40 bytes
        a = c.scale(x, 2.0, "a")
        b = c.add(a, x, "b")                                       # a's last reader: b takes a over
        y = c.add(b, c.scale(x, 3.0, "c"), "y")
        g = Graph(c.arena)
        g.build_forward_expand(y)
        alloc = GraphAllocator([backend])
        alloc.alloc_graph(g, [0] * g.n_nodes, [0] * len(g.leafs))
        base = min(t.data for t in (x, a))
        return [t.data - base for t in (x, a, b, y)], alloc.need[0]
    # two blocks of 40 -> 64 bytes: c, x's last reader, takes x over in place (a graph input is no output:
    # ggml_gallocr_allocate_node asks only that of a parent)
    assert offsets(CpuBackend()) == ([0, 64, 64, 64], 128)
    assert offsets(Cuda128()) == ([0, 128, 128, 128], 256)


def test_the_context_reserve_plans_llama_cpps_compute_buffer():
    """llama-server 0c1e57098 on the exported tiny F16 (n_ctx 4096, n_ubatch 512, -np 4: 4 sequences, 4 outputs)
    printed "CUDA0 compute buffer size is 15.2599 MiB" (H200, 2026-12-06, /work/.device/1/llama-server-np4.log):
    its worst-case reserve (Context.sched_reserve) with the inputs as llama.cpp's scheduler places them
    (sched/alloc_order.py: copies at the split's start, freed after their last reader, I64 cell indices)
    plans 16,001,152 bytes, besides the token ids graphdiag keeps on the GPU (2048 bytes at 512 tokens)."""
    from graphdiag.sched.context import make_context

    class Cuda128(CpuBackend):
        alignment = 128

    ctx = make_context(create_model(PRESETS["tiny"], with_data=False), [Cuda128()], n_ubatch=512, n_seq_max=4,
                       n_outputs_max=4)
    size = ctx.sched.galloc.buffers[0][1] - 512 * 4
    assert size == 16_001_152 and f"{size / 2**20:.4f}" == "15.2599"
    ctx.sched.close()

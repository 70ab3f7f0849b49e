"""The scheduler: backend assignment, splits with input CPY nodes, uids, deterministic re-splits."""

import dataclasses

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.cpu import CpuBackend
from graphdiag.ir.ops import Op, TensorFlag
from graphdiag.memory import AddressSpace
from graphdiag.model.build import DECODE, GraphParams, build_graph
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model, load_model
from graphdiag.sched.scheduler import Scheduler

# moe-tiny with a small vocabulary and cache: the same graph shape, cheaper weights
CFG = dataclasses.replace(PRESETS["moe-tiny"], n_vocab=512, n_ctx=512)


@pytest.fixture(scope="module")
def model():
    return create_model(CFG, seed=5)


def gpu_cpu():
    """A CpuBackend standing in for the GPU (own address space) and the CPU: cross-backend copies are real."""
    cpu = CpuBackend("CPU")
    gs = AddressSpace(base=0x7000_0000_0000, name="GPU")
    return CpuBackend("GPU", space=gs, resolve=[gs, cpu.space]), cpu


def scheduled(model, n_cpu_moe, n_tokens=2):
    gpu, cpu = gpu_cpu()
    bus, rec = E.EventBus(), E.Recorder()
    bus.subscribe(rec)
    sched = Scheduler([gpu, cpu], model.arena, bus)
    for wb in load_model(model, gpu, cpu, n_cpu_moe):
        sched.register_buffer(wb.addr, wb.nbytes, wb.backend)
    model.arena.reset()
    b = build_graph(model, GraphParams(n_tokens, n_tokens, n_tokens, DECODE, 256))
    sched.alloc_graph(b.graph)
    return sched, b, rec


def test_without_offload_everything_is_one_gpu_split(model):
    sched, b, rec = scheduled(model, 0)
    assert [(sched.backends[s.backend].name, s.inputs) for s in sched.splits] == [("GPU", [])]
    assert sched.splits[0].graph.n_nodes == b.graph.n_nodes
    (ev,) = rec.of(E.GraphSplit)
    assert ev.backends == ("GPU",) and ev.uids == (sched.splits[0].graph.uid,)


def test_n_cpu_moe_puts_the_experts_of_the_first_layers_on_the_cpu(model):
    sched, b, rec = scheduled(model, 2)
    names = [sched.backends[s.backend].name for s in sched.splits]
    assert names == ["GPU", "CPU", "GPU", "CPU", "GPU"]
    for li, sp in ((0, sched.splits[1]), (1, sched.splits[3])):
        nodes = list(sp.graph.iter_nodes())
        cpys, rest = nodes[:2], nodes[2:]
        assert {c.src[0].name for c in cpys} == {f"ffn_norm-{li} (reshaped)", f"ffn_moe_topk-{li}"}
        assert [n.name for n in rest] == [f"ffn_moe_{n}-{li}" for n in ("gate", "up", "swiglu", "down")]
    for li, sp in ((0, sched.splits[2]), (1, sched.splits[4])):
        first, second = sp.graph.node(0), sp.graph.node(1)
        assert first.op == Op.CPY and first.src[0].name == f"ffn_moe_down-{li}"
        assert not first.flags & TensorFlag.COMPUTE and first.name == f"GPU#ffn_moe_down-{li}#0"
        assert second.name == f"ffn_moe_weighted-{li}" and second.src[0] == first   # rewired to the copy
        assert sp.inputs == [(first.idx, first.src[0].idx, 1)]
        assert sched.galloc.buffers[0][0] <= first.data < sum(sched.galloc.buffers[0])
    uids = [s.graph.uid for s in sched.splits]
    assert len(set(uids)) == 5 and min(uids) > b.graph.uid
    assert rec.of(E.GraphSplit)[0].n_nodes == tuple(s.graph.n_nodes for s in sched.splits)
    # layers 2 and 3 keep their experts on the GPU
    assert all(sched.backends[s.backend].name == "GPU" for s in sched.splits[4:])


def zero_inputs(sched, b) -> None:
    """Every input of the graph written (zeros: token 0, position 0, cell 0, row 0), as llama.cpp's set_inputs
    before each compute: a graph's nodes may take an input's memory after its last reader (ggml-alloc)."""
    for t in (b.inputs.tokens, b.inputs.pos, b.inputs.k_idxs, b.inputs.v_idxs, b.inputs.kq_mask, b.inputs.out_ids):
        sched.backend_of(t).tensor_set(t.data, np.zeros(t.nbytes(), np.uint8))


def test_uids_stay_while_allocated_and_change_on_each_split(model):
    sched, b, rec = scheduled(model, 2)
    uids = [s.graph.uid for s in sched.splits]
    keys = [s.graph.first_node_addr for s in sched.splits]
    for _ in range(2):
        zero_inputs(sched, b)
        sched.graph_compute(b.graph)
    assert [s.graph.uid for s in sched.splits] == uids and len(rec.of(E.GraphSplit)) == 1
    sched.reset()
    zero_inputs(sched, b)
    sched.graph_compute(b.graph)              # not allocated: split again, fresh uids
    assert all(new > old for new, old in zip((s.graph.uid for s in sched.splits), uids))
    # the same graph re-split: the copies are made in the same slots again (stable graph keys)
    assert [s.graph.first_node_addr for s in sched.splits] == keys
    assert sched.splits[2].graph.node(1).src[0] == sched.splits[2].graph.node(0)


def test_rebuild_after_reset_gives_the_same_split_structs(model):
    sched, b, _ = scheduled(model, 2)
    before = [(s.graph.first_node_addr, model.arena.raw[s.graph.nodes].tobytes()) for s in sched.splits]
    model.arena.reset()
    sched.reset()
    b2 = build_graph(model, GraphParams(2, 2, 2, DECODE, 256))
    sched.alloc_graph(b2.graph)
    after = [(s.graph.first_node_addr, model.arena.raw[s.graph.nodes].tobytes()) for s in sched.splits]
    assert after == before                    # same addresses, same bytes (same plan, same data)


@pytest.mark.parametrize("n_cpu_moe", [0, 2])
def test_the_allocator_shares_the_split_snapshot_only_when_splitting_wrote_nothing(model, n_cpu_moe, monkeypatch):
    """Input copies add structs and rewire their readers: the allocator must then read the arena afresh, and
    its plan must be the one a fresh snapshot gives."""
    from graphdiag.sched.alloc import GraphAllocator
    seen, orig = [], GraphAllocator.alloc_graph

    def spy(self, g, nb, lb, col=None):
        seen.append(col)
        return orig(self, g, nb, lb, col)

    monkeypatch.setattr(GraphAllocator, "alloc_graph", spy)
    sched, b, _ = scheduled(model, n_cpu_moe)
    copies = any(sp.inputs for sp in sched.splits)
    assert copies == (n_cpu_moe > 0) and (seen[0] is None) == copies
    plan = (list(sched.galloc.nodes), list(sched.galloc.leafs))
    fresh = GraphAllocator(sched.backends)
    orig(fresh, sched.graph, [sp.backend for sp in sched.splits for _ in range(sp.i_end - sp.i_start)],
         sched._leaf_backends)
    assert (fresh.nodes, fresh.leafs) == plan


@pytest.mark.parametrize("n_cpu_moe", [0, 2])
def test_assignment_shortcut_gives_what_the_rules_give(model, n_cpu_moe):
    """With no pin and every persistent tensor on backend 0, _assign puts every node on 0 without walking
    the rules; a pin that pins nothing makes it walk them: the two agree (order of the map included)."""
    from graphdiag.ir.columns import Columns
    sched, b, _ = scheduled(model, n_cpu_moe)
    sched._unwire(b.graph)
    got = list(sched._assign(b.graph, Columns(model.arena)).items())
    sched.pin = lambda name: None
    assert got == list(sched._assign(b.graph, Columns(model.arena)).items())
    assert (set(v for _, v in got) == {0}) == (n_cpu_moe == 0)

"""The backend scheduler, modelled on ggml_backend_sched: backend assignment, splits, input copies, uids.

Backends are in priority order (GPU first, CPU last); backend 0 is the default. A node runs where the persistent
tensors it reads live (weights pin their ops: with --n-cpu-moe the expert stacks are in CPU memory, so their
MUL_MAT_ID run on the CPU); otherwise where `pin` puts it by name (a layer split's norms, sched/devices.py);
otherwise on the CPU when its computed sources all run there (the GLU between two CPU expert mat-muls);
otherwise on the GPU backend of the last node placed on one (ggml's "expand gpu down"; on one GPU, the
default backend). Splits are maximal runs of nodes on one backend. A split that reads
a tensor produced on another backend gets, at its start, a CPY node (src[0] = the producer, no COMPUTE flag: the
scheduler copies before computing the split, as ggml's split inputs) and its consumers are rewired to the copy.
Splitting gives the whole graph a uid and every split a fresh uid (ggml_graph_next_uid); it happens only when the
scheduler is not allocated, so while it stays allocated the uids do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import events as E
from ..backends.base import Backend
from ..errors import InternalError
from ..ir.arena import TENSOR_SIZE, Arena
from ..ir.build import Ctx
from ..ir.columns import Columns
from ..ir.graph import Graph, graph_view, next_uid
from ..ir.ops import Op, TensorFlag
from ..ir.tensor import Tensor
from .alloc import GraphAllocator


@dataclass
class Split:
    """One contiguous range [i_start, i_end) of the scheduler's node list, run on one backend."""

    backend: int
    i_start: int
    i_end: int
    graph: Graph
    inputs: list[tuple[int, int, int]]   # (copy slot, source slot, source backend), copied before compute


def is_sched_copy(t: Tensor) -> bool:
    """A scheduler-made input copy: op CPY without the COMPUTE flag (graph-built CPY nodes have it)."""
    return t.op == Op.CPY and not (t.flags & TensorFlag.COMPUTE)


class Scheduler:
    def __init__(self, backends: list[Backend], arena: Arena, bus: E.EventBus | None = None, pin=None, copier=None,
                 upstream: str = "0c1e57098"):
        """`pin(name)`: a backend index for a node by name, or None; `copier(src, dst, src_be, dst_be)`: copies
        a split input between two devices and returns True (False: the default copy through the host)."""
        if not backends:
            raise ValueError("a scheduler needs at least one backend")
        self.backends = list(backends)
        self.arena = arena
        self.bus = bus
        self.galloc = GraphAllocator(self.backends, bus, upstream)
        self.owners: list[tuple[int, int, int]] = []   # (address, bytes, backend) of persistent buffers
        self.splits: list[Split] = []
        self.graph: Graph | None = None                 # the graph copy: split inputs + nodes
        self.is_reset = True
        self.is_alloc = False
        self._region: tuple[Graph, int, int] | None = None   # (graph, first slot, end slot) of our copies
        self._slot_backend: dict[int, int] = {}
        self._leaf_backends: list[int] = []
        self._col: Columns | None = None                # the arena's fields as the last split read them
        self._runtimes = [be.runtime for be in self.backends if be.is_gpu]
        self.step = -1
        self.pin, self.copier = pin, copier

    @property
    def step(self) -> int:
        """The step in progress (the context sets it as each starts); the GPU backends' runtimes take it too,
        for the events they emit."""
        return self._step

    @step.setter
    def step(self, step: int) -> None:
        self._step = step
        for rt in self._runtimes:
            rt.step = step

    # -- setup ----------------------------------------------------------------------------------------------
    def register_buffer(self, addr: int, nbytes: int, backend: Backend) -> None:
        """Declare a persistent buffer (weights, KV cache): ops reading tensors in it run on `backend`."""
        self.owners.append((addr, nbytes, self.backends.index(backend)))

    def owner(self, addr: int) -> int | None:
        for a, n, b in self.owners:
            if a <= addr < a + n:
                return b
        return None

    # -- ggml_backend_sched API ------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the split/allocation (ggml_backend_sched_reset); the next compute splits and allocates anew."""
        self.is_reset = True
        self.is_alloc = False

    def reserve(self, graph: Graph) -> None:
        """ggml_backend_sched_reserve: split `graph` (new uids) and plan every tensor's place in it, the
        buffers grown to fit (never shrunk), then reset: the next graph computed is split again and placed
        by this plan while it fits (GraphAllocator.needs_realloc). Nothing is computed or reported: no step's
        graph was re-planned (SchedRealloc)."""
        self._split_graph(graph, reserve=True)
        self.galloc.reserve(self.graph, self._node_backends(), self._leaf_backends, report=False)
        self.reset()

    def _node_backends(self) -> list[int]:
        nb = [0] * self.graph.n_nodes
        for sp in self.splits:
            nb[sp.i_start:sp.i_end] = [sp.backend] * (sp.i_end - sp.i_start)
        return nb

    def alloc_graph(self, graph: Graph) -> None:
        """Assign, split (new uids), let each backend optimise its split, then place buffers."""
        self._split_graph(graph)
        nb = self._node_backends()
        self.galloc.step = self.step
        # splitting that made no input copies wrote nothing to the arena: the allocator reads the same snapshot
        col = self._col
        shared = col is not None and col.top == self.arena.top and not any(sp.inputs for sp in self.splits)
        self.galloc.alloc_graph(self.graph, nb, self._leaf_backends, col if shared else None)
        self.is_alloc = True
        if self.bus is not None:
            devices = tuple(self._device_of(self.backends[s.backend]) for s in self.splits)
            self.bus.emit(E.GraphSplit(
                step=self.step, n_splits=len(self.splits),
                backends=tuple(self.backends[s.backend].name for s in self.splits),
                uids=tuple(s.graph.uid for s in self.splits),
                n_nodes=tuple(s.graph.n_nodes for s in self.splits),
                devices=devices if max(devices, default=0) > 0 else ()))

    @staticmethod
    def _device_of(be: Backend) -> int:
        """The device a backend's work runs on; -1 for the CPU backend."""
        return be.runtime.device if be.is_gpu else -1

    def graph_compute(self, graph: Graph) -> None:
        """ggml_backend_sched_graph_compute: (re)allocate if needed, then copy inputs and compute each split."""
        if not self.is_reset and not self.is_alloc:
            self.reset()
        if not self.is_alloc:
            self.alloc_graph(graph)
        for i, sp in enumerate(self.splits):
            be = self.backends[sp.backend]
            for cpy, src, sb in sp.inputs:
                self._copy_input(Tensor(self.arena, src), Tensor(self.arena, cpy), self.backends[sb], be)
            be.graph_compute(sp.graph, i)

    def backend_of(self, t: Tensor) -> Backend:
        """The backend holding tensor `t`'s data (for reading outputs)."""
        b = self.owner(t.data)
        if b is None:
            b = self._slot_backend.get(t.idx)
        return self.backends[b if b is not None else 0]

    def close(self) -> None:
        self.galloc.close()

    # -- splitting ------------------------------------------------------------------------------------------
    def _split_graph(self, graph: Graph, reserve: bool = False) -> None:
        self.is_reset = False
        graph.uid = next_uid()                      # the whole graph first, as ggml_backend_sched_split_graph
        self._unwire(graph)
        col = self._col = Columns(self.arena)   # the sources as rewired back; _make_inputs rewires again
        order = graph.nodes.tolist()
        slot_b = self._assign(graph, col)
        self._slot_backend = slot_b
        runs = self._runs(order, slot_b)
        self._rewind_region(graph)
        start = self.arena.top
        nodes, self.splits = [], []
        crossing = len(set(slot_b.values())) > 1       # else no source lives on another backend: no copies
        for b, i0, i1 in runs:
            inputs = self._make_inputs(order[i0:i1], b, slot_b, col) if crossing else []
            first = len(nodes)
            nodes += [c for c, _, _ in inputs] + order[i0:i1]
            self.splits.append(Split(b, first, len(nodes), None, inputs))
        self._region = (graph, start, self.arena.top)
        self.graph = Graph(self.arena, nodes, graph.leafs, uid=graph.uid)
        self.galloc.deps = {}
        for i, sp in enumerate(self.splits):
            sp.graph = graph_view(self.graph, sp.i_start, sp.i_end)
            self.backends[sp.backend].graph_optimize(sp.graph, i, self.galloc.deps, reserve)
            # a backend may reorder its split (concurrent streams): placement follows the order it left
            self.graph.nodes[sp.i_start:sp.i_end] = sp.graph.nodes
        for sp in self.splits:
            sp.graph.uid = next_uid()
        self._leaf_backends = [slot_b.get(i, 0) for i in self.graph.leafs.tolist()]

    def _unwire(self, graph: Graph) -> None:
        """Point consumers back at the producers if this graph was split before (its structs were kept):
        every source that is a scheduler copy in the arena (is_sched_copy) becomes the copy's src[0]."""
        a = self.arena
        rec = a.rec
        live = rec[: a.top]
        if not ((live["op"] == Op.CPY) & (live["flags"] & int(TensorFlag.COMPUTE) == 0)).any():
            return                                               # no scheduler copy in the arena at all
        src = rec["src"][graph.nodes]                            # (n, MAX_SRC) struct addresses
        slot = (src.astype(np.int64) - a.base) // TENSOR_SIZE
        inside = (src != 0) & (slot >= 0) & (slot < a.top)
        slot = np.where(inside, slot, 0)
        copy = inside & (rec["op"][slot] == Op.CPY) & (rec["flags"][slot] & int(TensorFlag.COMPUTE) == 0)
        if copy.any():
            src[copy] = rec["src"][slot[copy], 0]
            rec["src"][graph.nodes] = src

    def _rewind_region(self, graph: Graph) -> None:
        """Re-splitting the same graph makes its copies in the same slots again (ggml reuses sched->ctx)."""
        if self._region is not None:
            g, start, end = self._region
            if g is graph and self.arena.top == end:
                self.arena.top = start

    def _assign(self, graph: Graph, col: Columns) -> dict[int, int]:
        """Backend of every node and leaf (slot -> backend index)."""
        slot_b: dict[int, int] = {}
        data, src = col.data, col.src
        for i in graph.leafs.tolist():
            if data[i] and (b := self.owner(data[i])) is not None:
                slot_b[i] = b
        nodes = graph.nodes.tolist()
        if self.pin is None and not any(slot_b.values()):
            # every persistent tensor read is on backend 0: then so is every node (each rule of _assign_nodes
            # gives 0: the first persistent source's backend, the one backend of the computed sources, last_gpu)
            slot_b.update(dict.fromkeys(nodes, 0))
        else:
            self._assign_nodes(nodes, src, slot_b)
        for i in nodes:                          # inputs live where they are first read
            for s in src[i]:
                if s >= 0 and s not in slot_b:
                    slot_b[s] = slot_b[i]
        return slot_b

    def _assign_nodes(self, nodes: list[int], src: list[tuple[int, ...]], slot_b: dict[int, int]) -> None:
        """The module docstring's rules, node by node in order, into slot_b."""
        mark, get, pin = self.arena.mark, slot_b.get, self.pin
        gpu = [be.is_gpu for be in self.backends]
        last_gpu = 0
        for i in nodes:
            # one pass over the sources: the first persistent one placed decides; else the backends of the
            # computed ones placed (c, and whether they differ)
            b = c = None
            many = False
            for s in src[i]:
                if (sb := get(s)) is None:            # NULL (-1) or not placed
                    continue
                if s < mark:
                    b = sb
                    break
                if c is None:
                    c = sb
                elif sb != c:
                    many = True
            if b is None:
                if pin is not None and (p := pin(Tensor(self.arena, i).name)) is not None:
                    b = p
                elif c is not None and not many and not gpu[c]:
                    b = c
                else:
                    b = last_gpu
            slot_b[i] = b
            if gpu[b]:
                last_gpu = b

    @staticmethod
    def _runs(nodes: list[int], slot_b: dict[int, int]) -> list[tuple[int, int, int]]:
        """(backend, i0, i1) for each maximal run of nodes on one backend."""
        runs: list[tuple[int, int, int]] = []
        bs = [slot_b[idx] for idx in nodes]
        i0 = 0
        for i in range(1, len(bs)):
            if bs[i] != bs[i - 1]:
                runs.append((bs[i0], i0, i))
                i0 = i
        if bs:
            runs.append((bs[i0], i0, len(bs)))
        return runs

    def _make_inputs(self, idxs: list[int], b: int, slot_b: dict[int, int],
                     col: Columns) -> list[tuple[int, int, int]]:
        """CPY structs for the split's sources that live on another backend; consumers are rewired to them.
        `col` holds the nodes' sources as they were before any split's rewiring (each node is rewired once,
        by its own split)."""
        ctx, made = Ctx(self.arena), {}
        for idx in idxs:
            for j, si in enumerate(col.src[idx]):
                if si < 0 or slot_b.get(si, b) == b:
                    continue
                node, s = Tensor(self.arena, idx), Tensor(self.arena, si)
                if col.view_src[idx] >= 0 and j == 0:
                    raise InternalError(f"view {node.name!r} on {self.backends[b].name} of a tensor elsewhere")
                if s.idx not in made:
                    # ggml_dup_tensor_layout: the copy keeps the source's strides (a router's top-k is a
                    # strided view of its argsort), so the byte copy of the source's span keeps the layout
                    name = f"{self.backends[b].name}#{s.name}#0"
                    made[s.idx] = ctx.new_tensor(s.type, s.ne, name, Op.CPY, (s,), nb=s.nb)
                node.set_src(j, made[s.idx])
        for s_idx, c in made.items():
            slot_b[c.idx] = b
        return [(c.idx, s_idx, slot_b[s_idx]) for s_idx, c in made.items()]

    def _copy_input(self, src: Tensor, dst: Tensor, src_be: Backend, dst_be: Backend) -> None:
        """ggml_backend_tensor_copy of a split input: read on the producer's backend (tensor_get waits for
        it), write on the split's; between two devices the copier chooses (peer, or through the host)."""
        if self.copier is not None and self.copier(src, dst, src_be, dst_be):
            return
        dst_be.tensor_set(dst.data, src_be.tensor_get(src.data, src.nbytes()))

"""The graph allocator, modelled on ggml-alloc (ggml_gallocr): tensor placement in per-backend compute buffers.

Planning ("reserve") walks the nodes in order with one first-fit free list per backend: a tensor is placed before
its node runs and its memory is returned after its last consumer (views keep their view_src alive). INPUT and
OUTPUT tensors are never freed; views take view_src.data + view_offs; persistent tensors (the arena's persistent
region: weights, KV cache) already have data and are left alone. The plan is kept per node position and reused
while the graph still fits it (same node/leaf counts, same backends, every tensor within its planned size), so
addresses are stable for the same graph and move when shapes change. A backend's buffer is reallocated only when
the planned size grows. Sizes and offsets are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import events as E
from ..backends.base import Backend
from ..ir.graph import Graph
from ..ir.ops import Op, TensorFlag
from ..ir.tensor import Tensor
from ..memory import aligned

_KEEP = TensorFlag.INPUT | TensorFlag.OUTPUT
# ggml_op_can_inplace, for the ops graphdiag's graphs have: such a node takes over its parent's memory
# when it is that parent's last reader (ggml_gallocr_allocate_node)
INPLACE_OPS = frozenset({Op.ADD, Op.MUL, Op.SCALE, Op.ROPE, Op.RMS_NORM, Op.SOFT_MAX})


class FreeList:
    """First-fit allocator over an unbounded range of offsets (ggml_dyn_tallocr); `high` is the size needed."""

    def __init__(self):
        self.blocks: list[list[int]] = []   # free [offset, size] below `top`, sorted by offset
        self.top = 0                        # everything at or above is free
        self.high = 0

    def alloc(self, size: int) -> int:
        size = aligned(size)
        for i, (off, n) in enumerate(self.blocks):
            if n >= size:
                if n == size:
                    self.blocks.pop(i)
                else:
                    self.blocks[i] = [off + size, n - size]
                return off
        off, self.top = self.top, self.top + size
        self.high = max(self.high, self.top)
        return off

    def free(self, off: int, size: int) -> None:
        size = aligned(size)
        self.blocks.append([off, size])
        self.blocks.sort()
        merged: list[list[int]] = []
        for b in self.blocks:
            if merged and merged[-1][0] + merged[-1][1] == b[0]:
                merged[-1][1] += b[1]
            else:
                merged.append(b)
        if merged and merged[-1][0] + merged[-1][1] == self.top:  # give the tail back to the open end
            self.top = merged.pop()[0]
        self.blocks = merged


@dataclass(frozen=True)
class Placement:
    backend: int   # index into the allocator's backends
    offset: int    # bytes from the compute buffer's base
    size: int      # bytes planned (the tensor may shrink and still fit)


class GraphAllocator:
    """Compute buffers of `backends` (index = backend id) and the placement plan of the last reserved graph."""

    def __init__(self, backends: list[Backend], bus: E.EventBus | None = None):
        self.backends = backends
        self.hold: list[tuple[int, int]] = []   # concurrent node ranges [first, last] (set by the scheduler)
        self.bus = bus
        self.buffers: list[tuple[int, int] | None] = [None] * len(backends)   # (address, bytes)
        self.need: list[int] = [0] * len(backends)
        self.nodes: list[Placement | None] = []
        self.leafs: list[Placement | None] = []
        self.step = -1

    # -- which tensors are ours ---------------------------------------------------------------------------
    @staticmethod
    def _owned(t: Tensor) -> bool:
        """Allocated here: a compute-region tensor that is not a view."""
        return t.idx >= t.arena.mark and t.view_src is None

    def alloc_graph(self, g: Graph, node_backend: list[int], leaf_backend: list[int]) -> bool:
        """Place every tensor of `g` (reserving a new plan first if needed). Returns True if it re-planned."""
        replan = self.needs_realloc(g, node_backend, leaf_backend)
        if replan:
            self.reserve(g, node_backend, leaf_backend)
        self._apply(g)
        return replan

    def needs_realloc(self, g: Graph, node_backend: list[int], leaf_backend: list[int]) -> bool:
        """ggml_gallocr_needs_realloc: counts differ, or a tensor moved backend or outgrew its planned size."""
        if len(self.nodes) != g.n_nodes or len(self.leafs) != len(g.leafs):
            return True
        for plans, idxs, bks in ((self.nodes, g.nodes, node_backend), (self.leafs, g.leafs, leaf_backend)):
            for p, idx, b in zip(plans, idxs, bks):
                t = Tensor(g.arena, int(idx))
                if self._owned(t) and (p is None or p.backend != b or p.size < t.nbytes()):
                    return True
        return False

    # -- planning -------------------------------------------------------------------------------------------
    def reserve(self, g: Graph, node_backend: list[int], leaf_backend: list[int]) -> None:
        """Plan offsets for every owned tensor, then grow the buffers that are too small."""
        plan: dict[int, Placement] = {}
        lists = [FreeList() for _ in self.backends]
        children, views = self._counts(g)
        backend_of = dict(zip((int(i) for i in g.nodes), node_backend))
        backend_of.update(zip((int(i) for i in g.leafs), leaf_backend))

        moved: set[int] = set()          # parents whose memory a node took over in place

        def place(t: Tensor) -> None:
            if t.idx not in plan and self._owned(t):
                b, size = backend_of[t.idx], aligned(t.nbytes())
                parent = self._inplace_parent(t, plan, children, views, moved)
                if parent is not None and plan[parent.idx].backend == b and plan[parent.idx].size >= size:
                    plan[t.idx] = plan[parent.idx]
                    moved.add(parent.idx)
                    return
                plan[t.idx] = Placement(b, lists[b].alloc(size), size)

        def release(t: Tensor) -> None:
            p = plan.get(t.idx)
            if p is not None and not (t.flags & _KEEP) and t.idx not in moved:
                lists[p.backend].free(p.offset, p.size)

        # graph inputs first, so nothing is ever placed over them (as ggml-alloc)
        for idx in list(g.leafs) + list(g.nodes):
            t = Tensor(g.arena, int(idx))
            if t.flags & TensorFlag.INPUT:
                place(t)
        # inside a concurrent range, freed memory is only returned after its last node (the join): branches on
        # other streams may still be reading it
        hold_end = {a: b for a, b in self.hold}
        deferred: list[Tensor] = []
        until = -1
        for pos, node in enumerate(g.iter_nodes()):
            until = max(until, hold_end.get(pos, -1))
            free = deferred.append if pos < until else release
            for s in node.src:
                if s is not None:
                    place(s)
            place(node)
            for s in node.src:
                if s is not None:
                    self._done_with(s, children, views, free)
            if pos == until:
                for t in deferred:
                    release(t)
                deferred.clear()
        self.nodes = [plan.get(int(i)) for i in g.nodes]
        self.leafs = [plan.get(int(i)) for i in g.leafs]
        self._grow([fl.high for fl in lists])

    def _inplace_parent(self, node: Tensor, plan, children, views, moved) -> Tensor | None:
        """The parent whose memory `node` reuses (ggml-alloc's in-place rule), if any: the first src that
        is ours, not an output, of the same layout, read by this node alone and viewed by nothing; a view
        parent only when it is its view_src's one view, at offset 0, and nothing else reads that tensor."""
        if node.op not in INPLACE_OPS or node.flags & _KEEP:
            return None
        for parent in node.src:
            if parent is None or parent.idx in moved:
                continue
            base = parent.view_src if parent.view_src is not None else parent
            if base.idx not in plan or base.flags & _KEEP or not self._owned(base):
                continue
            if (parent.type, parent.ne, parent.nb) != (node.type, node.ne, node.nb):
                continue
            if children.get(parent.idx, 0) != 1 or views.get(parent.idx, 0):
                continue
            if parent.view_src is not None:
                if views.get(base.idx, 0) != 1 or children.get(base.idx, 0) or parent.view_offs:
                    continue
                return base
            return parent
        return None

    @staticmethod
    def _counts(g: Graph) -> tuple[dict[int, int], dict[int, int]]:
        """Consumers of each tensor, and live views of each view_src."""
        children: dict[int, int] = {}
        views: dict[int, int] = {}
        for node in g.iter_nodes():
            for s in node.src:
                if s is not None:
                    children[s.idx] = children.get(s.idx, 0) + 1
            vs = node.view_src
            if vs is not None:
                views[vs.idx] = views.get(vs.idx, 0) + 1
        return children, views

    @staticmethod
    def _done_with(s: Tensor, children: dict, views: dict, release) -> None:
        """One consumer of `s` ran: free it (or, for a view, drop its hold on view_src) after the last one."""
        children[s.idx] -= 1
        if children[s.idx] or views.get(s.idx, 0):
            return
        vs = s.view_src
        if vs is None:
            release(s)
            return
        views[vs.idx] -= 1
        if views[vs.idx] == 0 and children.get(vs.idx, 0) == 0:
            release(vs)

    def _grow(self, need: list[int]) -> None:
        """Reallocate each buffer whose planned size grew; one SchedRealloc per re-plan."""
        same = need == self.need
        grown = []
        for b, (be, n) in enumerate(zip(self.backends, need)):
            cur = self.buffers[b]
            if n > 0 and (cur is None or n > cur[1]):
                if cur is not None:
                    be.buffer_free(cur[0])
                self.buffers[b] = (be.buffer_alloc(n), n)
                grown.append(be.name)
        self.need = list(need)
        if self.bus is not None:
            self.bus.emit(E.SchedRealloc(step=self.step, same_size=same, buffer_bytes=int(sum(need)),
                                         backend=",".join(grown)))

    # -- placing ----------------------------------------------------------------------------------------------
    def _apply(self, g: Graph) -> None:
        """Write data/buffer of every tensor from the plan (views from their view_src), in graph order."""
        rec = g.arena.rec
        for plans, idxs in ((self.leafs, g.leafs), (self.nodes, g.nodes)):
            for p, idx in zip(plans, idxs):
                i = int(idx)
                if p is not None:
                    base = self.buffers[p.backend][0]
                    rec["data"][i], rec["buffer"][i] = base + p.offset, base
                elif rec["view_src"][i] and i >= g.arena.mark:
                    vs = g.arena.index(int(rec["view_src"][i]))
                    rec["data"][i] = rec["data"][vs] + rec["view_offs"][i]
                    rec["buffer"][i] = rec["buffer"][vs]

    def close(self) -> None:
        """Free the compute buffers."""
        for b, cur in enumerate(self.buffers):
            if cur is not None:
                self.backends[b].buffer_free(cur[0])
        self.buffers = [None] * len(self.backends)


"""The graph allocator, modelled on ggml-alloc (ggml_gallocr): tensor placement in per-backend compute buffers.

Planning ("reserve") walks the nodes in order with one best-fit free list per backend: a tensor is placed before
its node runs and its memory is returned after its last consumer (views keep their view_src alive). Only OUTPUT
tensors are never freed (ggml_gallocr_free_node); a split's inputs are placed at its start, as llama.cpp's
scheduler hands them to ggml-alloc, and freed after their last reader like any tensor (alloc_order.py); views
take view_src.data + view_offs; persistent tensors (the arena's persistent region: weights, KV cache) already
have data and are left alone. The plan is kept per node position and reused while the graph still fits it
(same node/leaf counts, same backends, every tensor within its planned size), so addresses are stable for the
same graph and move when shapes change: after llama.cpp's worst-case reserve (Context.sched_reserve) every
graph fits the 512-token prompt's plan. A backend's buffer is reallocated only when the planned size grows.
Sizes and offsets are bytes.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import numpy as np

from .. import events as E
from ..backends.base import Backend
from ..ir.columns import Columns
from ..ir.graph import Graph
from ..ir.ops import Op, TensorFlag
from ..release import releasing
from .alloc_order import alloc_sizes, embedding_node, held_inputs, split_inputs

_OUTPUT = int(TensorFlag.OUTPUT)
_INPUT = int(TensorFlag.INPUT)
# ggml_op_can_inplace, for the ops graphdiag's graphs have: such a node takes over its parent's memory
# when it is that parent's last reader (ggml_gallocr_allocate_node). CLAMP joined the list after d99724f2
# (0c1e57098's ggml-alloc.c has it; llama's MoE weight norm clamps the SUM_ROWS of the weights in place).
# ADD_ID (gpt-oss's expert biases) is in 0c1e57098's list; d99724f2's graphs here never hold it
INPLACE_OPS_AT = {
    "d99724f2": frozenset({Op.ADD, Op.MUL, Op.DIV, Op.SCALE, Op.ROPE, Op.RMS_NORM, Op.SOFT_MAX}),
    "0c1e57098": frozenset({Op.ADD, Op.MUL, Op.DIV, Op.SCALE, Op.ROPE, Op.RMS_NORM, Op.SOFT_MAX, Op.CLAMP,
                            Op.ADD_ID}),
}
INPLACE_OPS = INPLACE_OPS_AT["0c1e57098"]


class FreeList:
    """ggml_dyn_tallocr over one chunk of unbounded size: free blocks below `top`, everything at or above it
    free (ggml's last block); `high` is the size needed. Sizes round up to `alignment` (the buffer type's)."""

    def __init__(self, alignment: int = 256):
        self.blocks: list[list[int]] = []   # free [offset, size] below `top`, sorted by offset
        self.top = 0                        # everything at or above is free
        self.high = 0
        self.alignment = alignment

    def aligned(self, size: int) -> int:
        a = self.alignment
        return -(-size // a) * a

    def alloc(self, size: int) -> int:
        """ggml_dyn_tallocr_alloc: the best-fitting free block below the top (the smallest that fits, the
        last of equal ones), else the top."""
        size = self.aligned(size)
        best, best_size = -1, -1
        for i, (_, n) in enumerate(self.blocks):
            if size <= n and (best < 0 or n <= best_size):
                best, best_size = i, n
        if best >= 0:
            off, n = self.blocks[best]
            if n == size:
                self.blocks.pop(best)
            else:
                self.blocks[best] = [off + size, n - size]
            return off
        off, self.top = self.top, self.top + size
        self.high = max(self.high, self.top)
        return off

    def free(self, off: int, size: int) -> None:
        """Return [off, off + size): merged with the free blocks it touches, the tail given back to the open
        end. The blocks stay sorted and never touch each other or `top`, so only the neighbours can merge."""
        size = self.aligned(size)
        blocks = self.blocks
        k = bisect.bisect_left(blocks, [off, size])
        if k < len(blocks) and off + size == blocks[k][0]:       # the block after
            size += blocks.pop(k)[1]
        if k and blocks[k - 1][0] + blocks[k - 1][1] == off:      # the block before
            k -= 1
            off = blocks[k][0]
            size += blocks.pop(k)[1]
        if off + size == self.top:
            self.top = off
        else:
            blocks.insert(k, [off, size])


class Placement(NamedTuple):
    backend: int   # index into the allocator's backends
    offset: int    # bytes from the compute buffer's base
    size: int      # bytes planned (the tensor may shrink and still fit)


class _Planner:
    """One reserve's state over a Columns snapshot: the plan so far, one free list per backend, the
    consumers left per tensor and the live views per view_src; tensors are slots."""

    def __init__(self, col: Columns, alignments: list[int], nodes: np.ndarray,
                 inplace_ops: frozenset = INPLACE_OPS, sizes: list[int | None] | None = None):
        self.col = col
        self.sizes = sizes if sizes is not None else col.nbytes     # bytes each tensor takes (alloc_sizes)
        self.inplace_ops = inplace_ops
        self.plan: dict[int, Placement] = {}
        self.lists = [FreeList(a) for a in alignments]
        self.backend_of: dict[int, int] = {}
        # memory never given back here: parents a node took over in place, and the held inputs (in llama.cpp's
        # CPU buffer: alloc_order.held_inputs)
        self.moved: set[int] = set()
        # per slot: consumers among the nodes, and views among the nodes (of each view_src); counted down
        self.children: list[int] = col.count_sources(nodes)
        self.views: list[int] = col.count_views(nodes)
        self.deps: dict[int, list[int]] = {}

    def keep(self, deps: dict[int, list[int]]) -> None:
        """Allocation dependencies: each kept tensor gains a reader right after its node (the no-op node
        ggml_backend_sched inserts there, which reads them and is no view: ggml-alloc frees them after it)."""
        self.deps = deps
        for kept in deps.values():
            for s in kept:
                self.children[s] += 1

    def place(self, i: int) -> None:
        plan = self.plan
        if i in plan or not self.col.owned[i]:
            return
        b = self.backend_of[i]
        size = self.lists[b].aligned(self.sizes[i])
        parent = self.inplace_parent(i)
        if parent >= 0 and plan[parent].backend == b and plan[parent].size >= size:
            plan[i] = plan[parent]
            self.moved.add(parent)
            return
        plan[i] = Placement(b, self.lists[b].alloc(size), size)

    def inplace_parent(self, node: int) -> int:
        """The parent whose memory `node` reuses (ggml_gallocr_allocate_node's in-place rule), or -1: the first
        src that is ours, not an output, of the same layout, read by this node alone and viewed by nothing
        (the node's own flags are not asked). A view is never ours (ggml_gallocr_is_own: only a tensor the
        allocator placed is, and it never places a view), so a node over a view parent gets memory of its own."""
        col, plan, children, views = self.col, self.plan, self.children, self.views
        flags, view_src, owned, layout = col.flags, col.view_src, col.owned, col.layout
        if col.op[node] not in self.inplace_ops:
            return -1
        for parent in col.src[node]:
            if parent < 0 or parent in self.moved or view_src[parent] >= 0:
                continue
            if parent not in plan or flags[parent] & _OUTPUT or not owned[parent]:
                continue
            if layout[parent] != layout[node]:
                continue
            if children[parent] != 1 or views[parent]:
                continue
            return parent
        return -1

    def walk(self, nodes: list[int], late: bool = True) -> None:
        """Place each node's sources and the node in order, then let go of each source it was the last to
        read (a view: its hold on view_src, freed after its last view and reader), as ggml-alloc does in the
        order it is given (graph_optimize's interleave included: nothing is held back for other streams).
        The checks of place, of one consumer's end and of release are written out here: they run for every
        source of every node. With `late` False
        (_late_sources: every source is placed before its readers' turn) no source is looked at to place."""
        plan, col, lists, moved, deps = self.plan, self.col, self.lists, self.moved, self.deps
        owned, src, view_src, flags = col.owned, col.src, col.view_src, col.flags
        children, views, place = self.children, self.views, self.place
        for i in nodes:
            srcs = src[i]
            if late:
                for s in srcs:
                    if s >= 0 and s not in plan and owned[s]:
                        place(s)
            if i not in plan and owned[i]:
                place(i)
            if deps and i in deps:
                srcs = (*srcs, *deps[i])    # the dependency node right after i reads them
            for s in srcs:
                if s < 0:
                    continue
                n = children[s] - 1
                children[s] = n
                if n or views[s]:
                    continue
                vs = view_src[s]
                if vs >= 0:
                    views[vs] -= 1
                    if views[vs] or children[vs]:
                        continue
                    s = vs
                # its memory back, the checks first: none of them changes once the last reader ran
                p = plan.get(s)
                if p is None or flags[s] & _OUTPUT or s in moved:
                    continue
                lists[p.backend].free(p.offset, p.size)


def _runs(node_backend: list[int]) -> list[tuple[int, int, int]]:
    """(backend, i0, i1) of each split: a maximal run of nodes on one backend."""
    runs, i0 = [], 0
    for i in range(1, len(node_backend) + 1):
        if i == len(node_backend) or node_backend[i] != node_backend[i0]:
            runs.append((node_backend[i0], i0, i))
            i0 = i
    return runs


def _late_sources(col: Columns, nodes: np.ndarray, leafs: np.ndarray) -> bool:
    """Whether a node reads an owned tensor that is placed only at that node's turn: neither a graph input
    (inputs are placed before their split's nodes) nor a node earlier in the order."""
    n = len(nodes)
    first = np.full(col.top, n, np.int64)             # each slot's first position as a node (n: none)
    np.minimum.at(first, nodes, np.arange(n))
    owned = col.owned_mask
    placed_first = np.zeros(col.top, bool)
    placed_first[leafs] = placed_first[nodes] = True
    placed_first &= (col.rec["flags"] & _INPUT) != 0
    s = col.src_slots[nodes]
    used = s >= 0
    s = np.where(used, s, 0)
    late = used & owned[s] & ~placed_first[s] & (first[s] >= np.arange(n)[:, None])
    return bool(late.any())


class GraphAllocator:
    """Compute buffers of `backends` (index = backend id) and the placement plan of the last reserved graph."""

    def __init__(self, backends: list[Backend], bus: E.EventBus | None = None, upstream: str = "0c1e57098"):
        self.backends = backends
        self.inplace_ops = INPLACE_OPS_AT[upstream]     # the upstream's ggml_op_can_inplace
        # allocation dependencies (#27301, set through graph_optimize): node slot -> slots kept alive until it
        # has run (ggml_backend_sched adds a no-op node reading them right after it)
        self.deps: dict[int, list[int]] = {}
        self.bus = bus
        self.buffers: list[tuple[int, int] | None] = [None] * len(backends)   # (address, bytes)
        self.need: list[int] = [0] * len(backends)
        self.nodes: list[Placement | None] = []
        self.leafs: list[Placement | None] = []
        self.step = -1

    def alloc_graph(self, g: Graph, node_backend: list[int], leaf_backend: list[int],
                    col: Columns | None = None) -> bool:
        """Place every tensor of `g` (reserving a new plan first if needed). Returns True if it re-planned.
        `col`: a snapshot of the arena as it is now, if the caller has one (else one is taken)."""
        col = col if col is not None else Columns(g.arena)
        replan = self.needs_realloc(g, node_backend, leaf_backend, col)
        if replan:
            self.reserve(g, node_backend, leaf_backend, col)
        self._apply(g)
        return replan

    def needs_realloc(self, g: Graph, node_backend: list[int], leaf_backend: list[int],
                      col: Columns | None = None) -> bool:
        """ggml_gallocr_needs_realloc: counts differ, or a tensor moved backend or outgrew its planned size."""
        if len(self.nodes) != g.n_nodes or len(self.leafs) != len(g.leafs):
            return True
        col = col if col is not None else Columns(g.arena)
        owned, nbytes = col.owned, col.nbytes
        for plans, idxs, bks in ((self.nodes, g.nodes, node_backend), (self.leafs, g.leafs, leaf_backend)):
            for p, i, b in zip(plans, idxs.tolist(), bks):
                if owned[i] and (p is None or p.backend != b or p.size < nbytes[i]):
                    return True
        return False

    # -- planning -------------------------------------------------------------------------------------------
    def reserve(self, g: Graph, node_backend: list[int], leaf_backend: list[int],
                col: Columns | None = None, report: bool = True) -> None:
        """Plan offsets for every owned tensor, then grow the buffers that are too small: the held inputs
        first, then split by split its inputs at its start and its nodes (alloc_order.py). `report`: emit
        the re-plan's SchedRealloc (a step's graph that did not fit; not the context's own reserve)."""
        nodes, leafs = g.nodes.tolist(), g.leafs.tolist()
        col = col if col is not None else Columns(g.arena)
        pl = _Planner(col, [be.alignment for be in self.backends], g.nodes, self.inplace_ops,
                      alloc_sizes(col, nodes))
        pl.backend_of = dict(zip(nodes, node_backend))
        pl.backend_of.update(zip(leafs, leaf_backend))
        embd = embedding_node(col, nodes)
        for i in held_inputs(col, nodes, leafs, embd):
            pl.place(i)
            pl.moved.add(i)
        pl.keep(self.deps)
        late = _late_sources(col, g.nodes, g.leafs)
        started: set[int] = set()
        for b, i0, i1 in _runs(node_backend):
            split = nodes[i0:i1]
            reads = split if b in started else [i for i, nb in zip(nodes, node_backend) if nb == b]
            started.add(b)
            for i in split_inputs(col, reads, split, b, pl.backend_of, pl.plan, embd):
                pl.place(i)
            pl.walk(split, late)
        self.nodes = [pl.plan.get(i) for i in nodes]
        self.leafs = [pl.plan.get(i) for i in leafs]
        self._grow([fl.high for fl in pl.lists], report)

    def _grow(self, need: list[int], report: bool = True) -> None:
        """Reallocate each buffer whose planned size grew; one SchedRealloc per re-plan (if `report`)."""
        same = need == self.need
        grown = []
        for b, (be, n) in enumerate(zip(self.backends, need)):
            cur = self.buffers[b]
            if n > 0 and (cur is None or n > cur[1]):
                if cur is not None:
                    be.buffer_free(cur[0])
                    self.buffers[b] = None
                try:
                    self.buffers[b] = (be.buffer_alloc(n), n)
                except BaseException:
                    # ggml_gallocr_reserve_n: the buffer is NULL after a failed allocation and the reserve
                    # returns false; the plans go too, so the next graph is planned and allocated again
                    self.nodes, self.leafs = [], []
                    raise
                grown.append(be.name)
        self.need = list(need)
        if report and self.bus is not None:
            self.bus.emit(E.SchedRealloc(step=self.step, same_size=same, buffer_bytes=int(sum(need)),
                                         backend=",".join(grown)))

    # -- placing ----------------------------------------------------------------------------------------------
    def _apply(self, g: Graph) -> None:
        """Write data/buffer of every tensor from the plan, then of every compute-region view from its
        view_src (a view_src is never a view, and is placed before its views are)."""
        rec, arena = g.arena.rec, g.arena
        mark = arena.mark
        bases = [None if b is None else b[0] for b in self.buffers]
        idx, data, buffer, views = [], [], [], []
        for plans, idxs in ((self.leafs, g.leafs), (self.nodes, g.nodes)):
            for p, i in zip(plans, idxs.tolist()):
                if p is None:
                    if i >= mark:
                        views.append(i)
                    continue
                base = bases[p.backend]
                idx.append(i)
                data.append(base + p.offset)
                buffer.append(base)
        if idx:
            rec["data"][idx] = data
            rec["buffer"][idx] = buffer
        if views:
            v = np.asarray(views, np.int64)
            vs_addr = rec["view_src"][v]
            v, vs_addr = v[vs_addr != 0], vs_addr[vs_addr != 0]
            vs = arena.index(vs_addr)
            rec["data"][v] = rec["data"][vs] + rec["view_offs"][v]
            rec["buffer"][v] = rec["buffer"][vs]

    def close(self) -> None:
        """Free the compute buffers (each tried: the first error raised once all were)."""
        with releasing() as release:
            for b, cur in enumerate(self.buffers):
                if cur is not None:
                    release(self.backends[b].buffer_free, cur[0])
            self.buffers = [None] * len(self.backends)


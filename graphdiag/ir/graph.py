"""Graphs (ggml_cgraph): node and leaf lists of arena slots, plus a uid; views are contiguous node ranges."""

from __future__ import annotations

import itertools
import threading

import numpy as np

from .arena import Arena
from .ops import Op, TensorFlag
from .tensor import Tensor

_uid_counter = itertools.count(1)
_uid_lock = threading.Lock()


def next_uid() -> int:
    """ggml_graph_next_uid: one process-wide counter starting at 1."""
    with _uid_lock:
        return next(_uid_counter)


class Graph:
    """A computation graph. `nodes`/`leafs` are int64 arrays of arena slot indices. uid 0 = unset."""

    __slots__ = ("arena", "nodes", "leafs", "uid", "_visited")

    def __init__(self, arena: Arena, nodes=None, leafs=None, uid: int = 0):
        self.arena = arena
        self.nodes = np.asarray(nodes if nodes is not None else [], dtype=np.int64)
        self.leafs = np.asarray(leafs if leafs is not None else [], dtype=np.int64)
        self.uid = uid
        self._visited = None

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    def node(self, i: int) -> Tensor:
        return Tensor(self.arena, int(self.nodes[i]))

    def iter_nodes(self):
        for i in self.nodes:
            yield Tensor(self.arena, int(i))

    @property
    def first_node_addr(self) -> int:
        return self.arena.base + int(self.nodes[0]) * self.arena.rec.dtype.itemsize

    def build_forward_expand(self, t: Tensor) -> None:
        """Add `t` and everything it depends on, depth first, sources in order (ggml_visit_parents)."""
        visited = self._visited
        if visited is None:
            visited = self._visited = set(self.nodes.tolist()) | set(self.leafs.tolist())
        nodes: list[int] = []           # added by this call (appended to self.nodes / self.leafs at the end)
        leafs: list[int] = []
        stack = [(t.idx, False)]
        rec = self.arena.rec
        ops, flags, srcs = rec["op"], rec["flags"], rec["src"]      # column views, taken once
        base, size = self.arena.base, rec.dtype.itemsize
        none, param, compute = int(Op.NONE), int(TensorFlag.PARAM), int(TensorFlag.COMPUTE)
        while stack:
            idx, expanded = stack.pop()
            if expanded:
                if idx in visited:
                    continue
                visited.add(idx)
                if ops[idx] == none and not (flags[idx] & param):
                    leafs.append(idx)
                else:
                    flags[idx] |= compute
                    nodes.append(idx)
                continue
            if idx in visited:
                continue
            stack.append((idx, True))
            for a in reversed(srcs[idx].tolist()):
                if a:
                    s = (a - base) // size
                    if s not in visited:
                        stack.append((s, False))
        if nodes:
            self.nodes = np.concatenate([self.nodes, np.asarray(nodes, dtype=np.int64)])
        if leafs:
            self.leafs = np.concatenate([self.leafs, np.asarray(leafs, dtype=np.int64)])


def graph_view(g: Graph, i0: int, i1: int) -> Graph:
    """ggml_graph_view: nodes [i0, i1) of `g`, uid 0."""
    return Graph(g.arena, g.nodes[i0:i1], np.zeros(0, np.int64), uid=0)

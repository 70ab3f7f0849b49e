"""Graphs (ggml_cgraph): node and leaf lists of arena slots, plus a uid; views are contiguous node ranges."""

from __future__ import annotations

import itertools
import struct
import threading

import numpy as np

from .arena import TENSOR_SIZE, Arena
from .ops import Op, TensorFlag
from .tensor import _I32, _O_FLAGS, _O_OP, _O_SRC, _SRC, Tensor

_OP_FLAGS = struct.Struct(f"<i{_O_FLAGS - _O_OP - 4}xi")      # a struct's op and flags, in one read
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
        # the struct size is TENSOR_SIZE: the arena's array is always of TENSOR_DTYPE (read 2-3 times a step)
        return self.arena.base + self.nodes.item(0) * TENSOR_SIZE

    def build_forward_expand(self, t: Tensor) -> None:
        """Add `t` and everything it depends on, depth first, sources in order (ggml_visit_parents)."""
        visited = self._visited
        if visited is None:
            visited = self._visited = set(self.nodes.tolist()) | set(self.leafs.tolist())
        nodes: list[int] = []           # added by this call (appended to self.nodes / self.leafs at the end)
        leafs: list[int] = []
        stack = [(t.idx, False)]
        mem = self.arena.mem                # the structs' bytes: fields read with one unpack_from each
        base = self.arena.base
        none, param, compute = int(Op.NONE), int(TensorFlag.PARAM), int(TensorFlag.COMPUTE)
        while stack:
            idx, expanded = stack.pop()
            if expanded:
                if idx in visited:
                    continue
                visited.add(idx)
                at = idx * TENSOR_SIZE
                op, flags = _OP_FLAGS.unpack_from(mem, at + _O_OP)
                if op == none and not (flags & param):
                    leafs.append(idx)
                else:
                    _I32.pack_into(mem, at + _O_FLAGS, flags | compute)
                    nodes.append(idx)
                continue
            if idx in visited:
                continue
            stack.append((idx, True))
            for a in reversed(_SRC.unpack_from(mem, idx * TENSOR_SIZE + _O_SRC)):
                if a:
                    s = (a - base) // TENSOR_SIZE
                    if s not in visited:
                        stack.append((s, False))
        if nodes:
            self.nodes = np.concatenate([self.nodes, np.asarray(nodes, dtype=np.int64)])
        if leafs:
            self.leafs = np.concatenate([self.leafs, np.asarray(leafs, dtype=np.int64)])


def graph_view(g: Graph, i0: int, i1: int) -> Graph:
    """ggml_graph_view: nodes [i0, i1) of `g`, uid 0."""
    return Graph(g.arena, g.nodes[i0:i1], np.zeros(0, np.int64), uid=0)

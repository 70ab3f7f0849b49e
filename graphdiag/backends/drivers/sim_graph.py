"""Graphs of the simulated driver: handles, captured nodes, captures in progress, executables (the update
rules: sim_update.py)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ...errors import CudaError

_ids = itertools.count(1)


class SimHandle:
    """An opaque driver object with an explicit lifetime; a destroyed one is refused."""

    kind = "handle"

    def __init__(self):
        self.alive = True
        self.id = next(_ids)

    def __repr__(self) -> str:
        return f"<sim {self.kind} #{self.id}{'' if self.alive else ' destroyed'}>"

    @staticmethod
    def check(h, cls: type, call: str):
        """`h` if it is a live `cls`, else CudaError(CUDA_ERROR_INVALID_VALUE)."""
        if not isinstance(h, cls):
            raise CudaError("CUDA_ERROR_INVALID_VALUE", call, f"{h!r} is not a sim {cls.kind}")
        if not h.alive:
            raise CudaError("CUDA_ERROR_INVALID_VALUE", call, f"{h!r} was destroyed")
        return h


@dataclass
class Node:
    """A graph node: `type` is "kernel" or "memcpy"; `name` the kernel or the copy call (memcpy_htod, …).

    Kernel nodes hold a private copy of the launch's KPARAMS record; memcpy nodes hold device addresses (int)
    or host uint8 arrays (referenced, read or written at each replay). `deps` are node indices, in order."""

    type: str
    name: str
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    params: np.ndarray | None = None
    fn: Callable | None = None
    dst: object = None
    src: object = None
    nbytes: int = 0
    deps: tuple[int, ...] = field(default=())
    label: str = ""                 # the graphdiag node(s) a kernel node computes (Launch.label)
    node_id: int = 0                # unique per captured node, kept by executables (as CUDA's node ids)
    programmatic: bool = False      # launched with PDL: its edges from kernel nodes are programmatic ones

    def copy(self) -> "Node":
        return replace(self, params=None if self.params is None else self.params.copy())


class Capture:
    """A capture in progress: the origin stream, the streams forked into it, the recorded nodes."""

    def __init__(self, origin):
        self.origin = origin
        self.streams = [origin]
        self.nodes: list[Node] = []
        self.invalidated = False
        self.ended = False

    def add(self, node: Node, deps: tuple[int, ...]) -> int:
        """Append `node` depending on `deps`; returns its index."""
        node.deps = tuple(deps)
        self.nodes.append(node)
        return len(self.nodes) - 1

    def ancestors(self, deps) -> set[int]:
        """`deps` and every node they depend on, transitively."""
        seen, todo = set(), list(deps)
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                todo.extend(self.nodes[i].deps)
        return seen

    def unjoined(self) -> list:
        """Forked streams whose position the origin stream does not depend on."""
        joined = self.ancestors(self.origin.deps)
        return [s for s in self.streams if s is not self.origin and not set(s.deps) <= joined]


class SimGraph(SimHandle):
    """A captured graph (cudaGraph_t)."""

    kind = "graph"

    def __init__(self, nodes: list[Node]):
        super().__init__()
        self.nodes = nodes

    @property
    def edges(self) -> list[tuple[int, int]]:
        """(from, to) node indices, grouped by destination node, each node's dependencies in order."""
        return [(d, i) for i, n in enumerate(self.nodes) for d in n.deps]


class SimExec(SimHandle):
    """An executable graph (cudaGraphExec_t): its own copy of the nodes and a launch order."""

    kind = "executable graph"

    def __init__(self, nodes: list[Node]):
        super().__init__()
        self.nodes = nodes
        self.order = topological_order(nodes)


def topological_order(nodes: list[Node]) -> list[int]:
    """Kahn's order over the nodes' dependencies; among ready nodes the lowest index first."""
    n_deps = [len(set(n.deps)) for n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for d in set(n.deps):
            users[d].append(i)
    ready = [i for i, k in enumerate(n_deps) if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            n_deps[u] -= 1
            if n_deps[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise CudaError("CUDA_ERROR_INVALID_VALUE", "instantiate", "the graph has a cycle")
    return order

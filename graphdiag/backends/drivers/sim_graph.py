"""Graphs of the simulated driver: handles, captured nodes, captures in progress, executables, update rules."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ...errors import CudaError
from .base import UpdateOutcome, UpdateResult

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

    def describe(self, i: int) -> str:
        return f"node {i} ({self.type} {self.name})"


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


def _programmatic_edges(nodes: list[Node], i: int) -> frozenset[int]:
    """The dependencies of node i that are programmatic edges (a PDL launch after a kernel node)."""
    n = nodes[i]
    return frozenset(d for d in n.deps if n.programmatic and nodes[d].type == "kernel")


def compare_graphs(old: list[Node], new: list[Node]) -> UpdateOutcome:
    """cuGraphExecUpdate's checks (CUDA 12+), nodes paired in order: the count must match (else
    TOPOLOGY_CHANGED naming no node, as the driver reports it), node types too (NODE_TYPE_CHANGED), each
    node's set of dependencies (edges have no order: a fork/join captured with its branches joined in the
    other order updates; else TOPOLOGY_CHANGED), each edge its type (a programmatic edge, from a PDL launch,
    made ordinary or back: TOPOLOGY_CHANGED, as llama.cpp's refused updates at mmvf -> mmf show), and a memcpy
    keeps its direction (PARAMETERS_CHANGED).
    Kernel function, grid, block and parameters may change."""
    if len(old) != len(new):
        return UpdateOutcome(False, UpdateResult.TOPOLOGY_CHANGED, None)
    for i, (a, b) in enumerate(zip(old, new)):
        if a.type != b.type:
            return UpdateOutcome(False, UpdateResult.NODE_TYPE_CHANGED, f"{b.describe(i)}, was {a.type} {a.name}")
        if set(a.deps) != set(b.deps):
            return UpdateOutcome(False, UpdateResult.TOPOLOGY_CHANGED,
                                 f"{b.describe(i)}: depends on {list(b.deps)}, was {list(a.deps)}")
        if _programmatic_edges(old, i) != _programmatic_edges(new, i):
            kind = ("programmatic" if _programmatic_edges(new, i) else "ordinary")
            return UpdateOutcome(False, UpdateResult.TOPOLOGY_CHANGED,
                                 f"{b.describe(i)}: its edges became {kind} (PDL launch changed)")
        if a.type == "memcpy" and a.name != b.name:
            return UpdateOutcome(False, UpdateResult.PARAMETERS_CHANGED, f"{b.describe(i)}, was {a.name}")
    return UpdateOutcome(True)

"""Concurrent regions (ggml_backend_cuda_graph_optimize, opt-in with GGML_CUDA_GRAPH_OPT=1).

Found at every scheduler alloc, for each GPU split, as upstream does it: a fork node whose name contains
`attn_norm` and that exactly three single-row consumers read (fan-out is counted only over non-no-op nodes
of at most one row, so regions exist at 1 token and not at 2); the branches grow from each consumer
(a node joins a branch when it reads one of its nodes, or views the same tensor); the join is the first
node that reads two or more branches. A region is dropped when the nodes between fork and join are not
exactly the branch nodes (llama.cpp: "the number of nodes in the middle is not equal to the total number of
branch nodes" — e.g. the KQ mask cast that sits inside layer 0's range). Branch b runs on stream b+1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.graph import Graph
from ...ir.ops import is_view_or_noop

FAN_OUT = 3
FORK_NAME = "attn_norm"


@dataclass
class Region:
    fork: int                          # node index of the fork
    join: int                          # node index of the join
    stream_of: dict[int, int] = field(default_factory=dict)  # node index -> stream (1..n_branches)
    n_branches: int = FAN_OUT

    def branch_sizes(self) -> tuple[int, ...]:
        sizes = [0] * self.n_branches
        for s in self.stream_of.values():
            sizes[s - 1] += 1
        return tuple(sizes)


class _View:
    """Per-node facts graph_optimize reads, gathered once: src indices, view base, no-op, row count."""

    def __init__(self, graph: Graph):
        rec, nodes = graph.arena.rec, graph.nodes
        self.graph = graph
        pos = {int(idx): i for i, idx in enumerate(nodes.tolist())}
        base, size = graph.arena.base, rec.dtype.itemsize
        self.srcs: list[tuple[int, ...]] = []
        self.base_of: list[int] = []
        self.noop: list[bool] = []
        self.nrows: list[int] = []
        for idx in nodes.tolist():
            r = rec[idx]
            self.srcs.append(tuple((int(a) - base) // size for a in r["src"] if a != 0))
            vs = int(r["view_src"])
            self.base_of.append((vs - base) // size if vs else idx)
            self.noop.append(is_view_or_noop(int(r["op"]), r["ne"]))
            ne = r["ne"]
            self.nrows.append(int(ne[1]) * int(ne[2]) * int(ne[3]))
        self.idx = [int(x) for x in nodes.tolist()]
        self.pos = pos

    def depends_on(self, i: int, j: int) -> bool:
        """Node i reads node j (a src), or both view the same tensor."""
        return self.idx[j] in self.srcs[i] or self.base_of[i] == self.base_of[j]


def find_regions(graph: Graph) -> list[Region]:
    """Every valid fork/join region of the graph, in node order."""
    v = _View(graph)
    n = graph.n_nodes
    fan_out: dict[int, int] = {}
    for i in range(n):
        if v.noop[i] or v.nrows[i] > 1:
            continue
        for s in v.srcs[i]:
            fan_out[s] = fan_out.get(s, 0) + 1
    regions: list[Region] = []
    taken: list[tuple[int, int]] = []
    for root in range(n):
        if fan_out.get(v.idx[root], 0) != FAN_OUT or FORK_NAME not in graph.node(root).name:
            continue
        if any(a <= root <= b for a, b in taken):
            continue
        r = _region_at(v, root)
        if r is not None:
            regions.append(r)
            taken.append((r.fork, r.join))
    return regions


def _region_at(v: _View, root: int) -> Region | None:
    n = len(v.idx)
    branches = [[i] for i in range(root + 1, n) if not v.noop[i] and v.depends_on(i, root)]
    if len(branches) != FAN_OUT:
        return None
    join = None
    for i in range(root + 1, n):
        owners = [b for b, nodes in enumerate(branches) if any(v.depends_on(i, j) for j in nodes)]
        if len(owners) >= 2:
            join = i
            break
        for b in owners:
            if i not in branches[b]:
                branches[b].append(i)
        if not owners and v.noop[i]:
            branches[0].append(i)      # a no-op can go anywhere: it launches nothing
    if join is None:
        return None
    stream_of = {i: b + 1 for b, nodes in enumerate(branches) for i in nodes}
    if join - root - 1 != sum(len(b) for b in branches) or len(stream_of) != join - root - 1:
        return None                    # nodes in the middle that belong to no branch
    return Region(root, join, stream_of)

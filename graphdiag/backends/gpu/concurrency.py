"""Concurrent regions (ggml_backend_cuda_graph_optimize, opt-in with GGML_CUDA_GRAPH_OPT=1).

Found once per scheduler alloc: a fork node named `attn_norm*` with exactly three consumers (the Q/K/V
mat-muls), the branches that grow from each consumer, and the join node (the first node reading more than
one branch). Branch b runs on stream b+1; the fork records an event on stream 0 that the branch streams wait
on; at the join every branch records an event and stream 0 waits on all. A region is skipped when a node
between fork and join belongs to no branch or to several (llama.cpp: "the number of nodes in the middle is
not equal to the total number of branch nodes").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...ir.graph import Graph

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


def _deps(graph: Graph, i: int, index_of: dict[int, int]) -> list[int]:
    """Node indices (in this graph) that node i reads, through src and view_src."""
    t = graph.node(i)
    out = [index_of[s.idx] for s in t.src if s is not None and s.idx in index_of]
    v = t.view_src
    if v is not None and v.idx in index_of:
        out.append(index_of[v.idx])
    return out


def find_regions(graph: Graph) -> list[Region]:
    """Every valid fork/join region of the graph, in node order."""
    nodes = graph.nodes.tolist()
    index_of = {idx: i for i, idx in enumerate(nodes)}
    consumers: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        for d in set(_deps(graph, i, index_of)):
            consumers.setdefault(d, []).append(i)
    regions = []
    i = 0
    while i < len(nodes):
        r = _region_at(graph, i, consumers, index_of) if FORK_NAME in graph.node(i).name else None
        if r is not None:
            regions.append(r)
            i = r.join
        i += 1
    return regions


def _region_at(graph: Graph, fork: int, consumers, index_of) -> Region | None:
    heads = sorted(consumers.get(fork, []))
    if len(heads) != FAN_OUT:
        return None
    branch = {h: b + 1 for b, h in enumerate(heads)}
    for i in range(heads[0] + 1, graph.n_nodes):
        if i in branch:
            continue
        owners = {branch[d] for d in _deps(graph, i, index_of) if d in branch}
        if len(owners) > 1:
            region = Region(fork, i, branch)
            middle = set(range(fork + 1, i))
            if middle != set(branch):
                return None           # nodes in the middle that belong to no single branch
            return region
        if len(owners) == 1:
            branch[i] = owners.pop()
    return None

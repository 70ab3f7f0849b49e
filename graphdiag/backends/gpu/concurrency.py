"""Concurrent regions (ggml_backend_cuda_graph_optimize, opt-in with GGML_CUDA_GRAPH_OPT=1), as llama.cpp
0c1e57098 forms, reorders and validates them.

Found at every scheduler alloc, for each GPU split: a fork node whose name contains `attn_norm` and that
exactly three single-row consumers read (fan-out is counted only over non-no-op nodes of at most one row, so
regions exist at 1 token and not at 2); the branches grow from each consumer (a node joins a branch when it
reads one of its nodes, or views the same tensor); the join is the first node that reads two or more
branches. A region is refused when the nodes between fork and join are not exactly the branch nodes
(llama.cpp: "the number of nodes in the middle is not equal to the total number of branch nodes" — e.g. the
KQ mask cast inside layer 0's range in graphdiag's d99724f2 graph; at 0c1e57098 the mask is an F16 input,
no node, and every layer forms one). Branch b runs on stream b+1.

A formed region's nodes are interleaved (`interleave`: one node of each branch in turn, no-ops kept with the
node before them), so the allocator, which walks that order, keeps every branch's tensors alive across the
region; the original order is kept (`Region.order`). At graph_compute (before an evaluation or capture)
every region is checked (`invalid_reason`, ggml_cuda_concurrent_event::is_valid: no write range of one
stream overlaps another's, join buffer aside; no node reads a node of another stream). All valid: the
original order is restored for the capture; one invalid: every region is dropped and the interleaved order
runs on one stream.

is_valid leaves out every tensor that overlaps the join's buffer and never looks at the tensors a region reads
from before the fork, so a region it passes can still race (`races`): ggml-alloc, walking the interleaved
order, frees the fork's output once the last branch in that order has read it and hands it to another
branch (tiny: Q's rope goes over attn_norm while K's and V's mat-muls on the other streams may still be
reading it), and two streams write and read the same bytes with no event between them. Real
llama.cpp 0c1e57098 with GGML_CUDA_GRAPH_OPT=1 computes other tokens than without it on such graphs (H200,
2026-12-03: tiny F16 from its 3rd decode, Gemma 3 270M from its 1st); graphdiag launches what llama.cpp
launches, so it races too, and names the tensors (ConcurrentRace).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.graph import Graph
from ...ir.ops import is_view_or_noop
from ...ir.tensor import Tensor
from .fusion import written_nodes

FAN_OUT = 3
FORK_NAME = "attn_norm"
MIDDLE = "nodes between fork and join are not exactly the branch nodes"
NO_JOIN = "no node reads two branches"


@dataclass
class Region:
    fork: int                          # node index of the fork
    join: int                          # node index of the join
    stream_of: dict[int, int] = field(default_factory=dict)  # node index (original order) -> stream 1..n
    n_branches: int = FAN_OUT
    order: tuple[int, ...] = ()        # tensor slots fork+1..join-1, original order (original_order)
    interleaved: tuple[int, ...] = ()  # the same slots in the order graph_optimize leaves them

    def branch_sizes(self) -> tuple[int, ...]:
        sizes = [0] * self.n_branches
        for s in self.stream_of.values():
            sizes[s - 1] += 1
        return tuple(sizes)


@dataclass(frozen=True)
class Refusal:
    """A fork graph_optimize looked at and formed no region for."""
    fork: int
    join: int                          # -1: none found
    reason: str


class _View:
    """Per-node facts graph_optimize reads, gathered once: src indices, view base, no-op, row count."""

    def __init__(self, graph: Graph):
        rec, nodes = graph.arena.rec, graph.nodes
        self.graph = graph
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

    def depends_on(self, i: int, j: int) -> bool:
        """Node i reads node j (a src), or both view the same tensor."""
        return self.idx[j] in self.srcs[i] or self.base_of[i] == self.base_of[j]


def find_regions(graph: Graph) -> list[Region]:
    """Every region graph_optimize forms in `graph` (node order), the graph left as it is."""
    return scan(graph)[0]


def scan(graph: Graph) -> tuple[list[Region], list[Refusal]]:
    """(regions formed, forks refused), in node order; reads the graph, changes nothing."""
    v = _View(graph)
    n = graph.n_nodes
    fan_out: dict[int, int] = {}
    for i in range(n):
        if v.noop[i] or v.nrows[i] > 1:
            continue
        for s in v.srcs[i]:
            fan_out[s] = fan_out.get(s, 0) + 1
    regions: list[Region] = []
    refused: list[Refusal] = []
    for root in range(n):
        if fan_out.get(v.idx[root], 0) != FAN_OUT or FORK_NAME not in graph.node(root).name:
            continue
        if any(r.fork <= root <= r.join for r in regions):
            continue
        got = _region_at(v, root)
        (regions if isinstance(got, Region) else refused).append(got)
    return regions, refused


def _region_at(v: _View, root: int) -> Region | Refusal:
    n = len(v.idx)
    branches = [[i] for i in range(root + 1, n) if not v.noop[i] and v.depends_on(i, root)]
    if len(branches) != FAN_OUT:
        return Refusal(root, -1, f"{len(branches)} consumers, not {FAN_OUT}")
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
        return Refusal(root, -1, NO_JOIN)
    if join - root - 1 != sum(len(b) for b in branches):
        return Refusal(root, join, MIDDLE)   # e.g. the KQ mask cast (a CPY) in layer 0's range (d99724f2)
    stream_of = {i: b + 1 for b, nodes in enumerate(branches) for i in nodes}
    order = tuple(v.idx[root + 1:join])
    interleaved = tuple(v.idx[i] for i in interleave(branches, v.noop))
    return Region(root, join, stream_of, len(branches), order, interleaved)


def interleave(branches: list[list[int]], noop: list[bool]) -> list[int]:
    """The branch nodes (indices) in graph_optimize's order: each branch in turn gives its next node and
    the no-ops right after it. [norm, Q, Qrope, K, Krope, V, join] -> [norm, Q, K, V, Qrope, Krope, join]."""
    queues = [list(b) for b in branches]
    out: list[int] = []
    b, total = 0, sum(len(q) for q in queues)
    while len(out) < total:
        q = queues[b]
        if q:
            out.append(q.pop(0))
            while q and noop[q[0]]:
                out.append(q.pop(0))
        b = (b + 1) % len(queues)
    return out


def invalid_reason(graph: Graph, r: Region) -> str:
    """ggml_cuda_concurrent_event::is_valid over the allocated addresses: "" when the region may run on
    its streams, else why not (a write range of one stream overlapping another's, the join's buffer
    aside; or a node reading a node of another stream)."""
    tensors = {slot: Tensor(graph.arena, slot) for slot in r.order}
    pos = {slot: r.fork + 1 + k for k, slot in enumerate(r.order)}
    stream = {slot: r.stream_of[pos[slot]] for slot in r.order}
    join = graph.node(r.join)
    jt = join.view_src or join
    j0, j1 = jt.data, jt.data + jt.nbytes()
    spans: dict[int, tuple[int, int]] = {}
    for slot, t in tensors.items():
        b = t.view_src or t
        lo, hi = b.data, b.data + b.nbytes()
        if (lo <= j0 < hi) or (j0 <= lo < j1):
            continue                   # the join's buffer: several nodes may use it, synchronised there
        spans[slot] = (lo, hi)
    for slot, t in tensors.items():
        if slot in spans:
            lo, hi = spans[slot]
            for other, (olo, ohi) in spans.items():
                if stream[other] != stream[slot] and lo <= olo < hi:
                    return (f"writes of {t.name} (stream {stream[slot]}) overlap "
                            f"{tensors[other].name} (stream {stream[other]})")
        for s in t.src:
            if s is not None and s.idx in stream and stream[s.idx] != stream[slot]:
                return f"{t.name} (stream {stream[slot]}) reads {s.name} (stream {stream[s.idx]})"
    return ""


def races(graph: Graph, r: Region, plan: dict | None = None) -> list[tuple[str, int, str, int]]:
    """Pairs of bytes two streams of region `r` touch with no event between them, on the allocated
    addresses: (name, stream, other name, other stream), one per pair of tensors. What a stream writes
    against what another writes, and against what another reads from before the fork (the fork's output,
    say), the join's buffer included (a valid region's streams only meet at the join).

    `plan` (the split's fusion plan, node index -> Fusion): a fused kernel writes only its output node (and
    the top-k MoE router its ids too); the nodes it elides are never written, but what they read from
    outside is still read, on the group's stream. A read through a view is a read of the view's base."""
    inside = set(r.order)
    elided = {q + k for q, f in (plan or {}).items() for k in range(f.absorbed + 1)
              if q + k not in written_nodes(q, f)}
    writes: list[tuple[int, int, int, str]] = []      # (lo, hi, stream, name) of each output written
    reads: dict[tuple[int, int], tuple[int, int, int, str]] = {}   # (slot, stream) -> a read from before the fork
    for k, slot in enumerate(r.order):
        pos = r.fork + 1 + k
        stream = r.stream_of.get(pos)
        t = Tensor(graph.arena, slot)
        if stream is None or is_view_or_noop(t.op, t.ne):
            continue                  # a view reads nothing itself: its readers read its base
        b = t.view_src or t
        if pos not in elided:
            writes.append((b.data, b.data + b.nbytes(), stream, t.name))
        for src in t.src:
            if src is None:
                continue
            sb = src.view_src or src
            if sb.idx not in inside and sb.idx >= graph.arena.mark:    # compute buffers (weights/caches aside)
                reads.setdefault((sb.idx, stream), (sb.data, sb.data + sb.nbytes(), stream, sb.name))
    out = []
    others = list(reads.values())
    for i, (lo, hi, st, name) in enumerate(writes):
        for olo, ohi, ost, oname in writes[i + 1:] + others:
            if ost != st and lo < ohi and olo < hi:
                out.append((name, st, oname, ost))
    return out

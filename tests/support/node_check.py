"""Every node of one step computed on two drivers, compared node by node (which kernel computes wrongly).

Each session runs the same model and tokens with graphs and fusion off; before the step's graph is allocated
every node is flagged OUTPUT, so the allocator gives each its own memory and nothing is overwritten. After the
step every non-view node's bytes are read back from its backend and the two runs are compared in node order:
the first node whose relative difference jumps while its sources still agree is the kernel to look at.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.ir.dtypes import GGMLType
from graphdiag.ir.ops import Op, TensorFlag, is_view_or_noop
from graphdiag.runner import Session

_READABLE = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32}


@dataclass
class NodeValue:
    index: int
    name: str
    op: str
    type: str
    ne: tuple
    srcs: tuple          # the node indexes of its sources that are nodes (-1: a leaf, a weight, an input)
    value: np.ndarray | None


def node_values(settings: dict, tokens: list[int]) -> list[NodeValue]:
    """One prefill of `tokens` under `settings` (run's settings: model, backend, ...), every node's value."""
    cfg = resolve({"fusion": False, "graphs_disabled": True, "steps": 1, **settings}, environ={})
    s = Session(cfg, E.EventBus())
    try:
        sched = s.ctx.sched
        alloc = sched.alloc_graph
        built = []

        def alloc_all_outputs(graph):
            for t in graph.iter_nodes():
                t.flags = t.flags | int(TensorFlag.OUTPUT)
            built.append(graph)
            alloc(graph)

        sched.alloc_graph = alloc_all_outputs
        s.ctx.prefill(tokens)
        graph = built[-1]
        index = {t.idx: i for i, t in enumerate(graph.iter_nodes())}
        out = []
        for i, t in enumerate(graph.iter_nodes()):
            op = t.op
            srcs = tuple(index.get(x.idx, -1) for x in t.src if x is not None)
            value = None
            dtype = _READABLE.get(t.type)
            if dtype is not None and not is_view_or_noop(int(op), t.ne) and t.is_contiguous():
                raw = sched.backend_of(t).tensor_get(t.data, t.nbytes())
                value = raw.view(dtype).astype(np.float64 if dtype != np.int32 else np.int64)
            out.append(NodeValue(i, t.name, op.name, GGMLType(t.type).name, t.ne, srcs, value))
        return out
    finally:
        s.close()


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b| (inf where one has a NaN/inf the other lacks)."""
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return float("inf")
    if not fa.any():
        return 0.0
    d = np.max(np.abs(a[fa] - b[fb]))
    return float(d / max(np.max(np.abs(b[fb])), 1e-30))


@dataclass
class NodeDiff:
    node: NodeValue
    rel: float
    src_rel: float        # the largest rel of its node sources (0 when they are leaves only)
    magnitude: float      # max |value| on the reference side


def compare(test: list[NodeValue], ref: list[NodeValue]) -> list[NodeDiff]:
    """Node by node (the two graphs must be the same); nodes without a readable value are skipped but pass
    their sources' difference on."""
    if [(n.op, n.ne) for n in test] != [(n.op, n.ne) for n in ref]:
        raise ValueError("the two runs built different graphs")
    rel = [0.0] * len(ref)
    out = []
    for a, b in zip(test, ref):
        src_rel = max((rel[j] for j in a.srcs if j >= 0), default=0.0)
        if a.value is None or b.value is None:
            rel[a.index] = src_rel
            continue
        r = rel_diff(a.value, b.value)
        rel[a.index] = r
        mag = float(np.max(np.abs(b.value[np.isfinite(b.value)]), initial=0.0))
        out.append(NodeDiff(a, r, src_rel, mag))
    return out


def culprits(diffs: list[NodeDiff], jump: float = 10.0, floor: float = 1e-3) -> list[NodeDiff]:
    """Nodes whose difference is over `floor` and `jump` times their sources' (a kernel that adds error)."""
    return [d for d in diffs if d.rel > floor and d.rel > jump * max(d.src_rel, 1e-7)]


def table(diffs: list[NodeDiff], only: list[NodeDiff] | None = None) -> str:
    rows = only if only is not None else diffs
    lines = [f"{'node':>5} {'op':<15} {'type':<5} {'ne':<24} {'rel':>10} {'src rel':>10} {'max|ref|':>10}  name"]
    for d in rows:
        n = d.node
        lines.append(f"{n.index:>5} {n.op:<15} {n.type:<5} {str(n.ne):<24} {d.rel:>10.3g} {d.src_rel:>10.3g} "
                     f"{d.magnitude:>10.3g}  {n.name}")
    return "\n".join(lines)

"""Runtime fusion (ggml_cuda_try_fuse): which nodes a fused kernel absorbs.

`try_fuse` returns how many FOLLOWING nodes the fusion at node i absorbed (0 = none); the capture loop skips
them, so a chunk boundary never falls inside a fusion. Fusions never change the node list; one of them
depends on the batch (gate/up mat-vec + GLU only while the mat-vec path applies, n_tokens <= 8), which is
why a batch change can change the captured CUDA graph's topology.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir.graph import Graph
from ...ir.ops import GluOp, Op
from .compat import MMVQ_MAX_BATCH_SIZE

RMS_NORM_MUL = "rms_norm+mul"
MMV_GLU = "mul_mat_vec+glu"
ROPE_SET_ROWS = "rope+view+set_rows"


@dataclass(frozen=True)
class Fusion:
    pattern: str
    absorbed: int


def consumer_counts(graph: Graph) -> dict[int, int]:
    """How many nodes of the graph read each struct (by arena index), through their src pointers."""
    rec = graph.arena.rec
    src = rec["src"][graph.nodes]
    addrs = src[src != 0]
    idx = ((addrs - np.uint64(graph.arena.base)) // np.uint64(rec.dtype.itemsize)).astype(np.int64)
    uniq, cnt = np.unique(idx, return_counts=True)
    return dict(zip(uniq.tolist(), cnt.tolist()))


def try_fuse(graph: Graph, i: int, consumers: dict[int, int]) -> Fusion | None:
    """The fusion starting at node i, if one matches."""
    n = graph.n_nodes
    node = graph.node(i)
    op = node.op
    if op == Op.RMS_NORM and i + 1 < n:
        nxt = graph.node(i + 1)
        if nxt.op == Op.MUL and nxt.src[0] == node and consumers.get(node.idx, 0) == 1:
            return Fusion(RMS_NORM_MUL, 1)
    elif op == Op.MUL_MAT and i + 2 < n:
        up, glu = graph.node(i + 1), graph.node(i + 2)
        if (up.op == Op.MUL_MAT and glu.op == Op.GLU and glu.param_i32(0) == GluOp.SWIGLU
                and glu.src[0] == node and glu.src[1] == up and up.src[1] == node.src[1]
                and up.src[0].type == node.src[0].type
                and node.src[1].ne[1] <= MMVQ_MAX_BATCH_SIZE and node.src[1].ne[2] == 1
                and consumers.get(node.idx, 0) == 1 and consumers.get(up.idx, 0) == 1):
            return Fusion(MMV_GLU, 2)
    elif op == Op.ROPE and i + 2 < n:
        view, sr = graph.node(i + 1), graph.node(i + 2)
        if (view.op in (Op.VIEW, Op.RESHAPE) and view.src[0] == node and sr.op == Op.SET_ROWS
                and sr.src[1] == view and consumers.get(node.idx, 0) == 1 and consumers.get(view.idx, 0) == 1):
            return Fusion(ROPE_SET_ROWS, 2)
    return None


def fusion_plan(graph: Graph) -> dict[int, Fusion]:
    """try_fuse evaluated at every node the loop can reach (a node absorbed by a fusion is never tried)."""
    consumers = consumer_counts(graph)
    plan: dict[int, Fusion] = {}
    i = 0
    while i < graph.n_nodes:
        f = try_fuse(graph, i, consumers)
        if f:
            plan[i] = f
            i += f.absorbed
        i += 1
    return plan

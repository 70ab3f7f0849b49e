"""The graph tests every fusion rule shares (ggml-impl.h's ggml_can_fuse, ggml_node_has_n_uses and
ggml-cuda's ggml_cuda_check_fusion_memory_ranges), and the Fusion record try_fuse returns."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ...ir.arena import TENSOR_SIZE
from ...ir.dtypes import type_size
from ...ir.graph import Graph
from ...ir.ops import VIEW_OPS, Op, TensorFlag
from ...ir.tensor import _O_SRC, _SRC, Tensor

_COMPUTE, _OUTPUT = int(TensorFlag.COMPUTE), int(TensorFlag.OUTPUT)   # ints: an IntFlag's & runs Python code
_SRC01 = struct.Struct("<2Q")                 # a struct's src[0] and src[1]


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


def launching_nodes(graph: Graph) -> list[bool]:
    """Per node: does the capture loop issue it (not a view/no-op, flag COMPUTE)? One vectorised pass."""
    rec = graph.arena.rec
    nodes = graph.nodes
    ops, flags = rec["op"][nodes], rec["flags"][nodes]
    noop = np.isin(ops, VIEW_OPS) | (rec["ne"][nodes] == 0).any(axis=1)
    return (~noop & (flags & TensorFlag.COMPUTE.value != 0)).tolist()


def _single_use(t: Tensor, consumers: dict[int, int]) -> bool:
    """ggml_node_has_n_uses(.., 1): one reader, not a view, not an output."""
    return consumers.get(t.idx, 0) == 1 and t.view_src is None and not t.flags & _OUTPUT


def _can_fuse(graph: Graph, i: int, ops: tuple[Op, ...], consumers: dict[int, int]) -> bool:
    """ggml_can_fuse: consecutive nodes with these ops, each (but the last) read once and by the next,
    all of the same shape and all COMPUTE."""
    if i + len(ops) > graph.n_nodes:
        return False
    mem, base = graph.arena.mem, graph.arena.base
    prev = None
    for k, op in enumerate(ops):
        t = graph.node(i + k)
        if t.op != op or not t.flags & _COMPUTE:
            return False
        if k < len(ops) - 1 and not _single_use(t, consumers):
            return False
        if prev is not None:
            # prev is t.src[0] or t.src[1]: compared as struct addresses (one arena), no Tensor built
            a = base + prev.idx * TENSOR_SIZE
            if a not in _SRC01.unpack_from(mem, t.idx * TENSOR_SIZE + _O_SRC) or t.ne != prev.ne:
                return False
        prev = t
    return True


def _memory_ranges_ok(graph: Graph, i: int, n: int, out: int | tuple[int, ...], may_alias: Tensor | None = None
                      ) -> bool:
    """ggml_cuda_check_fusion_memory_ranges: the fused kernel writes node `out` (or each of several); no source
    of the n fused nodes (other than a node the fusion elides, i.e. an earlier node of the group) may overlap
    an output, or the kernel would overwrite what it still reads. Sources without an op (weights, inputs) are
    skipped, and `may_alias` (the top-k MoE kernel's logits, read whole before any write)."""
    arena, nodes = graph.arena, graph.nodes
    mem, base = arena.mem, arena.base
    group = {int(nodes[k]): k for k in range(i, i + n)}
    for o in (out,) if isinstance(out, int) else out:
        dst = graph.node(o)
        lo = dst.data
        if lo == 0:
            continue            # not allocated (a graph built without memory): nothing can overlap
        hi = lo + dst.nbytes()
        for j in range(i, i + n):
            for a in _SRC.unpack_from(mem, int(nodes[j]) * TENSOR_SIZE + _O_SRC):   # Tensors only for sources
                if not a:
                    continue
                s = Tensor(arena, (a - base) // TENSOR_SIZE)
                if s.op == Op.NONE or s == may_alias:
                    continue
                s_lo = s.data
                if s_lo < hi and lo < s_lo + s.nbytes() and not (s.idx in group and group[s.idx] < j):
                    return False
    return True


def subgraph_ok(graph: Graph, i: int, ops: tuple[Op, ...], outputs: tuple[int, ...], consumers: dict[int, int]
                ) -> bool:
    """ggml_can_fuse_subgraph: nodes i.. with these ops, all COMPUTE; every node but the `outputs` (node
    indices) neither a graph output nor read outside the group, and a view's sources inside the group."""
    if i + len(ops) > graph.n_nodes:
        return False
    group = [graph.node(i + k) for k in range(len(ops))]
    idx = {t.idx for t in group}
    for k, (t, op) in enumerate(zip(group, ops)):
        if t.op != op or not t.flags & _COMPUTE:
            return False
        if i + k in outputs:
            continue
        if t.flags & _OUTPUT:
            return False
        inside = sum(1 for u in group[k + 1:] for s in u.src if s is not None and s == t)
        if inside != consumers.get(t.idx, 0):
            return False
        vs = t.view_src
        if vs is not None and vs.idx not in idx:
            return False        # upstream allows a weight (ggml_is_constant): no fused group here views one
    return True


def contiguous_rows(t: Tensor) -> bool:
    """ggml_is_contiguous_rows: a row is one block, or its elements are adjacent."""
    return t.ne[0] == 1 or t.nb[0] == type_size(t.type)


def other_src(node: Tensor, t: Tensor) -> Tensor:
    """The operand of a binary node that is not `t` (src[1] when t is src[0], else src[0])."""
    s = node.src
    return s[1] if s[0] == t else s[0]

"""try_fuse's RMS_NORM family (ggml-cuda.cu 0c1e57098, the last attempts of ggml_cuda_try_fuse), in its order:

  rms_norm+mul+rope+view+set_rows   QK-norm of K, roped, written to the cache (Gemma 3, Qwen3)   absorbs 4
  rms_norm+mul+rope                 QK-norm, roped (Q; K when its cache write does not follow)   absorbs 2
  rms_norm+mul+add                  a norm then the residual ADD (Gemma 3's post-attention/FFN)  absorbs 2
  rms_norm+mul                      any other norm times its weight                              absorbs 1
  rms_norm+scale                    a norm then a SCALE of it without bias (0c1e57098 only)       absorbs 1

All five at any batch. rms_norm+scale (ggml_cuda_can_fuse's RMS_NORM, SCALE branch, 0c1e57098) is not in
ggml d99724f2: under --upstream d99724f2 it is not tried. No shipped model scales a norm, so it changes no
preset's kernel count.
"""

from __future__ import annotations

from ...ir.dtypes import GGMLType
from ...ir.graph import Graph
from ...ir.ops import Op
from ...ir.tensor import Tensor
from .fusion_graph import (Fusion, _can_fuse, _memory_ranges_ok, consumer_counts,
                           contiguous_rows, other_src, subgraph_ok)

RMS_NORM_MUL = "rms_norm+mul"
RMS_NORM_MUL_ADD = "rms_norm+mul+add"
RMS_NORM_MUL_ROPE = "rms_norm+mul+rope"
RMS_NORM_MUL_ROPE_SET_ROWS = "rms_norm+mul+rope+view+set_rows"
RMS_NORM_SCALE = "rms_norm+scale"

ROPE_NORMAL, ROPE_NEOX = 0, 2
_F32 = GGMLType.F32
_NORM_MUL_ROPE = (Op.RMS_NORM, Op.MUL, Op.ROPE)
_NORM_MUL_ADD = (Op.RMS_NORM, Op.MUL, Op.ADD)
_NORM_MUL = (Op.RMS_NORM, Op.MUL)
_NORM_SCALE = (Op.RMS_NORM, Op.SCALE)


def rope_set_rows_ok(rope: Tensor, view: Tensor, sr: Tensor) -> bool:
    """ggml_cuda_should_fuse_rope_set_rows: ne3 of 1, an F32/F16 destination, a contiguous view flattening
    the rope's two inner dims into one row, a normal or NEOX rope (the I64 index test holds by
    construction: graphdiag's I32 indices stand in for llama.cpp's I64)."""
    return (rope.op == Op.ROPE and view.op == Op.VIEW and sr.op == Op.SET_ROWS and rope.src[0].ne[3] == 1
            and sr.type in (GGMLType.F32, GGMLType.F16) and view.is_contiguous()
            and view.ne[0] == rope.ne[0] * rope.ne[1] and rope.param_i32(2) in (ROPE_NORMAL, ROPE_NEOX))


def _norm_mul_rope_ok(norm: Tensor, mul: Tensor, rope: Tensor) -> bool:
    """ggml_cuda_should_fuse_rms_norm_mul_rope."""
    if (norm.op, mul.op, rope.op) != _NORM_MUL_ROPE:
        return False
    if any(t.type != _F32 for t in (norm.src[0], norm, mul.src[0], mul.src[1], mul, rope)):
        return False
    if rope.src[0] != mul or norm.ne != mul.ne:
        return False
    if norm == mul.src[1] and mul.src[0].ne != norm.ne:
        return False            # rms_norm as the B operand: no broadcast
    if not all(contiguous_rows(t) for t in (norm.src[0], mul.src[0], mul.src[1])):
        return False
    n_dims = rope.param_i32(1)
    return (rope.param_i32(2) in (ROPE_NORMAL, ROPE_NEOX) and n_dims % 2 == 0 and rope.src[0].ne[0] % 2 == 0
            and rope.param_i32(15) == 0)     # ggml_rope_set_offset's n_offs: never set by graphdiag's graphs


def _subgraph_ok(graph: Graph, i: int, ops: tuple[Op, ...], consumers: dict[int, int]) -> bool:
    """ggml_can_fuse_subgraph with the last node the only output."""
    return subgraph_ok(graph, i, ops, (i + len(ops) - 1,), consumers)


def _norm_mul_rope_set_rows(graph: Graph, i: int, consumers) -> bool:
    ops = (Op.RMS_NORM, Op.MUL, Op.ROPE, Op.VIEW, Op.SET_ROWS)
    if not _subgraph_ok(graph, i, ops, consumers):
        return False
    norm, mul, rope, view, sr = (graph.node(i + k) for k in range(5))
    # ggml_check_edges {1,0,0}, {2,0,1}, {3,0,2}, {4,0,3}; ggml's set_rows src[0] (the rows) is graphdiag's src[1]
    if mul.src[0] != norm or rope.src[0] != mul or view.src[0] != rope or sr.src[1] != view:
        return False
    return (_norm_mul_rope_ok(norm, mul, rope) and rope_set_rows_ok(rope, view, sr)
            and _memory_ranges_ok(graph, i, 5, i + 4))


def _norm_mul_rope(graph: Graph, i: int, consumers) -> bool:
    if not _can_fuse(graph, i, _NORM_MUL_ROPE, consumers):
        return False
    norm, mul, rope = (graph.node(i + k) for k in range(3))
    return _norm_mul_rope_ok(norm, mul, rope) and _memory_ranges_ok(graph, i, 3, i + 2)


def _norm_mul_types_ok(norm: Tensor, mul: Tensor) -> bool:
    """ggml_cuda_can_fuse's RMS_NORM, MUL[, ADD] branch, its MUL part."""
    a, b = mul.src[:2]
    if mul.type != _F32 or a.type != _F32 or b.type != _F32:
        return False
    if norm == b and a.ne != norm.ne:
        return False            # rms_norm as the B operand: no broadcast
    # no memory-range check upstream: the fused kernel reads a row whole before it writes it (in place is safe)
    return contiguous_rows(a) and contiguous_rows(b)


def _norm_mul_add(graph: Graph, i: int, consumers) -> bool:
    if not _can_fuse(graph, i, _NORM_MUL_ADD, consumers):
        return False
    norm, mul, add = (graph.node(i + k) for k in range(3))
    a, b = add.src[:2]
    if add.type != _F32 or a.type != _F32 or b.type != _F32 or not _norm_mul_types_ok(norm, mul):
        return False
    return a.is_contiguous() and contiguous_rows(b)


def _norm_mul(graph: Graph, i: int, consumers) -> bool:
    return _can_fuse(graph, i, _NORM_MUL, consumers) and _norm_mul_types_ok(graph.node(i), graph.node(i + 1))


def norm_scale_ok(graph: Graph, i: int, consumers) -> bool:
    """ggml_cuda_can_fuse(RMS_NORM, SCALE) (0c1e57098): ggml_can_fuse (the SCALE reads the norm, its only
    reader, same shape, both COMPUTE), then a bias (SCALE's op param 1) of 0 and an F32 SCALE. The norm's
    F32 input and output, which upstream asserts, hold for every RMS_NORM graphdiag builds."""
    if not _can_fuse(graph, i, _NORM_SCALE, consumers):
        return False
    scale = graph.node(i + 1)
    return scale.param_f32(1) == 0.0 and scale.type == _F32


def try_fuse_norm(graph: Graph, i: int, consumers: dict[int, int], upstream: str = "0c1e57098") -> Fusion | None:
    """The RMS_NORM fusion starting at node i (an RMS_NORM), in try_fuse's order, or None; `upstream`: the
    rules' commit (d99724f2 has no rms_norm+scale)."""
    if _norm_mul_rope_set_rows(graph, i, consumers):
        return Fusion(RMS_NORM_MUL_ROPE_SET_ROWS, 4)
    if _norm_mul_rope(graph, i, consumers):
        return Fusion(RMS_NORM_MUL_ROPE, 2)
    if _norm_mul_add(graph, i, consumers):
        return Fusion(RMS_NORM_MUL_ADD, 2)
    if _norm_mul(graph, i, consumers):
        return Fusion(RMS_NORM_MUL, 1)
    if upstream != "d99724f2" and norm_scale_ok(graph, i, consumers):
        return Fusion(RMS_NORM_SCALE, 1)
    return None


def norm_operands(graph: Graph, i: int, f: Fusion) -> tuple[Tensor, Tensor]:
    """(x, w) of the fused norm at node i: the norm's input and the MUL's other operand."""
    norm, mul = graph.node(i), graph.node(i + 1)
    return norm.src[0], other_src(mul, norm)


__all__ = ["RMS_NORM_MUL", "RMS_NORM_MUL_ADD", "RMS_NORM_MUL_ROPE", "RMS_NORM_MUL_ROPE_SET_ROWS", "RMS_NORM_SCALE",
           "ROPE_NEOX", "ROPE_NORMAL", "consumer_counts", "norm_operands", "norm_scale_ok", "rope_set_rows_ok",
           "try_fuse_norm"]

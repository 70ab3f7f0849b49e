"""Runtime fusion (ggml_cuda_try_fuse): which nodes a fused kernel absorbs.

`try_fuse` returns how many FOLLOWING nodes the fusion at node i absorbed (0 = none); the capture loop skips
them, so a chunk boundary never falls inside a fusion. Fusions never change the node list. The patterns and
their conditions are upstream ggml's, in try_fuse's order, for the ops graphdiag's graphs contain:

  rope+view+set_rows     any batch (the K cache write)
  mul_mat_vec+glu        gate/up mat-vec + GLU, only when the mat-vec writes ONE column (1 token)
  mul_mat_vec+add        a mat-vec and the ADD of a same-shaped operand (the residual), only at 1 token
  mul_mat_id_vec+glu     the experts' gate/up mat-vec + GLU (MoE): float experts at 1 token; quantized
                         ones at every batch their MMVQ path takes (up to get_mmvq_mmid_max_batch: 8 on
                         Volta, Ada and newer), fused into mul_mat_vec_q_moe upstream
  mul_mat_id_vec+add_id+glu  gpt-oss's biased form (MUL_MAT_ID, ADD_ID, MUL_MAT_ID, ADD_ID, GLU), tried first,
                         on the same paths; mul_mat_id_vec+add_id: an expert mat-vec and its bias (the down
                         projection), tried after both
  rms_norm+mul(+...)     any batch: with rope(+view+set_rows), with add, or alone (fusion_norm.py)
  rms_norm+scale         any batch (0c1e57098): a SCALE of the norm with bias 0, tried after the MUL forms
  moe_weighted_reduction any batch (llama.cpp #25952, 0c1e57098): the experts' outputs times the router
                         weights, their k views and the k - 1 ADDs summing them (MoE, 2 <= k <= 15); tried
                         first, at a MUL. Where it can apply, graph_optimize also keeps the experts and the
                         weights alive until its output (#27301: alloc_deps)
  topk_moe               any batch: the router's SOFT_MAX, RESHAPE, ARGSORT, VIEW (ids), GET_ROWS (weights)
                         [, the weight norm: RESHAPE, SUM_ROWS, CLAMP, DIV, RESHAPE (llama's MoE)] [, SCALE]
                         as one kernel (softmax gating; the expert bias is not in graphdiag's graphs), at a
                         SOFT_MAX; the logits may alias the outputs up to 8 rows (one at d99724f2). At
                         0c1e57098 graph_optimize keeps the group's nodes and sources alive until the node
                         after it
  topk_moe(delayed_softmax)  any batch: gpt-oss's SOFTMAX_WEIGHT router, the ARGSORT of the (biased) logits, its
                         VIEW (ids), GET_ROWS of the reshaped logits, RESHAPE, SOFT_MAX, RESHAPE (weights) as the
                         same kernel with the softmax after the top k, at the ARGSORT (ggml_cuda_topk_moe_fusion's
                         delayed_softmax); no weight norm may follow it; graph_optimize keeps nothing for it

The GLU may be SWIGLU, GEGLU (Gemma 3), SWIGLU_OAI (gpt-oss; the fused kernels use upstream's constants) or, at
0c1e57098, SWIGLU_CLAMP (its limit, op param 3, carried into the fused kernel as upstream's
fusion_data.glu_limit), its gate either mat-mul of the pair; mul_mat_vec+add also takes
Qwen2's Q/K/V bias at 1 token (the bias (M,) has the one-column result's shape; a batch broadcasts: no fusion).
Snake, the NVFP4 scale fusions and softcap match no graph here. Under
--upstream d99724f2 the weighted reduction and rms_norm+scale are not tried (they came after), and a GLU
SWIGLU_CLAMP (an op d99724f2's ggml does not have) is refused (lowering.refuse_ops_after).

So a decode step at 1 token fuses more (and launches fewer kernels) than at 2: a 1 <-> 2 token change
changes the captured CUDA graph's topology (the update is refused); 8 <-> 9 fuses alike but for quantised
experts, whose gate/up+GLU fuses up to 8 tokens (and on quantised weights the mat-muls' stream-k fixups and
the experts' MMQ launches change it there: lowering.py, lowering_mmid.py).
llama.cpp's set_rows indices are I64 (its fusion requires it); graphdiag's index tensors are I32 and stand
in for them, so that condition always holds here as it always does in llama.cpp.
"""

from __future__ import annotations

from typing import NamedTuple

from ...ir.dtypes import GGMLType, is_quantized
from ...ir.graph import Graph
from ...ir.ops import GluOp, Op
from ...ir.tensor import Tensor
from ..geometry import TOPK_MOE_ROWS
from .compat import CC_PASCAL, MMVQ_MAX_BATCH_SIZE, mmvf_ok, mmvq_mmid_max_batch
from .fusion_graph import (_COMPUTE, Fusion, _can_fuse, _memory_ranges_ok, _single_use, consumer_counts,
                           launching_nodes, subgraph_ok)
from .fusion_norm import (RMS_NORM_MUL, RMS_NORM_MUL_ADD, RMS_NORM_MUL_ROPE, RMS_NORM_MUL_ROPE_SET_ROWS,
                          RMS_NORM_SCALE, ROPE_NEOX, ROPE_NORMAL, _subgraph_ok, rope_set_rows_ok, try_fuse_norm)

MMV_GLU = "mul_mat_vec+glu"
MMV_ADD = "mul_mat_vec+add"
MMID_GLU = "mul_mat_id_vec+glu"
MMID_BIAS_GLU = "mul_mat_id_vec+add_id+glu"
MMID_ADD_ID = "mul_mat_id_vec+add_id"
_MMID_BIAS_GLU_OPS = (Op.MUL_MAT_ID, Op.ADD_ID, Op.MUL_MAT_ID, Op.ADD_ID, Op.GLU)
ROPE_SET_ROWS = "rope+view+set_rows"
MOE_WR = "moe_weighted_reduction"
TOPK_MOE = "topk_moe"
TOPK_MOE_DELAYED = "topk_moe(delayed_softmax)"
_TOPK_MOE_OPS = (Op.SOFT_MAX, Op.RESHAPE, Op.ARGSORT, Op.VIEW, Op.GET_ROWS)
_TOPK_MOE_DELAYED_OPS = (Op.ARGSORT, Op.VIEW, Op.GET_ROWS, Op.RESHAPE, Op.SOFT_MAX, Op.RESHAPE)
_TOPK_MOE_NORM_OPS = (Op.RESHAPE, Op.SUM_ROWS, Op.CLAMP, Op.DIV, Op.RESHAPE)
MOE_WR_MAX_EXPERTS = 15      # 2k + 1 nodes at most: ggml_can_fuse_subgraph takes fewer than 32

# ggml_cuda_should_fuse_mul_mat's valid_glu_ops: d99724f2 lists SWIGLU, GEGLU and SWIGLU_OAI; 0c1e57098 adds
# SWIGLU_CLAMP (SWIGLU_OAI's fused kernels use upstream's constants, alpha 1.702 and limit 7)
_GLU_FUSABLE = {"0c1e57098": (GluOp.SWIGLU, GluOp.GEGLU, GluOp.SWIGLU_OAI, GluOp.SWIGLU_CLAMP),
                "d99724f2": (GluOp.SWIGLU, GluOp.GEGLU, GluOp.SWIGLU_OAI)}


def _mmvf_ok(mm: Tensor, cc: int) -> bool:
    """ggml_cuda_should_fuse_mul_mat_vec_f on NVIDIA: a float mat-vec (should_use_mmvf, for MUL_MAT_ID
    with its columns counted along src1's ne[2]) writing 1 column (for MUL_MAT_ID: one token)."""
    w, x = mm.src[0], mm.src[1]
    if x.type != GGMLType.F32 or mm.type != GGMLType.F32:
        return False
    if mm.op == Op.MUL_MAT_ID:
        return mmvf_ok(w.type, cc, w, x.ne[2]) and mm.ne[2] == 1
    return mmvf_ok(w.type, cc, w, x.ne[1]) and mm.ne[1] == 1


def _mmvq_ok(mm: Tensor, cc: int) -> bool:
    """ggml_cuda_should_fuse_mul_mat_vec_q: a quantized mat-vec (src1's ne[1] <= 8), not on Pascal or older,
    writing 1 column (MUL_MAT), or (MUL_MAT_ID) up to get_mmvq_mmid_max_batch tokens: the experts' MMVQ
    kernel takes the fusion at every batch it serves (mul_mat_vec_q_moe above one token)."""
    w, x = mm.src[0], mm.src[1]
    cols = mm.ne[2] <= mmvq_mmid_max_batch(w.type, cc) if mm.op == Op.MUL_MAT_ID else mm.ne[1] == 1
    return (is_quantized(w.type) and x.type == GGMLType.F32 and mm.type == GGMLType.F32
            and x.ne[1] <= MMVQ_MAX_BATCH_SIZE and cc > CC_PASCAL and cols)


def _mat_vec_fusable(mm: Tensor, cc: int) -> bool:
    if mm.op == Op.MUL_MAT and mm.ne[1] != 1:
        return False            # both paths need one column: a batch is refused before any other test
    return _mmvf_ok(mm, cc) or _mmvq_ok(mm, cc)


def _rope_set_rows(graph: Graph, i: int, consumers) -> bool:
    if i + 2 >= graph.n_nodes:
        return False
    rope, view, sr = graph.node(i), graph.node(i + 1), graph.node(i + 2)
    if rope.op != Op.ROPE or view.op != Op.VIEW or sr.op != Op.SET_ROWS:
        return False
    if not (consumers.get(rope.idx, 0) == 1 and consumers.get(view.idx, 0) == 1 and view.src[0] == rope
            and sr.src[1] == view and sr.flags & _COMPUTE):
        return False
    return rope_set_rows_ok(rope, view, sr) and _memory_ranges_ok(graph, i, 3, i + 2)


def _mmv_glu(graph: Graph, i: int, consumers, cc: int, op: Op = Op.MUL_MAT,
             upstream: str = "0c1e57098") -> bool:
    """gate, up, GLU (MUL_MAT, or MUL_MAT_ID over the same ids) fused into one mat-vec kernel; the GLU ops
    fusable are `upstream`'s."""
    if i + 2 >= graph.n_nodes:
        return False
    gate, up, glu = graph.node(i), graph.node(i + 1), graph.node(i + 2)
    if (gate.op, up.op, glu.op) != (op, op, Op.GLU):
        return False
    if not _mat_vec_fusable(up, cc):
        return False            # tested last upstream; every test here is pure, so first is the same
    if op == Op.MUL_MAT_ID and gate.src[2] != up.src[2]:
        return False
    if not all(t.flags & _COMPUTE for t in (gate, up, glu)):
        return False
    if not (_single_use(gate, consumers) and _single_use(up, consumers)):
        return False            # ggml_can_fuse_subgraph: gate and up are read only by the GLU
    if {glu.src[0], glu.src[1]} != {gate, up} or glu.param_i32(0) not in _GLU_FUSABLE[upstream]:
        return False            # try_fuse takes the two mat-muls in either order: the GLU says which gates
    if glu.param_i32(1):
        return False            # swapped
    wg, wu = gate.src[0], up.src[0]
    if wg.type != wu.type or wg.ne != wu.ne or wg.nb != wu.nb or gate.src[1] != up.src[1]:
        return False
    return _memory_ranges_ok(graph, i, 3, i + 2)


def mmid_bias_glu(graph: Graph, i: int, consumers, cc: int, upstream: str = "0c1e57098"
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """(gate, up, gate bias, up bias) of gpt-oss's biased expert gate/up + GLU at node i fused into one mat-vec
    (MUL_MAT_ID, ADD_ID, MUL_MAT_ID, ADD_ID, GLU: ggml_cuda_can_fuse's mul_mat_id_bias_glu_ops, the gate
    told from the up by the ADD_ID the GLU gates with), or None: ggml_cuda_should_fuse_mul_mat with biases
    (each ADD_ID over its own mat-mul and the same ids, the same weight layout, x and ids, a fusable GLU not
    swapped), ggml_can_fuse_subgraph (the GLU the only output), the memory-range check, and the mat-vec
    paths' (ggml_cuda_should_fuse_mul_mat_vec_f / _q on the up mat-mul)."""
    if i + 4 >= graph.n_nodes:
        return None
    nodes = [graph.node(i + k) for k in range(5)]
    if tuple(n.op for n in nodes) != _MMID_BIAS_GLU_OPS:
        return None
    glu = nodes[4]
    gate_b, up_b = glu.src[0], glu.src[1]
    if gate_b is None or up_b is None:
        return None
    if nodes[0] in (gate_b.src[0], gate_b.src[1]):
        gate, up = nodes[0], nodes[2]
    elif nodes[2] in (gate_b.src[0], gate_b.src[1]):
        gate, up = nodes[2], nodes[0]
    else:
        return None
    if gate_b.op != Op.ADD_ID or up_b.op != Op.ADD_ID or gate_b.src[0] != gate or up_b.src[0] != up:
        return None
    if gate_b.src[2] != gate.src[2] or up_b.src[2] != up.src[2] or gate.src[2] != up.src[2]:
        return None
    wg, wu = gate.src[0], up.src[0]
    if wg.type != wu.type or wg.ne != wu.ne or wg.nb != wu.nb or gate.src[1] != up.src[1]:
        return None
    if glu.param_i32(0) not in _GLU_FUSABLE[upstream] or glu.param_i32(1):
        return None
    if not subgraph_ok(graph, i, _MMID_BIAS_GLU_OPS, (i + 4,), consumers) or not _memory_ranges_ok(graph, i, 5, i + 4):
        return None
    return (gate, up, gate_b, up_b) if _mat_vec_fusable(up, cc) else None


def _mmid_add_id(graph: Graph, i: int, consumers, cc: int) -> bool:
    """MUL_MAT_ID + ADD_ID of its own output by the same ids (gpt-oss's down bias) as one mat-vec: ggml_can_fuse
    (no memory check: the ADD_ID reuses the mat-vec's memory in place) and the mat-vec paths'."""
    if not _mat_vec_fusable(graph.node(i), cc) or not _can_fuse(graph, i, (Op.MUL_MAT_ID, Op.ADD_ID), consumers):
        return False
    mm, add = graph.node(i), graph.node(i + 1)
    return add.src[0] == mm and add.src[2] == mm.src[2]


def _mmv_add(graph: Graph, i: int, consumers, cc: int) -> bool:
    # node i is a MUL_MAT (try_fuse's test); the mat-vec test, last upstream, goes first here (pure tests)
    if not _mat_vec_fusable(graph.node(i), cc) or not _can_fuse(graph, i, (Op.MUL_MAT, Op.ADD), consumers):
        return False
    add = graph.node(i + 1)
    s = add.src
    # no memory-range check upstream: the ADD reuses the mat-vec's memory in place (ggml-alloc, and
    # graphdiag's allocator, give a node its single-use parent's buffer), so it never overlaps x
    return s[0].ne == s[1].ne   # no broadcasting add


_F32 = GGMLType.F32


def _split_mul(mul: Tensor) -> tuple[Tensor, Tensor] | None:
    """(full, broadcast) operands of a MUL of the weighted reduction: the experts' outputs (F32, contiguous, the
    MUL's shape) and a weight per row (F32, contiguous, ne0 1, the MUL's other dims), in either order."""
    def weights(t):
        return t is not None and t.type == _F32 and t.ne[0] == 1 and t.ne[1:] == mul.ne[1:] and t.is_contiguous()

    def experts(t):
        return t is not None and t.type == _F32 and t.ne == mul.ne and t.is_contiguous()
    a, b = mul.src[0], mul.src[1]
    if experts(a) and weights(b):
        return a, b
    if experts(b) and weights(a):
        return b, a
    return None


def moe_reduction(graph: Graph, i: int, consumers: dict[int, int]) -> tuple[int, Tensor, Tensor | None, Tensor] | None:
    """ggml_cuda_match_moe_weighted_reduction at node i: (nodes in the group, experts, per-expert scale or None,
    router weights), or None. Both forms: experts * weight, and (experts * scale) * weight; then k views of
    the weighted rows and the ADD chain views[0] + views[1] + ... (each ADD's src[0] the previous sum)."""
    n = graph.n_nodes
    first = graph.node(i)
    if first.op != Op.MUL or first.type != _F32 or not first.is_contiguous():
        return None
    weighted, experts, scale, weights, muls = first, None, None, None, 1
    if i + 1 < n:
        second = graph.node(i + 1)
        if second.op == Op.MUL and second.type == _F32 and second.is_contiguous():
            outer, inner = _split_mul(second), _split_mul(first)
            if outer is not None and outer[0] == first and inner is not None:
                weighted, (experts, scale), weights, muls = second, inner, outer[1], 2
    if experts is None:
        inner = _split_mul(first)
        if inner is None:
            return None
        experts, weights = inner
    k, t = weighted.ne[1], weighted.ne[2] * weighted.ne[3]
    if not 2 <= k <= MOE_WR_MAX_EXPERTS or t <= 0:
        return None
    count = 2 * k + muls - 1
    if i + count > n:
        return None
    ops = [Op.MUL] * muls
    views: list[Tensor] = []
    previous, n_adds = None, 0
    for off in range(muls, count):
        c = graph.node(i + off)
        ops.append(c.op)
        if c.op == Op.VIEW:
            e = len(views)
            if (e >= k or c.src[0] != weighted or c.view_src != weighted or c.type != _F32
                    or c.ne != (weighted.ne[0], t, 1, 1) or c.nb[0] != weighted.nb[0]
                    or c.nb[1] != weighted.nb[2] or c.view_offs != e * weighted.nb[1]):
                return None
            views.append(c)
            continue
        if c.op != Op.ADD or len(views) < 2 or n_adds + 1 >= len(views):
            return None
        lhs = views[0] if n_adds == 0 else previous
        if c.src[0] != lhs or c.src[1] != views[n_adds + 1] or c.type != _F32:
            return None
        previous, n_adds = c, n_adds + 1
    if len(views) != k or n_adds != k - 1 or previous is None:
        return None
    if not previous.is_contiguous() or previous.ne != (weighted.ne[0], t, 1, 1):
        return None
    if not _subgraph_ok(graph, i, tuple(ops), consumers):
        return None
    return count, experts, scale, weights


def moe_reduction_operands(graph: Graph, i: int) -> tuple[Tensor, Tensor | None, Tensor]:
    """(experts, scale or None, router weights) of the weighted reduction moe_reduction matched at node i: in
    the scaled form the second node is the MUL by the weights (in the plain form it is the first view)."""
    first, second = graph.node(i), graph.node(i + 1)
    if second.op == Op.MUL:
        (experts, scale), weights = _split_mul(first), _split_mul(second)[1]
        return experts, scale, weights
    experts, weights = _split_mul(first)
    return experts, None, weights


def moe_alloc_deps(graph: Graph, deps: dict[int, list[int]]) -> None:
    """graph_optimize's allocation dependencies (0c1e57098, #27301), matched before allocation (no memory-range
    check): deps[slot] gains the slots (each once) kept alive until that node has run.

    A weighted reduction keeps its experts, router weights and scale until its output. A top-k MoE router
    keeps every node of its group and every source of them until the node after the group (add_alloc_deps(i,
    i + ops.size()): the group's last node is kept too)."""
    consumers = consumer_counts(graph)
    rec = graph.arena.rec
    ops = rec["op"][graph.nodes].tolist()
    i, n, mul, soft_max = 0, graph.n_nodes, int(Op.MUL), int(Op.SOFT_MAX)
    while i < n:
        m = moe_reduction(graph, i, consumers) if ops[i] == mul else None
        if m is not None:
            count, experts, scale, weights = m
            _keep(deps, int(graph.nodes[i + count - 1]), (experts, weights, scale))
            i += count - 1
        t = topk_moe(graph, i, consumers) if ops[i] == soft_max else None
        if t is not None and i + t[0] < n:
            count = t[0]
            group = [graph.node(i + k) for k in range(count)]
            _keep(deps, int(graph.nodes[i + count]), [x for g in group for x in (g, *g.src)])
            i += count - 1
        i += 1


def _keep(deps: dict[int, list[int]], until: int, tensors) -> None:
    keep = deps.setdefault(until, [])
    for t in tensors:
        if t is not None and t.idx not in keep:
            keep.append(t.idx)


class TopkMoe(NamedTuple):
    """A top-k MoE router match: its node count, the logits, the ids (the argsort's VIEW), and the SCALE and
    CLAMP nodes of the group (None where it has none; a CLAMP: the weight norm is fused)."""

    count: int
    logits: Tensor
    ids: Tensor
    scale: Tensor | None
    clamp: Tensor | None


def topk_moe(graph: Graph, i: int, consumers: dict[int, int]) -> TopkMoe | None:
    """ggml_cuda_topk_moe_fusion + ggml_can_fuse_subgraph + ggml_cuda_should_use_topk_moe at node i, for the
    softmax-gated router without expert bias (the only one graphdiag builds): SOFT_MAX, RESHAPE of it
    (1, n_expert, T), ARGSORT of the probabilities, VIEW of the first k (the ids), GET_ROWS of the reshaped
    probabilities by them (the weights) [, the weight norm] [, a SCALE of the weights]. No memory check here:
    graph_optimize matches before allocation (topk_moe_fuses adds it)."""
    if i + len(_TOPK_MOE_OPS) > graph.n_nodes:
        return None
    sm, rs, arg, view, gr = (graph.node(i + k) for k in range(len(_TOPK_MOE_OPS)))
    if (sm.op, rs.op, arg.op, view.op, gr.op) != _TOPK_MOE_OPS:
        return None
    if rs.src[0] != sm or arg.src[0] != sm or view.src[0] != arg or gr.src[0] != rs or gr.src[1] != view:
        return None
    ops, clamp, scale = _topk_moe_tail(graph, i + len(_TOPK_MOE_OPS))
    count = len(ops)
    if not subgraph_ok(graph, i, ops, (i + 3, i + count - 1), consumers):
        return None
    logits, weights = sm.src[0], graph.node(i + count - 1)
    # ggml_cuda_should_use_topk_moe: an expert count launch_topk_moe_cuda instantiates, contiguous weights and
    # logits, a plain softmax (scale 1, no ALiBi, no mask or sinks)
    n_expert = view.nb[1] // view.nb[0]
    if ((n_expert & (n_expert - 1)) or n_expert > 512) and n_expert not in (288, 576):
        return None
    if not (weights.is_contiguous() and logits.is_contiguous() and sm.src[0].is_contiguous()):
        return None
    if sm.param_f32(0) != 1.0 or sm.param_f32(1) != 0.0 or sm.src[1] is not None or sm.src[2] is not None:
        return None
    return TopkMoe(count, logits, view, scale, clamp)


def topk_moe_delayed(graph: Graph, i: int, consumers: dict[int, int]) -> TopkMoe | None:
    """ggml_cuda_topk_moe_fusion's delayed_softmax form at ARGSORT node i (gpt-oss): the argsort of the logits
    whose reshape (1, n_expert, T) is node i - 1, its VIEW of k (the ids), the GET_ROWS of that reshape by them,
    RESHAPE (k, T), SOFT_MAX, RESHAPE (1, k, T) (the weights), each reading the one before; refused where a
    whole weight norm follows (upstream fuses the delayed form only without norm and bias), or where
    ggml_can_fuse_subgraph or ggml_cuda_should_use_topk_moe (on the SOFT_MAX) would refuse it."""
    n_ops = len(_TOPK_MOE_DELAYED_OPS)
    if i < 1 or i + n_ops > graph.n_nodes:
        return None
    arg, view, gr, rs, sm, back = (graph.node(i + k) for k in range(n_ops))
    if (arg.op, view.op, gr.op, rs.op, sm.op, back.op) != _TOPK_MOE_DELAYED_OPS:
        return None
    if (view.src[0] != arg or gr.src[1] != view or gr.src[0] != graph.node(i - 1) or rs.src[0] != gr
            or sm.src[0] != rs or back.src[0] != sm):
        return None
    if _topk_moe_tail(graph, i + n_ops)[1] is not None:       # a weight norm after it: args.norm
        return None
    if not subgraph_ok(graph, i, _TOPK_MOE_DELAYED_OPS, (i + 1, i + n_ops - 1), consumers):
        return None
    logits = arg.src[0]
    n_expert = view.nb[1] // view.nb[0]
    if ((n_expert & (n_expert - 1)) or n_expert > 512) and n_expert not in (288, 576):
        return None
    if not (back.is_contiguous() and logits.is_contiguous() and sm.src[0].is_contiguous()):
        return None
    if sm.param_f32(0) != 1.0 or sm.param_f32(1) != 0.0 or sm.src[1] is not None or sm.src[2] is not None:
        return None
    return TopkMoe(n_ops, logits, view, None, None)


def _topk_moe_delayed_fuses(graph: Graph, i: int, consumers, upstream: str) -> int:
    """try_fuse's delayed top-k MoE attempt at an ARGSORT: the match when its two outputs overlap no source
    still read, the logits aside up to TOPK_MOE_ROWS rows (one at d99724f2); its node count, else 0."""
    m = topk_moe_delayed(graph, i, consumers)
    if m is None:
        return 0
    ne = graph.node(i).ne
    rows = ne[1] * ne[2] * ne[3]                    # ggml_nrows of the argsort
    alias = m.logits if rows <= (1 if upstream == "d99724f2" else TOPK_MOE_ROWS) else None
    return m.count if _memory_ranges_ok(graph, i, m.count, (i + 1, i + m.count - 1), alias) else 0


def _topk_moe_tail(graph: Graph, j: int) -> tuple[tuple[Op, ...], Tensor | None, Tensor | None]:
    """(the group's ops, CLAMP node or None, SCALE node or None) after the router's GET_ROWS (node j - 1), as
    ggml_cuda_topk_moe_fusion reads on: a RESHAPE there starts the weight norm, RESHAPE -> SUM_ROWS -> CLAMP
    each reading the one before, a DIV of the RESHAPE by the CLAMP, a RESHAPE of the DIV; a norm broken off
    after its first RESHAPE leaves the router fusable without it (and without a SCALE). Then a SCALE of the
    weights, if it reads the group's last node."""
    n, ops, clamp = graph.n_nodes, _TOPK_MOE_OPS, None
    if j < n and graph.node(j).op == Op.RESHAPE:
        if j + len(_TOPK_MOE_NORM_OPS) > n:
            return ops, None, None
        rs, total, cl, div, back = (graph.node(j + k) for k in range(len(_TOPK_MOE_NORM_OPS)))
        if ((rs.op, total.op, cl.op, div.op, back.op) != _TOPK_MOE_NORM_OPS or rs.src[0] != graph.node(j - 1)
                or total.src[0] != rs or cl.src[0] != total or div.src[0] != rs or div.src[1] != cl
                or back.src[0] != div):
            return ops, None, None
        ops, clamp, j = (*ops, *_TOPK_MOE_NORM_OPS), cl, j + len(_TOPK_MOE_NORM_OPS)
    if j < n and graph.node(j).op == Op.SCALE and graph.node(j).src[0] == graph.node(j - 1):
        return (*ops, Op.SCALE), clamp, graph.node(j)
    return ops, clamp, None


def topk_moe_operands(graph: Graph, i: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """(weights: the group's last node, ids, CLAMP or None, SCALE or None) of the router topk_moe matched at
    node i: what ggml_cuda_op_topk_moe is handed (the norm fused when there is a CLAMP)."""
    ops, clamp, scale = _topk_moe_tail(graph, i + len(_TOPK_MOE_OPS))
    return graph.node(i + len(ops) - 1), graph.node(i + 3), clamp, scale


def _topk_moe_fuses(graph: Graph, i: int, consumers, upstream: str) -> int:
    """try_fuse's top-k MoE attempt: the match when neither output overlaps a source it still reads, the logits
    aside where one block reads every row before writing (at most TOPK_MOE_ROWS rows; one row at
    d99724f2); its node count, else 0."""
    m = topk_moe(graph, i, consumers)
    if m is None:
        return 0
    count, logits = m.count, m.logits
    ne = graph.node(i).ne
    rows = ne[1] * ne[2] * ne[3]                    # ggml_nrows of the softmax
    alias = logits if rows <= (1 if upstream == "d99724f2" else TOPK_MOE_ROWS) else None
    return count if _memory_ranges_ok(graph, i, count, (i + 3, i + count - 1), alias) else 0


def written_nodes(i: int, f: Fusion) -> tuple[int, ...]:
    """The nodes the fused kernel at node i writes: the group's last, and the top-k MoE router's ids (its
    VIEW: node i + 3, or i + 1 in the delayed form) as well; the other nodes of the group are elided."""
    if f.pattern == TOPK_MOE:
        return i + 3, i + f.absorbed
    return (i + 1, i + f.absorbed) if f.pattern == TOPK_MOE_DELAYED else (i + f.absorbed,)


def _moe_reduction_fuses(graph: Graph, i: int, consumers) -> int:
    """try_fuse's first attempt: the weighted reduction at node i when it matches and its output overlaps
    none of the group's sources (ggml_cuda_check_fusion_memory_ranges); its node count, else 0."""
    m = moe_reduction(graph, i, consumers)
    if m is None or not _memory_ranges_ok(graph, i, m[0], i + m[0] - 1):
        return 0
    return m[0]


_FUSION_FIRST = frozenset({Op.ROPE, Op.MUL_MAT, Op.MUL_MAT_ID, Op.RMS_NORM, Op.MUL, Op.SOFT_MAX,
                           Op.ARGSORT})   # where try_fuse can match


def try_fuse(graph: Graph, i: int, consumers: dict[int, int], cc: int = 900,
             upstream: str = "0c1e57098") -> Fusion | None:
    """The fusion starting at node i, if one matches (upstream's order of attempts)."""
    op = graph.node(i).op
    if op == Op.MUL:
        count = _moe_reduction_fuses(graph, i, consumers) if upstream != "d99724f2" else 0
        return Fusion(MOE_WR, count - 1) if count else None
    if op == Op.SOFT_MAX:
        count = _topk_moe_fuses(graph, i, consumers, upstream)
        return Fusion(TOPK_MOE, count - 1) if count else None
    if op == Op.ARGSORT:
        count = _topk_moe_delayed_fuses(graph, i, consumers, upstream)
        return Fusion(TOPK_MOE_DELAYED, count - 1) if count else None
    if op == Op.ROPE and _rope_set_rows(graph, i, consumers):
        return Fusion(ROPE_SET_ROWS, 2)
    if op == Op.MUL_MAT:
        if _mmv_glu(graph, i, consumers, cc, Op.MUL_MAT, upstream):
            return Fusion(MMV_GLU, 2)
        if _mmv_add(graph, i, consumers, cc):
            return Fusion(MMV_ADD, 1)
    if op == Op.MUL_MAT_ID:     # upstream's order: the biased gate/up + GLU, the plain one, the mat-vec + bias
        if mmid_bias_glu(graph, i, consumers, cc, upstream) is not None:
            return Fusion(MMID_BIAS_GLU, 4)
        if _mmv_glu(graph, i, consumers, cc, Op.MUL_MAT_ID, upstream):
            return Fusion(MMID_GLU, 2)
        if _mmid_add_id(graph, i, consumers, cc):
            return Fusion(MMID_ADD_ID, 1)
    if op == Op.RMS_NORM:
        return try_fuse_norm(graph, i, consumers, upstream)
    return None


def _may_fuse(ops: list[int], ne1: list[int], ne2: list[int], i: int) -> bool:
    """A necessary condition for try_fuse to match at node i, on the node list's ops and ne[1]/ne[2] alone:
    each pattern's first tests, the ones that refuse most nodes (a mat-mul over a batch, a rope not followed
    by the K-cache write). Every test of try_fuse is pure, so leaving out a node this refuses changes nothing;
    and nothing try_fuse could raise on is skipped (each branch here is the test upstream makes first)."""
    op = ops[i]
    nxt = ops[i + 1] if i + 1 < len(ops) else -1
    nxt2 = ops[i + 2] if i + 2 < len(ops) else -1
    if op == _ROPE:
        return nxt == _VIEW and nxt2 == _SET_ROWS
    if op == _MUL_MAT:      # mul_mat_vec+glu: the up mat-vec (node i+1) writes one column; +add: node i does
        return (nxt == _MUL_MAT and nxt2 == _GLU and ne1[i + 1] == 1) or ne1[i] == 1
    if op == _MUL_MAT_ID:   # the up mat-vec's tokens within the mat-vec paths (float: 1, quantized: <= 8)
        if nxt == _ADD_ID:  # gpt-oss's biased experts: + ADD_ID [+ MUL_MAT_ID + ADD_ID + GLU]
            return ne2[i] <= MMVQ_MAX_BATCH_SIZE
        return nxt == _MUL_MAT_ID and nxt2 == _GLU and ne2[i + 1] <= MMVQ_MAX_BATCH_SIZE
    if op == _MUL:          # the weighted reduction: its views follow (or the second MUL of the scaled form)
        return nxt == _VIEW or nxt == _MUL
    if op == _SOFT_MAX:     # the top-k MoE router: the probabilities reshaped, then their argsort
        return nxt == _RESHAPE and nxt2 == _ARGSORT
    if op == _ARGSORT:      # its delayed form: the ids' VIEW, then the GET_ROWS of the weights
        return nxt == _VIEW and nxt2 == _GET_ROWS
    return nxt == _MUL or nxt == _SCALE     # RMS_NORM: the MUL forms, or the SCALE of rms_norm+scale


_ROPE, _VIEW, _SET_ROWS, _MUL_MAT, _MUL_MAT_ID, _GLU, _MUL, _SCALE, _SOFT_MAX, _RESHAPE, _ARGSORT, _GET_ROWS = (
    int(o) for o in (Op.ROPE, Op.VIEW, Op.SET_ROWS, Op.MUL_MAT, Op.MUL_MAT_ID, Op.GLU, Op.MUL, Op.SCALE, Op.SOFT_MAX,
                     Op.RESHAPE, Op.ARGSORT, Op.GET_ROWS))
_ADD_ID = int(Op.ADD_ID)
_FIRST_INTS = frozenset(int(o) for o in _FUSION_FIRST)


def fusion_plan(graph: Graph, cc: int = 900, launches: list[bool] | None = None,
                upstream: str = "0c1e57098") -> dict[int, Fusion]:
    """try_fuse evaluated at every node the loop can reach (a node absorbed by a fusion is never tried;
    views/no-ops and nodes without COMPUTE are skipped before try_fuse, as in the capture loop), where
    _may_fuse lets a match through. `launches`: launching_nodes(graph), when the caller has it; `upstream`:
    the llama.cpp whose rules apply (d99724f2 has no weighted reduction, no rms_norm+scale and no SWIGLU_CLAMP)."""
    consumers = consumer_counts(graph)
    if launches is None:
        launches = launching_nodes(graph)
    rec = graph.arena.rec
    ops = rec["op"][graph.nodes].tolist()
    ne = rec["ne"][graph.nodes]
    ne1, ne2 = ne[:, 1].tolist(), ne[:, 2].tolist()
    plan: dict[int, Fusion] = {}
    i = 0
    n = graph.n_nodes
    while i < n:
        if launches[i] and ops[i] in _FIRST_INTS and _may_fuse(ops, ne1, ne2, i):
            f = try_fuse(graph, i, consumers, cc, upstream)
            if f:
                plan[i] = f
                i += f.absorbed
        i += 1
    return plan

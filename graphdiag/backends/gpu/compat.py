"""The compatibility gate (ggml_cuda_graph_check_compability) and MUL_MAT_ID's needs-sync rule.

Only a MUL_MAT_ID whose kernel would take the sorted fallback (ids copied to the host, stream synchronised)
makes a split ineligible — the whole split, not just the node. The same rule picks the kernel path in the
lowering, so the gate guards something real: the fallback really synchronises.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.dtypes import GGMLType, is_quantized
from ...ir.graph import Graph
from ...ir.ops import Op, is_view_or_noop
from ...ir.tensor import Tensor

MMVQ_MAX_BATCH_SIZE = 8     # rows the quantized mat-vec path takes (ggml: MMVQ_MAX_BATCH_SIZE)
MMF_MAX_BATCH_SIZE = 16     # rows the F16/F32 tensor-core mat-mul path takes for MUL_MAT_ID (Turing+)
CC_VOLTA, CC_TURING = 700, 750


def mmvq_mmid_max_batch(t: int, cc: int) -> int:
    """Rows the MUL_MAT_ID mat-vec fast path accepts for a quantized expert type."""
    return MMVQ_MAX_BATCH_SIZE


def should_use_mmq(t: int, cc: int) -> bool:
    """The quantized mat-mul path: any quantized type on Volta or newer (dp4a / tensor cores)."""
    return is_quantized(t) and cc >= CC_VOLTA


def should_use_mmf(t: int, cc: int, rows: int) -> bool:
    """The float tensor-core mat-mul path: F16/F32 experts on Turing or newer, up to MMF_MAX_BATCH_SIZE rows."""
    return t in (GGMLType.F16, GGMLType.F32) and cc >= CC_TURING and rows <= MMF_MAX_BATCH_SIZE


def mul_mat_id_sync_reason(node: Tensor, cc: int) -> str:
    """'' when a fast path applies (no sync), else the rule that sends it to the synchronising fallback."""
    src0, src1 = node.src[0], node.src[1]
    if src1.type != GGMLType.F32 or node.type != GGMLType.F32:
        return "src1 or dst not F32"
    rows = node.ne[2]
    if rows <= MMVQ_MAX_BATCH_SIZE and is_quantized(src0.type) and rows <= mmvq_mmid_max_batch(src0.type, cc):
        return ""
    if should_use_mmq(src0.type, cc):
        return ""
    if should_use_mmf(src0.type, cc, src1.ne[2]):
        return ""
    return (f"{src0.type.name} experts, {rows} rows: no mat-vec (quantized, <= {MMVQ_MAX_BATCH_SIZE}), "
            f"MMQ (quantized) or MMF ({'cc < 7.5' if cc < CC_TURING else f'<= {MMF_MAX_BATCH_SIZE} rows'}) path; "
            f"the sorted fallback synchronises the stream")


def mul_mat_id_needs_sync(node: Tensor, cc: int) -> bool:
    return bool(mul_mat_id_sync_reason(node, cc))


@dataclass(frozen=True)
class Incompatibility:
    node: int
    node_name: str
    rule: str


def check_compatibility(graph: Graph, cc: int) -> Incompatibility | None:
    """None when the split can use CUDA graphs; else the first node (and rule) that forbids it."""
    rec = graph.arena.rec
    ops = rec["op"][graph.nodes]
    for i in (ops == Op.MUL_MAT_ID).nonzero()[0]:
        node = graph.node(int(i))
        if is_view_or_noop(node.op, node.ne):
            continue
        why = mul_mat_id_sync_reason(node, cc)
        if why:
            return Incompatibility(int(i), node.name, why)
    return None

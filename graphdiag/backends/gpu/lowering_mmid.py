"""MUL_MAT_ID's launches, path by path as ggml_cuda_mul_mat_id (ggml-cuda.cu, 0c1e57098) dispatches on NVIDIA.

compat.mul_mat_id_path picks the path; each launches what upstream launches there, kernel for kernel (no
memset or memcpy node: upstream clears a weight's padding only when src0 lives in a compute buffer, and
experts never do):

  path   when (T: tokens, dst ne[2])          upstream (file: function)                 graphdiag
  mmvq   quantized, T <= mmid max batch      quantize_q8_1, mul_mat_vec_q (T = 1) or   quantize_q8_1,
         (8 on Volta, Ada and newer)         mul_mat_vec_q_moe (mmvq.cu:               mul_mat_id_vec_{w}
                                             ggml_cuda_mul_mat_vec_q)                  on Q8_1 x
  mmq    quantized above                     mm_ids_helper, quantize_mmq_q8_1 (its     mm_ids_helper,
                                             scatter form for gate/up), mul_mat_q       quantize_q8_1,
                                             [+ mul_mat_q_stream_k_fixup] (mmq.cu:      mul_mat_id_q_{w}
                                             ggml_cuda_mul_mat_q, mmq.cuh:              [+ mul_mat_fixup_f32]
                                             launch_mul_mat_q)
  mmf    float, T <= 16                      mul_mat_f with ids (mmf.cu)                mul_mat_id_vec_{w}
  mmf    float, T > 16                       mm_ids_helper, mul_mat_f_ids (mmf.cu:      mm_ids_helper,
                                             ggml_cuda_mul_mat_f, mmf.cuh)              mul_mat_id_f_{w}
  sorted (ggml_cuda_mul_mat_id_needs_sync)   ids to the host, sync, gathers/copies      SortedMulMatIdOp

The fixup follows upstream's stream-k rule with the experts as the tiles' batch (compat.mmq_stream_k_parts:
ntiles = ceil(M / 128) x ceil(T / 128) x n_expert under 90 % of the SMs -> the fixup; graphdiag's mat-mul
splits k into that many parts there). The fused gate/up + GLU (fusion.py, ggml_cuda_should_fuse_mul_mat_vec_q
/ _f): quantized experts at every mmvq batch, quantize_q8_1 + mul_mat_id_vec_glu_{w} (upstream's mmvq with
its fusion args); float experts at one token, mul_mat_id_vec_glu_{w} alone (mul_mat_vec_f with ids).
"""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import GGMLType, is_quantized
from ...ir.graph import Graph
from ...ir.tensor import Tensor
from .. import abi
from ..drivers.base import Driver, Launch
from ..geometry import launch_geometry
from .compat import MMF_IDS_DIRECT_MAX, mmq_stream_k_parts, mul_mat_id_path
from .descriptors import DescriptorTable
from .launch_ops import W_SUFFIX, KernelOp, ScratchLaunchesOp, pack_launch, q8_1_scratch, quantized_x_op
from .pool import TempPool

_I32, _F32 = int(GGMLType.I32), int(GGMLType.F32)
_ALIGN = 256   # each part of an op's pool scratch starts on this many bytes


def _at(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def lower_mul_mat_id(d: "DescriptorTable | None", node: Tensor, cc: int, nsm: int):
    """The lowered op of a MUL_MAT_ID on the path upstream takes (module docstring)."""
    path = mul_mat_id_path(node, cc)
    w, x, ids = node.src[0], node.src[1], node.src[2]
    if path == "sorted":
        return SortedMulMatIdOp(node, d)
    if path == "mmvq":
        return quantized_x_op(d, f"mul_mat_id_vec_{W_SUFFIX[w.type]}", [node, w, x, ids], x_slot=2)
    if path == "mmq":
        return _sorted_by_expert(d, node, f"mul_mat_id_q_{W_SUFFIX[w.type]}", cc, nsm)
    if node.ne[2] <= MMF_IDS_DIRECT_MAX:
        return KernelOp(pack_launch(d, f"mul_mat_id_vec_{W_SUFFIX[w.type]}", [node, w, x, ids]))
    return _sorted_by_expert(d, node, f"mul_mat_id_f_{W_SUFFIX[w.type]}", cc, nsm)


def lower_mmid_glu(d: "DescriptorTable | None", graph: Graph, i: int):
    """The fused gate/up MUL_MAT_IDs + GLU at node i (the GLU is node i + 2): quantized experts read x as
    Q8_1 (quantize_q8_1 first, two launches), float experts F32 x (one launch)."""
    node, glu = graph.node(i), graph.node(i + 2)
    gate, up = glu.src[0], glu.src[1]
    name = f"mul_mat_id_vec_glu_{W_SUFFIX[node.src[0].type]}"
    tensors = [glu, gate.src[0], up.src[0], node.src[1], node.src[2]]
    ip, fp = (glu.param_i32(0),), (glu.param_f32(3),)        # the GLU op; SWIGLU_CLAMP's limit
    if is_quantized(node.src[0].type):
        return quantized_x_op(d, name, tensors, x_slot=3, ip=ip, fp=fp)
    return KernelOp(pack_launch(d, name, tensors, ip=ip, fp=fp))


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def lower_mmid_bias_glu(d: "DescriptorTable | None", graph: Graph, i: int):
    """gpt-oss's fused gate/up MUL_MAT_IDs + ADD_IDs + GLU at node i (the GLU is node i + 4): the glu kernel
    with the up bias in t[5] and the gate bias's address in ip[1], ip[2] (upstream's fusion_data.x_bias and
    gate_bias); quantized experts on Q8_1 x (two launches), float ones on F32 x (one)."""
    glu = graph.node(i + 4)
    gate_b, up_b = glu.src[0], glu.src[1]
    gate, up = gate_b.src[0], up_b.src[0]
    w = gate.src[0]
    name = f"mul_mat_id_vec_glu_{W_SUFFIX[w.type]}"
    tensors = [glu, w, up.src[0], up.src[1], up.src[2], up_b.src[1]]
    addr = gate_b.src[1].data
    ip, fp = (glu.param_i32(0), _signed32(addr), _signed32(addr >> 32)), (glu.param_f32(3),)
    if is_quantized(w.type):
        return quantized_x_op(d, name, tensors, x_slot=3, ip=ip, fp=fp)
    return KernelOp(pack_launch(d, name, tensors, ip=ip, fp=fp))


def lower_mmid_add_id(d: "DescriptorTable | None", graph: Graph, i: int):
    """An expert mat-vec and its ADD_ID (node i + 1) fused: mul_mat_id_vec_{w} writing the ADD_ID with the bias
    in t[4]; quantized experts on Q8_1 x (two launches), float ones on F32 x (one)."""
    mm, add = graph.node(i), graph.node(i + 1)
    w = mm.src[0]
    name = f"mul_mat_id_vec_{W_SUFFIX[w.type]}"
    tensors = [add, w, mm.src[1], mm.src[2], add.src[1]]
    if is_quantized(w.type):
        return quantized_x_op(d, name, tensors, x_slot=2)
    return KernelOp(pack_launch(d, name, tensors))


def _sorted_by_expert(d, node: Tensor, name: str, cc: int, nsm: int) -> ScratchLaunchesOp:
    """mm_ids_helper's expert-sorted map of the (slot, token) pairs and the experts' bounds, then `name`
    over it: for quantized experts (mul_mat_id_q_*) x quantised to Q8_1 between the two and, where
    upstream's stream-k leaves partial tiles, the k-split's partials added in by mul_mat_fixup_f32; for
    float experts (mul_mat_id_f_*) F32 x, one part. One pool buffer: [Q8_1 x][map][bounds][partials]."""
    w, x, ids = node.src[0], node.src[1], node.src[2]
    n_expert, n_pairs = w.ne[2], ids.ne[0] * ids.ne[1]
    quant = is_quantized(w.type)
    parts = mmq_stream_k_parts(node.ne[0], x.ne[2], n_expert, w.ne[0], nsm, cc) if quant else 0
    qne, qnb, qbytes = q8_1_scratch(x, name) if quant else (x.ne, x.nb, 0)
    at_map = _at(qbytes)
    at_bounds = _at(at_map + 8 * n_pairs)
    at_part = _at(at_bounds + 4 * (n_expert + 1))
    pairs = (_I32, (2, n_pairs, 1, 1), (4, 8, 8 * n_pairs, 8 * n_pairs))
    bounds = (_I32, (n_expert + 1, 1, 1, 1), (4, 4 * (n_expert + 1), 4 * (n_expert + 1), 4 * (n_expert + 1)))
    m, n_used, t, _ = node.ne
    pne, pnb = (m, n_used, t, max(parts - 1, 1)), (4, 4 * m, 4 * m * n_used, 4 * m * n_used * t)
    launches = [pack_launch(d, "mm_ids_helper", [None, ids, None], scratch=[(0, *pairs), (2, *bounds)])]
    where = [((0, at_map), (2, at_bounds))]
    scratch, slots = [(4, *pairs), (5, *bounds)], [(4, at_map), (5, at_bounds)]
    if quant:
        launches.append(pack_launch(d, "quantize_q8_1", [None, x], scratch=[(0, abi.Q8_1, qne, qnb)]))
        where.append(((0, 0),))
        scratch.append((2, abi.Q8_1, qne, qnb))
        slots.append((2, 0))
    if parts:
        scratch.append((3, _F32, pne, pnb))
        slots.append((3, at_part))
    launches.append(pack_launch(d, name, [node, w, None if quant else x, None, None, None], ip=(parts,),
                                scratch=scratch))
    where.append(tuple(slots))
    if parts:
        launches.append(pack_launch(d, "mul_mat_fixup_f32", [node, None], ip=(parts - 1,),
                                    scratch=[(1, _F32, pne, pnb)]))
        where.append(((1, at_part),))
    return ScratchLaunchesOp(launches, where, at_part + (pnb[3] * pne[3] if parts else 0))


class SortedMulMatIdOp:
    """The MUL_MAT_ID sorted fallback: ids to the host (synchronising), one launch per used expert."""

    n_launches = 1
    ready = True   # nothing to prepare: every run makes its launches

    def __init__(self, node: Tensor, d: "DescriptorTable | None" = None):
        self.node = node
        w = W_SUFFIX[node.src[0].type]
        self.kernel = f"mul_mat_id_gathered_{w}"
        self.template = pack_launch(d, self.kernel, [node, node.src[0], node.src[1], None])

    def prepare(self, driver: Driver) -> None:
        pass

    def run(self, driver: Driver, stream, pool: TempPool) -> None:
        ids_t = self.node.src[2]
        n_used, n_tok = ids_t.ne[0], ids_t.ne[1]
        driver.stream_synchronize(stream)             # the sync that makes graphs impossible here
        ids = np.empty((n_tok, n_used), np.int32)
        row = ids_t.nb[1]
        raw = np.empty(row * (n_tok - 1) + 4 * n_used, np.uint8)
        driver.memcpy_dtoh(raw, ids_t.data)
        for t in range(n_tok):
            ids[t] = raw[t * row : t * row + 4 * n_used].view(np.int32)
        order = np.argsort(ids.reshape(-1), kind="stable")
        experts = ids.reshape(-1)[order]
        pairs = np.stack([order % n_used, order // n_used], axis=1).astype(np.int32)  # (slot, token)
        addr, size = pool.alloc(pairs.nbytes)
        driver.memcpy_htod(addr, pairs, stream)
        driver.stream_synchronize(stream)             # `pairs` must outlive the async copy
        bounds = np.flatnonzero(np.diff(experts)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(experts)]):
            p = self.template.params.copy()
            p["t"][3]["data"] = addr
            p["t"][3]["type"] = int(GGMLType.I32)
            p["t"][3]["ne"] = (2, len(pairs), 1, 1)
            p["t"][3]["nb"] = (4, 8, 8 * len(pairs), 8 * len(pairs))
            p["ip"][:3] = (int(experts[lo]), int(hi - lo), int(lo))
            grid, block, shmem = launch_geometry(self.kernel, p)
            launch = driver.prepare(Launch(self.kernel, grid, block, p, shmem, label=self.template.label,
                                           pdl=self.template.pdl))
            driver.launch(stream, launch)
        pool.free(addr, size)

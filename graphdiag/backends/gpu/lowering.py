"""Lowering: a node (or a fused group) to the kernel launches the GPU backend issues for it.

Each lowered op is prepared once (parameters packed once) and reused while the graph's identity holds;
`run(stream)` issues it. `ready` says whether it has been prepared: an eager evaluation prepares each op
right before its first run (capture.CaptureLoop.evaluate), so the GPU starts on the first nodes while the
host still packs the rest. Kernel choice follows ggml's dispatch: mat-vec while the batch fits the mat-vec
path, mat-mul (tensor cores for F16 / Q8_0) otherwise; MUL_MAT_ID follows ggml_cuda_mul_mat_id's paths
(lowering_mmid.py), the sorted fallback among them, which copies the ids to the host and synchronises.

A node's launch count depends on its op and weight type, for flash attention on whether upstream's vec
kernel runs alone, and for a quantised mat-mul on whether upstream's stream-k MMQ needs its fixup (below);
otherwise never on n_kv or on which path its batch takes, so those changes keep the captured topology
(cudaGraphExecUpdate applies them), as on real ggml:
  Q8_0 MUL_MAT (mat-vec or mat-mul, fused or not)  2: quantize_q8_1 into pool scratch, then the kernel;
                                                      3 on the MMQ path where upstream's stream-k leaves
                                                      partial tiles (compat.mmq_stream_k_parts: under 90 %
                                                      tile efficiency on the device's SMs): mul_mat_q8_0 split
                                                      over k, then mul_mat_fixup_f32, as upstream's
                                                      mul_mat_q + mul_mat_q_stream_k_fixup
  Q4_0/1 Q5_0/1 Q2-6_K IQ4_NL/XS MUL_MAT            2: on ggml's MMVQ path (compat.mul_mat_path) quantize_q8_1
                                                      then mul_mat_vec(_glu/_add)_{w}; above it (MMQ in
                                                      ggml) dequantize_f16_{w} of W into pool scratch then
                                                      mul_mat_f16 (graphdiag has no MMQ tiles for these); 3
                                                      with the k-split and its fixup, as Q8_0
  F16 MUL_MAT                                      1: mul_mat_vec(_glu/_add)_f16 at one column (MMVF),
                                                      mul_mat_f16 at 2-16 (MMF); past 16 (upstream's cuBLAS
                                                      path) 3: cpy_f32_f16 of x into pool scratch, mul_mat_f16
                                                      into an F16 result there, cpy_f16_f32 into the node (4
                                                      with the k-split where cuBLAS splits K)
  BF16 MUL_MAT                                     1: mul_mat_vec(_glu/_add)_bf16 on MMVF's path, else
                                                      mul_mat_bf16
  FLASH_ATTN_EXT                                   2: split-KV partials into pool scratch (flash_attn_vec_f16_
                                                      d{D}_g{G} up to 8 tokens, flash_attn_mma_f16_d{D} on
                                                      tensor cores above), then combine; 1 (the vec kernel
                                                      writing the node) where upstream's vec kernel runs
                                                      alone: D 256 at n_kv 256 (geometry.fa_direct), so
                                                      n_kv 256 -> 512 changes the topology there, as upstream
  MUL_MAT_ID (and its fused gate/up + GLU)         1 to 4 by upstream's path and batch: lowering_mmid.py
  everything else                                  1
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphdiagError
from ...memory import aligned
from ...ir.attention import fa_operands
from ...ir.build import Yarn, contiguous_nb
from ...ir.dtypes import GGMLType, is_quantized
from ...ir.graph import Graph
from ...ir.ops import GluOp, Op
from ...ir.tensor import Tensor
from ..drivers.base import H200_MULTIPROCESSORS, Launch
from .compat import (CC_VOLTA, MMVQ_MAX_BATCH_SIZE, cublas_compute_type, cublas_split_k_parts, mmq_stream_k_parts,
                     mul_mat_path)
from .descriptors import DescriptorTable
from .launch_ops import KernelOp, ScratchLaunchesOp, q8_1_scratch, quantized_x_op
from .launch_ops import W_SUFFIX as _W, X_SUFFIX as _X, pack_launch as _launch
from .lowering_mmid import SortedMulMatIdOp, lower_mmid_add_id, lower_mmid_bias_glu, lower_mmid_glu, lower_mul_mat_id
from .fusion import (MMID_ADD_ID, MMID_BIAS_GLU, MMID_GLU, MMV_ADD, MMV_GLU, MOE_WR, RMS_NORM_MUL, ROPE_SET_ROWS,
                     TOPK_MOE, TOPK_MOE_DELAYED, Fusion, moe_reduction_operands, topk_moe_operands)
from .fusion_graph import other_src
from .fusion_norm import RMS_NORM_MUL_ADD, RMS_NORM_MUL_ROPE, RMS_NORM_MUL_ROPE_SET_ROWS, RMS_NORM_SCALE
from ..abi import Q8_1
from ..geometry import FA_HEAD_DIMS, FA_MAX_ROWS, fa_direct, fa_plan, fa_takes_vec, mmv_warps_per_row
from ..kernels import fa_direct_kernel, fa_mma_kernel, fa_vec_kernel
from .pdl import upstream_pdl

def op_launches(op) -> list[Launch]:
    """The prepared launches of a lowered op (the sorted MUL_MAT_ID fallback: its template)."""
    if isinstance(op, ScratchLaunchesOp):
        return op.launches
    return [op.template] if isinstance(op, SortedMulMatIdOp) else [op.launch]


def lower_node(graph: Graph, i: int, fusion: Fusion | None, cc: int, d: "DescriptorTable | None" = None,
               nsm: int = H200_MULTIPROCESSORS):
    """The lowered op for node i (with `fusion` absorbing the following nodes); `d`: the graph's
    DescriptorTable, where the caller lowers many nodes (None: descriptors read from the structs); `cc`,
    `nsm`: the device's compute capability and multiprocessors. Each launch carries PDL where upstream's
    counterpart would (pdl.upstream_pdl)."""
    op = _lower_node(graph, i, fusion, cc, d, nsm)
    node = graph.node(i)
    for launch in op_launches(op):
        launch.pdl = upstream_pdl(launch.kernel, node, cc)
    return op


def _lower_node(graph: Graph, i: int, fusion: Fusion | None, cc: int, d: "DescriptorTable | None", nsm: int):
    node = graph.node(i)
    if fusion is not None:
        return _lower_fused(d, graph, i, fusion)
    op = node.op
    s = node.src
    if op == Op.GET_ROWS:
        return KernelOp(_launch(d, f"get_rows_{_W[s[0].type]}", [node, s[0], s[1]]))
    if op == Op.RMS_NORM:
        return KernelOp(_launch(d, "rms_norm_f32", [node, s[0]], fp=(node.param_f32(0),)))
    if op == Op.ADD_ID:
        return KernelOp(_launch(d, "add_id_f32", [node, s[0], s[1], s[2]]))
    if op in (Op.MUL, Op.ADD):
        return KernelOp(_launch(d, "mul_f32" if op == Op.MUL else "add_f32", [node, s[0], s[1]]))
    if op == Op.MUL_MAT and s[0].type in _X:
        return _lower_x_mul_mat(d, node, cc, nsm)
    if op == Op.MUL_MAT:
        if (s[0].type == GGMLType.F16 and s[1].type == GGMLType.F32 and mul_mat_path(node, cc) == "cublas"
                and cublas_compute_type(node, cc) == GGMLType.F16 and cc != CC_VOLTA):   # Volta: F32 result
            return _cublas_f16(d, node, cublas_split_k_parts(node, cc, nsm))
        if s[0].type == GGMLType.F32:
            parts = cublas_split_k_parts(node, cc, nsm)
            if parts:
                return _split_k(d, node, parts, f"mul_mat_{_W[s[0].type]}")
        # F16 weights at 2-16 columns: upstream's MMF (ggml_cuda_should_use_mmvf takes F16 at one column on
        # Ampere and newer), whose stand-in is graphdiag's tile kernel, as above 8 columns
        if s[1].ne[1] > MMVQ_MAX_BATCH_SIZE or (s[0].type == GGMLType.F16 and mul_mat_path(node, cc) == "mmf"):
            parts = _stream_k_parts(node, cc, nsm) if s[0].type == GGMLType.Q8_0 else 0
            return _mat_product(d, f"mul_mat_{_W[s[0].type]}", [node, s[0], s[1]], x_slot=2, parts=parts)
        return _mat_product(d, f"mul_mat_vec_{_W[s[0].type]}", [node, s[0], s[1]], x_slot=2, ip=_mmv_ip(node, s[0]))
    if op == Op.MUL_MAT_ID:
        return lower_mul_mat_id(d, node, cc, nsm)
    if op == Op.ROPE:
        return KernelOp(_launch(d, "rope_f32", [node, s[0], s[1]], ip=(node.param_i32(1), node.param_i32(2)),
                                fp=rope_fp(node)))
    if op == Op.SET_ROWS:
        return KernelOp(_launch(d, f"set_rows_{_W[node.type]}", [node, s[1], s[2]]))
    if op == Op.FLASH_ATTN_EXT:
        return _lower_attention(d, node, cc)
    if op == Op.SOFT_MAX:
        return KernelOp(_launch(d, "soft_max_f32", [node, s[0]], fp=(node.param_f32(0),)))
    if op == Op.ARGSORT:
        if node.param_i32(0) != 1:
            raise NotImplementedError(f"{node.name}: only a descending ARGSORT has a kernel (llama.cpp routers)")
        return KernelOp(_launch(d, "argsort_f32_i32_desc", [node, s[0]]))
    if op == Op.TOP_K:
        return KernelOp(_launch(d, "top_k_f32", [node, s[0]], ip=(node.param_i32(0),)))
    if op == Op.GLU:   # split form only (src1 set, not swapped): the CPU backend refuses the others alike
        glu = _GLU_KERNELS.get(node.param_i32(0))
        if glu is None or s[1] is None or node.param_i32(1):
            raise NotImplementedError(f"the GPU backend has no kernel for GLU op {node.param_i32(0)} (node {i} {node.name})")
        # SWIGLU_CLAMP's and SWIGLU_OAI's limit (op param 3), SWIGLU_OAI's alpha (op param 2)
        return KernelOp(_launch(d, glu, [node, s[0], s[1]], fp=(node.param_f32(3), node.param_f32(2))))
    if op == Op.SCALE:
        return KernelOp(_launch(d, "scale_f32", [node, s[0]], fp=(node.param_f32(0), node.param_f32(1))))
    if op in (Op.CPY, Op.CONT):
        return KernelOp(_launch(d, f"cpy_f32_{_W[node.type]}", [node, s[0]]))
    if op == Op.SUM_ROWS:    # llama's MoE weight norm where the router's fusion is off or refused
        return KernelOp(_launch(d, "sum_rows_f32", [node, s[0]]))
    if op == Op.CLAMP:
        return KernelOp(_launch(d, "clamp_f32", [node, s[0]], fp=(node.param_f32(0), node.param_f32(1))))
    if op == Op.DIV:
        return KernelOp(_launch(d, "div_f32", [node, s[0], s[1]]))
    raise NotImplementedError(f"the GPU backend has no kernel for {op.name} (node {i} {node.name})")


_GLU_KERNELS = {GluOp.SWIGLU: "glu_swiglu_f32", GluOp.GEGLU: "glu_geglu_f32",
                GluOp.SWIGLU_CLAMP: "glu_swiglu_clamp_f32", GluOp.SWIGLU_OAI: "glu_swiglu_oai_f32"}
# the GLU ops an upstream's ggml has, of those graphdiag builds: d99724f2's enum ends at GEGLU_QUICK (5)
_GLU_AT = {"0c1e57098": frozenset(_GLU_KERNELS),
           "d99724f2": frozenset({GluOp.SWIGLU, GluOp.GEGLU, GluOp.SWIGLU_OAI})}


def refuse_ops_after(graph: Graph, upstream: str) -> None:
    """Raise GraphdiagError when the graph holds an op that `upstream`'s ggml does not have (a GLU
    SWIGLU_CLAMP under d99724f2, where ggml_glu_op has no such value and a graph cannot carry it)."""
    rec = graph.arena.rec
    nodes = graph.nodes[rec["op"][graph.nodes] == int(Op.GLU)]
    for op, idx in zip(rec["op_params"][nodes, 0].tolist(), nodes.tolist()):
        if op in _GLU_KERNELS and op not in _GLU_AT[upstream]:
            name = rec["name"][idx].decode()
            raise GraphdiagError(f"GLU op {GluOp(op).name} (node {name!r}) is not in ggml {upstream}: it came with "
                                 "llama.cpp 0c1e57098 (run with --upstream 0c1e57098)")


def rope_fp(rope: Tensor) -> tuple[float, ...]:
    """rope_f32's / rope_set_rows_f16's fp: (freq_base, freq_scale), and for a YaRN rope (its attn_factor, op
    param 8, set) ext_factor, attn_factor and ggml_rope_yarn_corr_dims' two dims, computed on the host as
    ggml-cuda's rope launcher does."""
    fb, fs = rope.param_f32(5), rope.param_f32(6)
    if rope.param_f32(8) == 0.0:
        return fb, fs
    y = Yarn(fs, rope.param_i32(4), rope.param_f32(7), rope.param_f32(8), rope.param_f32(9), rope.param_f32(10))
    return (fb, fs, y.ext_factor, y.attn_factor, *y.corr_dims(rope.param_i32(1), fb))


def _mmv_ip(dst: Tensor, w: Tensor) -> tuple[int, int]:
    """mul_mat_vec(_add)'s ip: (unused, warps per weight row) — rows shared by warps at one column."""
    return (0, mmv_warps_per_row(w.ne[1], w.ne[0]) if dst.ne[1] == 1 else 1)


def _mat_product(d, name: str, tensors: list[Tensor | None], x_slot: int, ip=(), parts: int = 0, fp=()):
    """A mat-vec / mat-mul launch; for Q8_0 weights x (tensors[x_slot]) is first quantised to Q8_1 blocks in
    pool scratch (quantize_q8_1), which the kernel then reads in that slot: two launches, as ggml's mmvq;
    `parts` > 0 (the mat-mul where upstream's MMQ needs its stream-k fixup): the kernel's k-split into that
    many parts and mul_mat_fixup_f32 after it (_k_split)."""
    w, x = tensors[1], tensors[x_slot]
    if not is_quantized(w.type):
        return KernelOp(_launch(d, name, tensors, ip=ip, fp=fp))
    if not parts:
        return quantized_x_op(d, name, tensors, x_slot, ip=ip, fp=fp)
    ne, nb, nbytes = q8_1_scratch(x, name)
    quant = _launch(d, "quantize_q8_1", [None, x], scratch=[(0, Q8_1, ne, nb)])
    return _k_split(d, name, tensors, quant, (x_slot, Q8_1, ne, nb), nbytes, parts)


def _split_k(d, node: Tensor, parts: int, name: str):
    """An F32 MUL_MAT upstream hands to cuBLAS, which splits K (compat.cublas_split_k_parts): `name`
    (mul_mat_f32) in `parts` k parts, parts 1.. into pool scratch, and mul_mat_fixup_f32 adding
    them in — two launches, as cuBLAS's split-K GEMM and its reduce."""
    m, n, b2, b3 = node.ne
    pne = (m, n, b2, b3 * (parts - 1))
    pnb = (4, 4 * m, 4 * m * n, 4 * m * n * b2)
    f32 = int(GGMLType.F32)
    kernel = _launch(d, name, [node, node.src[0], node.src[1], None], ip=(parts,),
                     scratch=[(3, f32, pne, pnb)])
    fixup = _launch(d, "mul_mat_fixup_f32", [node, None], ip=(parts - 1,), scratch=[(1, f32, pne, pnb)])
    return ScratchLaunchesOp([kernel, fixup], [((3, 0),), ((1, 0),)], pnb[3] * pne[3])


def _cublas_f16(d, node: Tensor, parts: int):
    """An F16 MUL_MAT upstream hands to cuBLAS computing in F16 (ggml_cuda_op_mul_mat_cublas): launch for
    launch what upstream's capture holds — x converted to F16 into pool scratch (convert_unary<float, half>:
    cpy_f32_f16), the GEMM of W and that copy into an F16 result in pool scratch (mul_mat_f16 with F16 x;
    where cuBLAS splits K, compat.cublas_split_k_parts, in `parts` k parts and mul_mat_fixup_f32 adding them
    in, as h16816gemm + splitKreduce_kernel), and that result converted to F32 into the node
    (convert_unary<half, float>: cpy_f16_f32): three launches, four split. The copies are upstream's pool
    allocations (src1 as F16, the F16 dst), in one scratch buffer. graphdiag's GEMM sums in F32 where
    cuBLAS's CUBLAS_COMPUTE_16F may sum in F16: the result is rounded to F16 as upstream's is."""
    x, w = node.src[1], node.src[0]
    f16, f32 = int(GGMLType.F16), int(GGMLType.F32)
    xne, yne = x.ne, node.ne
    xnb, ynb = contiguous_nb(f16, xne), contiguous_nb(f16, yne)
    y_at = aligned(xnb[3] * xne[3])
    p_at = y_at + aligned(ynb[3] * yne[3])
    cvt = _launch(d, "cpy_f32_f16", [None, x], scratch=[(0, f16, xne, xnb)])
    back = _launch(d, "cpy_f16_f32", [node, None], scratch=[(1, f16, yne, ynb)])
    if not parts:
        gemm = _launch(d, "mul_mat_f16", [None, w, None], scratch=[(0, f16, yne, ynb), (2, f16, xne, xnb)])
        return ScratchLaunchesOp([cvt, gemm, back], [((0, 0),), ((0, y_at), (2, 0)), ((1, y_at),)], p_at)
    m, n, b2, b3 = yne
    pne = (m, n, b2, b3 * (parts - 1))
    pnb = (4, 4 * m, 4 * m * n, 4 * m * n * b2)
    gemm = _launch(d, "mul_mat_f16", [None, w, None, None], ip=(parts,),
                   scratch=[(0, f16, yne, ynb), (2, f16, xne, xnb), (3, f32, pne, pnb)])
    fixup = _launch(d, "mul_mat_fixup_f32", [None, None], ip=(parts - 1,),
                    scratch=[(0, f16, yne, ynb), (1, f32, pne, pnb)])
    return ScratchLaunchesOp([cvt, gemm, fixup, back],
                             [((0, 0),), ((0, y_at), (2, 0), (3, p_at)), ((0, y_at), (1, p_at)), ((1, y_at),)],
                             p_at + pnb[3] * pne[3])


def _k_split(d, name: str, tensors: list[Tensor | None], first: Launch, operand, nbytes: int, parts: int):
    """`first` (quantize_q8_1 of x, or dequantize_f16 of W) writing `operand` = (slot, type, ne, nb) of the
    mat-mul into the first `nbytes` of the scratch; the mat-mul split into `parts` k parts (ip[0]), parts 1..
    writing F32 partials (M, N, B2, B3 * (parts - 1)) into the scratch after it (t[3]); mul_mat_fixup_f32
    adding them into dst. Three launches, where upstream launches quantize_mmq_q8_1, mul_mat_q and
    mul_mat_q_stream_k_fixup (compat.mmq_stream_k_parts)."""
    node = tensors[0]
    m, n, b2, b3 = node.ne
    pne = (m, n, b2, b3 * (parts - 1))
    pnb = (4, 4 * m, 4 * m * n, 4 * m * n * b2)
    at = aligned(nbytes)
    f32 = int(GGMLType.F32)
    kernel = _launch(d, name, [*tensors, None], ip=(parts,), scratch=[operand, (3, f32, pne, pnb)])
    fixup = _launch(d, "mul_mat_fixup_f32", [node, None], ip=(parts - 1,), scratch=[(1, f32, pne, pnb)])
    return ScratchLaunchesOp([first, kernel, fixup], [((0, 0),), ((operand[0], 0), (3, at)), ((1, at),)],
                             at + pnb[3] * pne[3])


def _stream_k_parts(node: Tensor, cc: int, nsm: int) -> int:
    """The k parts of a quantised MUL_MAT on upstream's MMQ path (0: upstream launches no fixup there)."""
    w = node.src[0]
    if mul_mat_path(node, cc) != "mmq":
        return 0
    return mmq_stream_k_parts(node.ne[0], node.ne[1], node.ne[2] * node.ne[3], w.ne[0], nsm, cc)


def _lower_x_mul_mat(d, node: Tensor, cc: int, nsm: int):
    """MUL_MAT of an X type: ggml's MMVQ path -> quantize + mul_mat_vec_{w}; MMVF -> mul_mat_vec_bf16;
    any other BF16 path -> mul_mat_bf16; a quantized type above MMVQ -> dequantize_f16 + mul_mat_f16 (+ the
    fixup of its k-split where upstream's MMQ launches its stream-k fixup)."""
    w, x = node.src[0], node.src[1]
    name, path = _X[w.type], mul_mat_path(node, cc)
    if path in ("mmvq", "mmvf") and x.ne[1] <= MMVQ_MAX_BATCH_SIZE:
        return _mat_product(d, f"mul_mat_vec_{name}", [node, w, x], x_slot=2, ip=_mmv_ip(node, w))
    if w.type == GGMLType.BF16:
        return KernelOp(_launch(d, "mul_mat_bf16", [node, w, x]))
    ne, f16 = w.ne, int(GGMLType.F16)
    nb = contiguous_nb(f16, ne)
    deq = _launch(d, f"dequantize_f16_{name}", [None, w], scratch=[(0, f16, ne, nb)])
    parts = _stream_k_parts(node, cc, nsm)
    if parts:
        return _k_split(d, "mul_mat_f16", [node, w, x], deq, (1, f16, ne, nb), nb[3] * ne[3], parts)
    mm = _launch(d, "mul_mat_f16", [node, w, x], scratch=[(1, f16, ne, nb)])
    return ScratchLaunchesOp([deq, mm], [((0, 0),), ((1, 0),)], nb[3] * ne[3])


def _lower_attention(d, node: Tensor, cc: int):
    """Split-KV partials into pool scratch, then the combine (two launches, grids varying with n_kv); one
    launch writing the node where upstream launches its vec kernel alone (geometry.fa_direct: D = 256 at one
    KV tile of 256)."""
    q, k, v, mask = fa_operands(node)           # llama.cpp's permuted views read through (ir/attention.py)
    hd, n_head, n_tok, nb3 = q.ne
    n_head_kv, n_kv, dv = k.ne[1], k.ne[2], v.ne[0]
    if hd not in FA_HEAD_DIMS or dv != hd or n_head % n_head_kv or n_head // n_head_kv > FA_MAX_ROWS:
        raise NotImplementedError(f"flash attention: head dims {hd}/{dv}, {n_head}/{n_head_kv} heads")
    sinks = node.src[4]                         # gpt-oss's attn_sinks: folded in by the combine
    if fa_direct(hd, n_head, n_head_kv, n_kv, n_tok, nb3, cc):
        if sinks is not None:
            raise NotImplementedError(f"flash attention with sinks at head size {hd} on upstream's lone vec kernel "
                                      "(graphdiag folds sinks into the combine)")
        chunk = -(-n_kv // 32) * 32
        # one block per query head (ip[3]), as ggml's vec kernel: the G heads sharing a kv head in one block
        # left Gemma 3's 4 heads on one SM (94 µs a layer on the H200, 18 layers a step)
        return KernelOp(_launch(d, fa_direct_kernel(hd), [node, q, k, v, mask],
                                ip=(chunk, 1, 1, 1), fp=(node.param_f32(0),)))
    vec = fa_takes_vec(hd, n_head, n_head_kv, n_kv, n_tok, nb3, cc)
    tq, n_split, chunk, nbytes = fa_plan(hd, n_head, n_head_kv, n_kv, n_tok, nb3, vec)
    ne = (dv + 2, n_split, n_head, n_tok * nb3)
    nb = (4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2])
    kernel = fa_vec_kernel(hd, n_head // n_head_kv) if vec else fa_mma_kernel(hd)
    part = _launch(d, kernel, [None, q, k, v, mask], ip=(chunk, tq), fp=(node.param_f32(0),),
                   scratch=[(0, int(GGMLType.F32), ne, nb)])
    comb = _launch(d, "flash_attn_combine_f32", [node, None, sinks], scratch=[(1, int(GGMLType.F32), ne, nb)])
    return ScratchLaunchesOp([part, comb], [((0, 0),), ((1, 0),)], nbytes)


def _lower_fused(d, graph: Graph, i: int, f: Fusion):
    node = graph.node(i)
    if f.pattern in _NORM_FUSED:
        return _lower_norm_fused(d, graph, i, f)
    if f.pattern == MMV_GLU:       # the GLU's src[0] gates: either mat-mul of the pair may be it
        glu = graph.node(i + 2)    # fp[0]: the GLU's op param 3 (upstream's fusion_data.glu_limit)
        gate, up = glu.src[0], glu.src[1]
        return _mat_product(d, f"mul_mat_vec_glu_{_W[node.src[0].type]}", [glu, gate.src[0], up.src[0], node.src[1]],
                            x_slot=3, ip=(glu.param_i32(0),), fp=(glu.param_f32(3),))
    if f.pattern == MMID_GLU:
        return lower_mmid_glu(d, graph, i)
    if f.pattern == MMID_BIAS_GLU:
        return lower_mmid_bias_glu(d, graph, i)
    if f.pattern == MMID_ADD_ID:
        return lower_mmid_add_id(d, graph, i)
    if f.pattern == MMV_ADD:
        add = graph.node(i + 1)
        resid = add.src[1] if add.src[0] == node else add.src[0]
        return _mat_product(d, f"mul_mat_vec_add_{_W[node.src[0].type]}", [add, node.src[0], node.src[1], resid],
                            x_slot=2, ip=_mmv_ip(add, node.src[0]))
    if f.pattern == MOE_WR:         # experts, router weights and the optional scale of the planned match
        experts, scale, weights = moe_reduction_operands(graph, i)
        return KernelOp(_launch(d, "moe_weighted_reduction_f32", [graph.node(i + f.absorbed), experts, weights, scale]))
    if f.pattern == TOPK_MOE:       # the router: weights (the group's last node) and ids (the argsort's view)
        weights, ids, clamp, scale = topk_moe_operands(graph, i)
        # ggml_cuda_op_topk_moe: with_norm when the group has the CLAMP, clamp_val its minimum (op param 0)
        return KernelOp(_launch(d, "topk_moe_f32", [weights, ids, node.src[0]], ip=(ids.ne[0], int(clamp is not None)),
                                fp=(scale.param_f32(0) if scale is not None else 1.0,
                                    clamp.param_f32(0) if clamp is not None else -np.inf)))
    if f.pattern == TOPK_MOE_DELAYED:   # gpt-oss's router: weights (the last RESHAPE), ids (the VIEW), logits
        ids, weights = graph.node(i + 1), graph.node(i + f.absorbed)
        return KernelOp(_launch(d, "topk_moe_f32", [weights, ids, node.src[0]], ip=(ids.ne[0], 0, 1),
                                fp=(1.0, -np.inf)))
    if f.pattern == ROPE_SET_ROWS:
        sr = graph.node(i + 2)
        if sr.type != GGMLType.F16:
            raise NotImplementedError("rope+set_rows fusion needs an F16 cache")
        return KernelOp(_launch(d, "rope_set_rows_f16", [sr, node.src[0], node.src[1], sr.src[2]],
                                ip=(node.param_i32(1), node.param_i32(2)), fp=rope_fp(node)))
    raise ValueError(f"unknown fusion {f.pattern}")


_NORM_FUSED = (RMS_NORM_MUL, RMS_NORM_MUL_ADD, RMS_NORM_MUL_ROPE, RMS_NORM_MUL_ROPE_SET_ROWS, RMS_NORM_SCALE)


def _lower_norm_fused(d, graph: Graph, i: int, f: Fusion) -> KernelOp:
    """RMS_NORM + MUL [+ ADD | + ROPE [+ VIEW + SET_ROWS]], or RMS_NORM + SCALE: one launch writing the group's
    last node; w is the MUL's operand other than the norm, r the ADD's other than the MUL; the SCALE's factor
    (its op param 0; its bias is 0) goes in as fp[1], as upstream's rms_norm_f32<do_scale> takes scale_out."""
    norm = graph.node(i)
    if f.pattern == RMS_NORM_SCALE:
        scale = graph.node(i + 1)
        return KernelOp(_launch(d, "rms_norm_scale_f32", [scale, norm.src[0]],
                                fp=(norm.param_f32(0), scale.param_f32(0))))
    mul = graph.node(i + 1)
    x, w, eps = norm.src[0], other_src(mul, norm), norm.param_f32(0)
    if f.pattern == RMS_NORM_MUL:
        return KernelOp(_launch(d, "rms_norm_mul_f32", [mul, x, w], fp=(eps,)))
    if f.pattern == RMS_NORM_MUL_ADD:
        add = graph.node(i + 2)
        return KernelOp(_launch(d, "rms_norm_mul_add_f32", [add, x, w, other_src(add, mul)], fp=(eps,)))
    rope = graph.node(i + 2)
    if rope.param_f32(8) != 0.0:
        raise NotImplementedError(f"{rope.name}: YaRN in the RMS_NORM + MUL + ROPE fusion (no graph of graphdiag's has both)")
    ip, fp = (rope.param_i32(1), rope.param_i32(2)), (eps, rope.param_f32(5), rope.param_f32(6))
    if f.pattern == RMS_NORM_MUL_ROPE:
        return KernelOp(_launch(d, "rms_norm_mul_rope_f32", [rope, x, w, rope.src[1]], ip=ip, fp=fp))
    sr = graph.node(i + 4)
    if sr.type != GGMLType.F16:
        raise NotImplementedError("rms_norm+mul+rope+set_rows fusion needs an F16 cache")
    return KernelOp(_launch(d, "rms_norm_mul_rope_set_rows_f16", [sr, x, w, rope.src[1], sr.src[2]], ip=ip, fp=fp))

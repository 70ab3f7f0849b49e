"""Lowering: a node (or a fused group) to the kernel launches the GPU backend issues for it.

Each lowered op is prepared once (parameters packed once) and reused while the graph's identity holds;
`run(stream)` issues it. `ready` says whether it has been prepared: an eager evaluation prepares each op
right before its first run (capture.CaptureLoop.evaluate), so the GPU starts on the first nodes while the
host still packs the rest. Kernel choice follows ggml's dispatch: mat-vec while the batch fits the mat-vec
path, mat-mul (tensor cores for F16 / Q8_0) otherwise; MUL_MAT_ID takes the fast path unless the needs-sync
rule sends it to the sorted fallback, which copies the ids to the host and synchronises the stream.

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
  Q4_0/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K MUL_MAT             2: on ggml's MMVQ path (compat.mul_mat_path) quantize_q8_1
                                                      then mul_mat_vec(_glu/_add)_{w}; above it (MMQ in
                                                      ggml) dequantize_f16_{w} of W into pool scratch then
                                                      mul_mat_f16 (graphdiag has no MMQ tiles for these); 3
                                                      with the k-split and its fixup, as Q8_0
  BF16 MUL_MAT                                     1: mul_mat_vec(_glu/_add)_bf16 on MMVF's path, else
                                                      mul_mat_bf16
  FLASH_ATTN_EXT                                   2: split-KV partials into pool scratch (flash_attn_vec_f16_
                                                      d{D}_g{G} up to 8 tokens, flash_attn_mma_f16_d{D} on
                                                      tensor cores above), then combine; 1 (the vec kernel
                                                      writing the node) where upstream's vec kernel runs
                                                      alone: D 256 at n_kv 256 (geometry.fa_direct), so
                                                      n_kv 256 -> 512 changes the topology there, as upstream
  everything else                                  1
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphdiagError
from ...ir.arena import TENSOR_SIZE
from ...ir.attention import fa_operands
from ...ir.dtypes import QK8_0, GGMLType, is_quantized
from ...ir.graph import Graph
from ...ir.ops import GluOp, Op
from ...ir.tensor import Tensor
from .. import abi
from ..drivers.base import H200_MULTIPROCESSORS, Driver, Launch
from .compat import (MMVQ_MAX_BATCH_SIZE, cublas_split_k_parts, mmq_stream_k_parts, mul_mat_id_needs_sync,
                     mul_mat_path)
from .descriptors import DescriptorTable
from .fusion import (MMID_GLU, MMV_ADD, MMV_GLU, MOE_WR, RMS_NORM_MUL, ROPE_SET_ROWS, TOPK_MOE, Fusion,
                     moe_reduction_operands, topk_moe_operands)
from .fusion_graph import other_src
from .fusion_norm import RMS_NORM_MUL_ADD, RMS_NORM_MUL_ROPE, RMS_NORM_MUL_ROPE_SET_ROWS, RMS_NORM_SCALE
from ..abi import Q8_1, Q8_1_BYTES
from ..geometry import (FA_HEAD_DIMS, FA_MAX_ROWS, fa_direct, fa_plan, fa_vec, geometry_of_bytes, launch_geometry,
                        mmv_warps_per_row)
from ..kernels import fa_direct_kernel, fa_mma_kernel, fa_vec_kernel
from .pdl import upstream_pdl
from .pool import TempPool

_W = {GGMLType.F32: "f32", GGMLType.F16: "f16", GGMLType.Q8_0: "q8_0"}
# the file's weight types (kernels/mmvq.cu): their MUL_MAT follows ggml's dispatch (_lower_x_mul_mat)
_X = {GGMLType.Q4_0: "q4_0", GGMLType.Q5_0: "q5_0", GGMLType.Q5_1: "q5_1", GGMLType.Q4_K: "q4_k",
      GGMLType.Q5_K: "q5_k", GGMLType.Q6_K: "q6_k", GGMLType.BF16: "bf16"}
_W.update(_X)


def _launch(d: "DescriptorTable | None", name: str, tensors: list[Tensor | None], ip=(), fp=(),
            scratch=()) -> Launch:
    """One launch; `scratch`: (slot, type, ne, nb) of each descriptor that describes pool scratch (address 0
    until the op runs and takes a buffer)."""
    buf = bytearray(abi.KPARAMS.itemsize)
    slot = 0
    if d is None:
        for t in tensors:
            if t is not None:
                abi.set_desc_from_struct(buf, slot, t.arena.mem, t.idx * TENSOR_SIZE)
            slot += 1
    else:
        refs = []
        for t in tensors:
            if t is not None:
                d.write(buf, slot, t.idx)
                refs.append((slot, t.idx))
            slot += 1
        # the descriptors this launch takes from structs (scratch, written next, takes its slot's place)
        taken = {sc[0] for sc in scratch}
        d.described.append(tuple(r for r in refs if r[0] not in taken))
    for slot_, type_, ne, nb in scratch:
        abi.set_desc_bytes(buf, slot_, 0, type_, ne, nb)
    abi.set_scalars_bytes(buf, ip, fp)
    grid, block, shmem = geometry_of_bytes(name, buf)     # geometry read from the bytes, before the record
    return Launch(name, grid, block, abi.params_from_bytes(buf), shmem)


class KernelOp:
    """One prepared launch."""

    __slots__ = ("launch", "n_launches", "ready")

    def __init__(self, launch: Launch):
        self.launch = launch
        self.n_launches = 1
        self.ready = False

    def prepare(self, driver: Driver) -> None:
        driver.prepare(self.launch)
        self.ready = True

    def run(self, driver: Driver, stream, pool: TempPool) -> None:
        driver.launch(stream, self.launch)


class ScratchLaunchesOp:
    """Launches sharing one scratch buffer taken from the pool around them: `slots[i]` lists the (descriptor,
    byte offset) pairs of launches[i] that point into the buffer (re-packed only when the pool hands out
    another buffer)."""

    __slots__ = ("launches", "slots", "nbytes", "addr", "n_launches", "ready")

    def __init__(self, launches: list[Launch], slots: list[int], nbytes: int):
        self.launches, self.slots, self.nbytes, self.addr = launches, slots, nbytes, 0
        self.n_launches = len(launches)
        self.ready = False

    def prepare(self, driver: Driver) -> None:
        for launch in self.launches:
            driver.prepare(launch)
        self.ready = True

    def _take(self, driver: Driver, pool: TempPool) -> tuple[int, int]:
        """A buffer from the pool, the launches re-packed if it is not the one they point into."""
        addr, size = pool.alloc(self.nbytes)
        if addr != self.addr:
            self._repack(driver, addr)
        return addr, size

    def _repack(self, driver: Driver, addr: int) -> None:
        for launch, places in zip(self.launches, self.slots):
            for slot, off in places:
                launch.params["t"][slot]["data"] = addr + off
            driver.prepare(launch)
        self.addr = addr

    def run(self, driver: Driver, stream, pool: TempPool) -> None:
        addr, size = self._take(driver, pool)
        for launch in self.launches:
            driver.launch(stream, launch)
        pool.free(addr, size)

    def stage(self, driver: Driver, pool: TempPool, run: list) -> None:
        """run() for an eager run of launches (CaptureLoop.run_eager): the buffer taken and handed back
        around appending the launches to `run`, which the backend launches before the pool frees or
        flushes anything on the device (TempPool.before_flush), so no launch is made after its buffer went.
        A cached buffer that fits is taken and handed back in one call (TempPool.reuse)."""
        addr = pool.reuse(self.nbytes)
        if addr is not None:
            if addr != self.addr:
                self._repack(driver, addr)
            run.extend(self.launches)
            return
        addr, size = self._take(driver, pool)
        run.extend(self.launches)
        pool.free(addr, size)


class SortedMulMatIdOp:
    """The MUL_MAT_ID sorted fallback: ids to the host (synchronising), one launch per used expert."""

    n_launches = 1
    ready = True   # nothing to prepare: every run makes its launches

    def __init__(self, node: Tensor, d: "DescriptorTable | None" = None):
        self.node = node
        w = _W[node.src[0].type]
        self.kernel = f"mul_mat_id_gathered_{w}"
        self.template = _launch(d, self.kernel, [node, node.src[0], node.src[1], None])

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
    if op in (Op.MUL, Op.ADD):
        return KernelOp(_launch(d, "mul_f32" if op == Op.MUL else "add_f32", [node, s[0], s[1]]))
    if op == Op.MUL_MAT and s[0].type in _X:
        return _lower_x_mul_mat(d, node, cc, nsm)
    if op == Op.MUL_MAT:
        if s[0].type == GGMLType.F32 and mul_mat_path(node, cc) == "cublas":
            parts = cublas_split_k_parts(node, nsm)
            if parts:
                return _split_k(d, node, parts)
        if s[1].ne[1] > MMVQ_MAX_BATCH_SIZE:
            parts = _stream_k_parts(node, cc, nsm) if s[0].type == GGMLType.Q8_0 else 0
            return _mat_product(d, f"mul_mat_{_W[s[0].type]}", [node, s[0], s[1]], x_slot=2, parts=parts)
        return _mat_product(d, f"mul_mat_vec_{_W[s[0].type]}", [node, s[0], s[1]], x_slot=2, ip=_mmv_ip(node, s[0]))
    if op == Op.MUL_MAT_ID:
        if mul_mat_id_needs_sync(node, cc):
            return SortedMulMatIdOp(node, d)
        return KernelOp(_launch(d, f"mul_mat_id_vec_{_W[s[0].type]}", [node, s[0], s[1], s[2]]))
    if op == Op.ROPE:
        return KernelOp(_launch(d, "rope_f32", [node, s[0], s[1]], ip=(node.param_i32(1), node.param_i32(2)),
                                fp=(node.param_f32(5), node.param_f32(6))))
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
        return KernelOp(_launch(d, glu, [node, s[0], s[1]], fp=(node.param_f32(3),)))   # SWIGLU_CLAMP's limit
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
                GluOp.SWIGLU_CLAMP: "glu_swiglu_clamp_f32"}
# the GLU ops an upstream's ggml has, of those graphdiag builds: d99724f2's enum ends at GEGLU_QUICK (5)
_GLU_AT = {"0c1e57098": frozenset(_GLU_KERNELS), "d99724f2": frozenset({GluOp.SWIGLU, GluOp.GEGLU})}


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
    if x.type != GGMLType.F32 or x.ne[0] % QK8_0:
        raise NotImplementedError(f"{name}: x must be F32 with rows of whole 32-blocks")
    nbk = x.ne[0] // QK8_0
    nb = (Q8_1_BYTES, Q8_1_BYTES * nbk, Q8_1_BYTES * nbk * x.ne[1], Q8_1_BYTES * nbk * x.ne[1] * x.ne[2])
    nbytes = nb[3] * x.ne[3]
    quant = _launch(d, "quantize_q8_1", [None, x], scratch=[(0, Q8_1, x.ne, nb)])
    if parts:
        return _k_split(d, name, tensors, quant, (x_slot, Q8_1, x.ne, nb), nbytes, parts)
    kernel = _launch(d, name, tensors, ip=ip, fp=fp, scratch=[(x_slot, Q8_1, x.ne, nb)])
    return ScratchLaunchesOp([quant, kernel], [((0, 0),), ((x_slot, 0),)], nbytes)


def _split_k(d, node: Tensor, parts: int):
    """An F32 MUL_MAT upstream hands to cuBLAS, which splits K (compat.cublas_split_k_parts): mul_mat_f32 in
    `parts` k parts, parts 1.. into pool scratch, and mul_mat_fixup_f32 adding them in — two launches, as
    cuBLAS's split-K GEMM and its reduce."""
    m, n, b2, b3 = node.ne
    pne = (m, n, b2, b3 * (parts - 1))
    pnb = (4, 4 * m, 4 * m * n, 4 * m * n * b2)
    f32 = int(GGMLType.F32)
    kernel = _launch(d, "mul_mat_f32", [node, node.src[0], node.src[1], None], ip=(parts,),
                     scratch=[(3, f32, pne, pnb)])
    fixup = _launch(d, "mul_mat_fixup_f32", [node, None], ip=(parts - 1,), scratch=[(1, f32, pne, pnb)])
    return ScratchLaunchesOp([kernel, fixup], [((3, 0),), ((1, 0),)], pnb[3] * pne[3])


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
    at = -(-nbytes // 256) * 256
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
    ne = w.ne
    nb = (2, 2 * ne[0], 2 * ne[0] * ne[1], 2 * ne[0] * ne[1] * ne[2])
    f16 = int(GGMLType.F16)
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
    if fa_direct(hd, n_head, n_head_kv, n_kv, n_tok, nb3, cc):
        chunk = -(-n_kv // 32) * 32
        # one block per query head (ip[3]), as ggml's vec kernel: the G heads sharing a kv head in one block
        # left Gemma 3's 4 heads on one SM (94 µs a layer on the H200, 18 layers a step)
        return KernelOp(_launch(d, fa_direct_kernel(hd), [node, q, k, v, mask],
                                ip=(chunk, 1, 1, 1), fp=(node.param_f32(0),)))
    tq, n_split, chunk, nbytes = fa_plan(hd, n_head, n_head_kv, n_kv, n_tok, nb3)
    ne = (dv + 2, n_split, n_head, n_tok * nb3)
    nb = (4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2])
    kernel = fa_vec_kernel(hd, n_head // n_head_kv) if fa_vec(n_head, n_head_kv, n_tok) else fa_mma_kernel(hd)
    part = _launch(d, kernel, [None, q, k, v, mask], ip=(chunk, tq), fp=(node.param_f32(0),),
                   scratch=[(0, int(GGMLType.F32), ne, nb)])
    comb = _launch(d, "flash_attn_combine_f32", [node, None], scratch=[(1, int(GGMLType.F32), ne, nb)])
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
    if f.pattern == MMID_GLU:      # experts read float x, as the unfused MUL_MAT_ID here
        glu = graph.node(i + 2)
        gate, up = glu.src[0], glu.src[1]
        return KernelOp(_launch(d, f"mul_mat_id_vec_glu_{_W[node.src[0].type]}",
                                [glu, gate.src[0], up.src[0], node.src[1], node.src[2]], ip=(glu.param_i32(0),),
                                fp=(glu.param_f32(3),)))
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
    if f.pattern == ROPE_SET_ROWS:
        sr = graph.node(i + 2)
        if sr.type != GGMLType.F16:
            raise NotImplementedError("rope+set_rows fusion needs an F16 cache")
        return KernelOp(_launch(d, "rope_set_rows_f16", [sr, node.src[0], node.src[1], sr.src[2]],
                                ip=(node.param_i32(1), node.param_i32(2)),
                                fp=(node.param_f32(5), node.param_f32(6))))
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
    ip, fp = (rope.param_i32(1), rope.param_i32(2)), (eps, rope.param_f32(5), rope.param_f32(6))
    if f.pattern == RMS_NORM_MUL_ROPE:
        return KernelOp(_launch(d, "rms_norm_mul_rope_f32", [rope, x, w, rope.src[1]], ip=ip, fp=fp))
    sr = graph.node(i + 4)
    if sr.type != GGMLType.F16:
        raise NotImplementedError("rms_norm+mul+rope+set_rows fusion needs an F16 cache")
    return KernelOp(_launch(d, "rms_norm_mul_rope_set_rows_f16", [sr, x, w, rope.src[1], sr.src[2]], ip=ip, fp=fp))

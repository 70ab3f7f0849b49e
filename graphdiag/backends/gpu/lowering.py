"""Lowering: a node (or a fused group) to the kernel launches the GPU backend issues for it.

Each lowered op is prepared once (parameters packed once) and reused while the graph's identity holds;
`run(stream)` issues it. Kernel choice follows ggml's dispatch: mat-vec while the batch fits the mat-vec
path, tiled mat-mul otherwise; MUL_MAT_ID takes the fast path unless the needs-sync rule sends it to the
sorted fallback, which copies the ids to the host and synchronises the stream.
"""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import GGMLType
from ...ir.graph import Graph
from ...ir.ops import Op
from ...ir.tensor import Tensor
from .. import abi
from ..drivers.base import Driver, Launch
from .compat import MMVQ_MAX_BATCH_SIZE, mul_mat_id_needs_sync
from .fusion import MMV_ADD, MMV_GLU, RMS_NORM_MUL, ROPE_SET_ROWS, Fusion
from .pool import TempPool

_W = {GGMLType.F32: "f32", GGMLType.F16: "f16", GGMLType.Q8_0: "q8_0"}


def _geometry(name: str, params: np.ndarray):
    from ..geometry import launch_geometry
    return launch_geometry(name, params)


def _launch(name: str, tensors: list[Tensor | None], ip=(), fp=()) -> Launch:
    p = abi.new_params()
    for slot, t in enumerate(tensors):
        if t is not None:
            abi.set_desc_from_record(p, slot, t.arena.rec[t.idx])
    for k, v in enumerate(ip):
        p["ip"][k] = v
    for k, v in enumerate(fp):
        p["fp"][k] = v
    grid, block, shmem = _geometry(name, p)
    return Launch(name, grid, block, p, shmem)


class KernelOp:
    """One prepared launch."""

    __slots__ = ("launch", "n_launches")

    def __init__(self, launch: Launch):
        self.launch = launch
        self.n_launches = 1

    def prepare(self, driver: Driver) -> None:
        driver.prepare(self.launch)

    def run(self, driver: Driver, stream, pool: TempPool) -> None:
        driver.launch(stream, self.launch)


class ScratchKernelOp(KernelOp):
    """A launch whose descriptor `slot` is scratch memory taken from the pool around the launch."""

    __slots__ = ("slot", "nbytes", "addr")

    def __init__(self, launch: Launch, slot: int, nbytes: int):
        super().__init__(launch)
        self.slot, self.nbytes, self.addr = slot, nbytes, 0

    def run(self, driver: Driver, stream, pool: TempPool) -> None:
        addr, size = pool.alloc(self.nbytes)
        if addr != self.addr:                    # re-pack only when the pool handed out another buffer
            self.launch.params["t"][self.slot]["data"] = addr
            driver.prepare(self.launch)
            self.addr = addr
        driver.launch(stream, self.launch)
        pool.free(addr, size)


class SortedMulMatIdOp:
    """The MUL_MAT_ID sorted fallback: ids to the host (synchronising), one launch per used expert."""

    n_launches = 1

    def __init__(self, node: Tensor):
        self.node = node
        w = _W[node.src[0].type]
        self.kernel = f"mul_mat_id_gathered_{w}"
        self.template = _launch(self.kernel, [node, node.src[0], node.src[1], None])

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
            grid, block, shmem = _geometry(self.kernel, p)
            launch = driver.prepare(Launch(self.kernel, grid, block, p, shmem))
            driver.launch(stream, launch)
        pool.free(addr, size)


def lower_node(graph: Graph, i: int, fusion: Fusion | None, cc: int):
    """The lowered op for node i (with `fusion` absorbing the following nodes)."""
    node = graph.node(i)
    if fusion is not None:
        return KernelOp(_lower_fused(graph, i, fusion))
    op = node.op
    s = node.src
    if op == Op.GET_ROWS:
        return KernelOp(_launch(f"get_rows_{_W[s[0].type]}", [node, s[0], s[1]]))
    if op == Op.RMS_NORM:
        return KernelOp(_launch("rms_norm_f32", [node, s[0]], fp=(node.param_f32(0),)))
    if op in (Op.MUL, Op.ADD):
        return KernelOp(_launch("mul_f32" if op == Op.MUL else "add_f32", [node, s[0], s[1]]))
    if op == Op.MUL_MAT:
        path = "mul_mat_vec" if s[1].ne[1] <= MMVQ_MAX_BATCH_SIZE else "mul_mat"
        return KernelOp(_launch(f"{path}_{_W[s[0].type]}", [node, s[0], s[1]]))
    if op == Op.MUL_MAT_ID:
        if mul_mat_id_needs_sync(node, cc):
            return SortedMulMatIdOp(node)
        return KernelOp(_launch(f"mul_mat_id_vec_{_W[s[0].type]}", [node, s[0], s[1], s[2]]))
    if op == Op.ROPE:
        return KernelOp(_launch("rope_f32", [node, s[0], s[1]], ip=(node.param_i32(1), node.param_i32(2)),
                                fp=(node.param_f32(5), node.param_f32(6))))
    if op == Op.SET_ROWS:
        return KernelOp(_launch(f"set_rows_{_W[node.type]}", [node, s[1], s[2]]))
    if op == Op.FLASH_ATTN_EXT:
        return _lower_attention(node)
    if op == Op.SOFT_MAX:
        return KernelOp(_launch("soft_max_f32", [node, s[0]], fp=(node.param_f32(0),)))
    if op == Op.TOP_K:
        return KernelOp(_launch("top_k_f32", [node, s[0]], ip=(node.param_i32(0),)))
    if op == Op.GLU:
        return KernelOp(_launch("glu_swiglu_f32", [node, s[0], s[1]]))
    if op in (Op.CPY, Op.CONT):
        return KernelOp(_launch(f"cpy_f32_{_W[node.type]}", [node, s[0]]))
    raise NotImplementedError(f"the GPU backend has no kernel for {op.name} (node {i} {node.name})")


def _lower_attention(node: Tensor) -> ScratchKernelOp:
    q, k, v, mask = node.src[:4]
    n_kv, n_head, n_tok = k.ne[2], q.ne[1], q.ne[2]
    launch = _launch("flash_attn_ext_f16", [node, q, k, v, mask], fp=(node.param_f32(0),))
    nbytes = 4 * n_kv * n_head * n_tok
    abi.set_desc(launch.params, 5, 0, int(GGMLType.F32), (n_kv, n_head, n_tok, 1),
                 (4, 4 * n_kv, 4 * n_kv * n_head, nbytes))
    return ScratchKernelOp(launch, 5, nbytes)


def _lower_fused(graph: Graph, i: int, f: Fusion) -> Launch:
    node = graph.node(i)
    if f.pattern == RMS_NORM_MUL:
        mul = graph.node(i + 1)
        return _launch("rms_norm_mul_f32", [mul, node.src[0], mul.src[1]], fp=(node.param_f32(0),))
    if f.pattern == MMV_GLU:
        up, glu = graph.node(i + 1), graph.node(i + 2)
        return _launch(f"mul_mat_vec_glu_{_W[node.src[0].type]}", [glu, node.src[0], up.src[0], node.src[1]],
                       ip=(glu.param_i32(0),))
    if f.pattern == MMV_ADD:
        add = graph.node(i + 1)
        resid = add.src[1] if add.src[0] == node else add.src[0]
        return _launch(f"mul_mat_vec_add_{_W[node.src[0].type]}", [add, node.src[0], node.src[1], resid])
    if f.pattern == ROPE_SET_ROWS:
        sr = graph.node(i + 2)
        if sr.type != GGMLType.F16:
            raise NotImplementedError("rope+set_rows fusion needs an F16 cache")
        return _launch("rope_set_rows_f16", [sr, node.src[0], node.src[1], sr.src[2]],
                       ip=(node.param_i32(1), node.param_i32(2)), fp=(node.param_f32(5), node.param_f32(6)))
    raise ValueError(f"unknown fusion {f.pattern}")

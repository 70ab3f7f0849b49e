"""The CPU backend: numpy execution of a graph split, one cpu_ops call per node.

It owns one AddressSpace for its buffers and resolves tensor addresses in a list of address spaces, so it
can read tensors placed elsewhere (e.g. a second CpuBackend named "GPU" standing in for the GPU backend).
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphdiagError
from ..ir.arena import Arena
from ..ir.attention import unpermuted
from ..ir.build import Yarn
from ..ir.graph import Graph
from ..ir.ops import GluOp, Op, TensorFlag, is_view_or_noop
from ..ir.tensor import Tensor
from ..memory import AddressSpace
from . import cpu_ops as ops
from .base import Backend

HOST_BASE = 0x1000_0000_0000
_GLU_OPS = (GluOp.SWIGLU, GluOp.GEGLU, GluOp.SWIGLU_CLAMP, GluOp.SWIGLU_OAI)


def _f32(rec, i: int) -> float:
    """op_params[i] read as float32 bits."""
    return float(rec["op_params"][i : i + 1].view(np.float32)[0])


def yarn_of(rec) -> tuple[float, float, float, float] | None:
    """A ROPE node's YaRN as cpu_ops.rope takes it, (ext_factor, attn_factor, corr_dim0, corr_dim1), or None
    for a plain rope (attn_factor, op param 8, unset)."""
    if _f32(rec, 8) == 0.0:
        return None
    p = rec["op_params"]
    y = Yarn(_f32(rec, 6), int(p[4]), _f32(rec, 7), _f32(rec, 8), _f32(rec, 9), _f32(rec, 10))
    return (y.ext_factor, y.attn_factor, *y.corr_dims(int(p[1]), _f32(rec, 5)))


class CpuBackend(Backend):
    """numpy backend. `count` is the number of nodes executed since construction."""

    is_gpu = False

    def __init__(self, name: str = "CPU", space: AddressSpace | None = None,
                 resolve: list[AddressSpace] | None = None):
        self.name = name
        self.space = space if space is not None else AddressSpace(base=HOST_BASE, name=name)
        self.resolve = resolve if resolve is not None else [self.space]
        self.count = 0
        self._buffers: set[int] = set()
        self._ops = {
            Op.GET_ROWS: self._get_rows, Op.RMS_NORM: self._rms_norm, Op.MUL: self._mul, Op.ADD: self._add,
            Op.MUL_MAT: self._mul_mat, Op.MUL_MAT_ID: self._mul_mat_id, Op.ROPE: self._rope,
            Op.SET_ROWS: self._set_rows, Op.SOFT_MAX: self._soft_max, Op.TOP_K: self._top_k,
            Op.ARGSORT: self._argsort,
            Op.FLASH_ATTN_EXT: self._flash_attn, Op.GLU: self._glu, Op.CPY: self._cpy, Op.SCALE: self._scale,
            Op.DIV: self._div, Op.SUM_ROWS: self._sum_rows, Op.CLAMP: self._clamp, Op.CONT: self._cont,
            Op.ADD_ID: self._add_id,
        }

    # -- memory ----------------------------------------------------------------------------------------
    def buffer_alloc(self, nbytes: int) -> int:
        addr = self.space.alloc(nbytes)
        self._buffers.add(addr)
        return addr

    def buffer_free(self, addr: int) -> None:
        self.space.free(addr)
        self._buffers.discard(addr)

    def close(self) -> None:
        """Free the buffers this backend allocated."""
        for addr in sorted(self._buffers):
            self.space.free(addr)
        self._buffers.clear()

    def _space_of(self, addr: int) -> AddressSpace:
        for s in self.resolve:
            if s.owns(addr):
                return s
        raise GraphdiagError(f"{self.name}: address {addr:#x} is in none of {[s.name for s in self.resolve]}")

    def tensor_set(self, addr: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self._space_of(addr).bytes(addr, raw.size)[:] = raw

    def tensor_get(self, addr: int, nbytes: int) -> np.ndarray:
        return self._space_of(addr).bytes(addr, nbytes).copy()

    # -- compute ---------------------------------------------------------------------------------------
    def graph_compute(self, graph: Graph, split: int) -> None:
        """Run the split's nodes in order; nodes without COMPUTE and views/no-ops are skipped."""
        rec = graph.arena.rec
        for idx in graph.nodes:
            r = rec[int(idx)]
            if not (int(r["flags"]) & TensorFlag.COMPUTE) or is_view_or_noop(int(r["op"]), r["ne"]):
                continue
            op = int(r["op"])
            fn = self._ops.get(op)
            if fn is None:
                name = Op(op).name if op in Op._value2member_map_ else str(op)
                raise GraphdiagError(f"{self.name}: op {name} (node {r['name'].decode()!r}) is not implemented")
            fn(graph.arena, r)
            self.count += 1

    def _view(self, arena: Arena, r) -> np.ndarray:
        """The tensor's data as a strided view (a view's data falls back to view_src.data + view_offs)."""
        data = int(r["data"])
        if data == 0 and int(r["view_src"]):
            data = int(arena.rec[arena.index(int(r["view_src"]))]["data"]) + int(r["view_offs"])
        if data == 0:
            raise GraphdiagError(f"{self.name}: tensor {r['name'].decode()!r} has no data")
        return self._space_of(data).ndarray(data, int(r["type"]), r["ne"], r["nb"])

    def _src(self, arena: Arena, r, j: int) -> np.ndarray | None:
        a = int(r["src"][j])
        return None if a == 0 else self._view(arena, arena.rec[arena.index(a)])

    # -- one method per op: (arena, node record) --------------------------------------------------------
    def _get_rows(self, a, r):
        self._view(a, r)[...] = ops.get_rows(self._src(a, r, 0), self._src(a, r, 1))

    def _rms_norm(self, a, r):
        self._view(a, r)[...] = ops.rms_norm(self._src(a, r, 0), _f32(r, 0))

    def _mul(self, a, r):
        self._view(a, r)[...] = ops.mul(self._src(a, r, 0), self._src(a, r, 1))

    def _add(self, a, r):
        self._view(a, r)[...] = ops.add(self._src(a, r, 0), self._src(a, r, 1))

    def _add_id(self, a, r):
        self._view(a, r)[...] = ops.add_id(self._src(a, r, 0), self._src(a, r, 1), self._src(a, r, 2))

    def _div(self, a, r):
        self._view(a, r)[...] = ops.div(self._src(a, r, 0), self._src(a, r, 1))

    def _sum_rows(self, a, r):
        self._view(a, r)[...] = ops.sum_rows(self._src(a, r, 0))

    def _clamp(self, a, r):
        """op_params f32 [min, max]."""
        self._view(a, r)[...] = ops.clamp(self._src(a, r, 0), _f32(r, 0), _f32(r, 1))

    def _cont(self, a, r):
        """src0 (a strided view) into the node, element by element in ggml order."""
        ops.copy(self._view(a, r), self._src(a, r, 0))

    def _mul_mat(self, a, r):
        self._view(a, r)[...] = ops.mul_mat(self._src(a, r, 0), self._src(a, r, 1))

    def _mul_mat_id(self, a, r):
        self._view(a, r)[...] = ops.mul_mat_id(self._src(a, r, 0), self._src(a, r, 1), self._src(a, r, 2))

    def _rope(self, a, r):
        """op params as ggml_rope_ext: n_dims 1, mode 2, n_ctx_orig 4, freq_base 5, freq_scale 6, ext_factor
        7, attn_factor 8, beta_fast 9, beta_slow 10; YaRN where attn_factor is set (graphdiag's other ropes
        leave 7..10 zero)."""
        p = r["op_params"]
        self._view(a, r)[...] = ops.rope(self._src(a, r, 0), self._src(a, r, 1), int(p[1]), _f32(r, 5),
                                         _f32(r, 6), int(p[2]), yarn_of(r))

    def _set_rows(self, a, r):
        """src0 is the cache; the node is a view of it, so the rows land in the cache."""
        ops.set_rows(self._view(a, r), self._src(a, r, 1), self._src(a, r, 2))

    def _soft_max(self, a, r):
        self._view(a, r)[...] = ops.soft_max(self._src(a, r, 0), _f32(r, 0))

    def _top_k(self, a, r):
        self._view(a, r)[...] = ops.top_k(self._src(a, r, 0), int(r["op_params"][0]))

    def _argsort(self, a, r):
        self._view(a, r)[...] = ops.argsort(self._src(a, r, 0), int(r["op_params"][0]) == 1)

    def _flash_attn(self, a, r):
        """q, k, v read in the unpermuted layout (ir/attention.py: llama.cpp's permuted views read through)."""
        q, k, v = (self._view(a, unpermuted(Tensor(a, a.index(int(r["src"][j])))).r) for j in range(3))
        mask = self._src(a, r, 3)
        sinks = self._src(a, r, 4)
        self._view(a, r)[...] = ops.flash_attn_ext(q, k, v, mask, _f32(r, 0),
                                                   None if sinks is None else sinks.reshape(-1))

    def _glu(self, a, r):
        """Split GLU (gate = src0, up = src1): SWIGLU, GEGLU, SWIGLU_CLAMP (its limit: op param 3, f32) or
        SWIGLU_OAI (alpha and limit: op params 2 and 3); swapped (op_params[1]) is never built."""
        glu, swapped = int(r["op_params"][0]), int(r["op_params"][1])
        if glu not in _GLU_OPS or swapped or not int(r["src"][1]):
            raise GraphdiagError(f"{self.name}: GLU op {glu} (swapped {swapped}) with src1={int(r['src'][1]):#x} "
                                 "is not implemented (only split SWIGLU, GEGLU, SWIGLU_CLAMP and SWIGLU_OAI)")
        self._view(a, r)[...] = ops.glu(glu, self._src(a, r, 0), self._src(a, r, 1), _f32(r, 3), _f32(r, 2))

    def _scale(self, a, r):
        """op_params f32 [s, bias]: dst = src0 * s + bias."""
        self._view(a, r)[...] = ops.scale(self._src(a, r, 0), _f32(r, 0), _f32(r, 1))

    def _cpy(self, a, r):
        """src0 is the source, src1 the destination; the node is a view of src1."""
        ops.copy(self._view(a, r), self._src(a, r, 0))

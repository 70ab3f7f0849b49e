"""A ggml_context look-alike: constructors that allocate tensor structs in the arena.

Only metadata is set here (type, ne, nb, op, op_params, src, view fields, name). `data` is given later by
buffer placement, so a graph of any size can be built without allocating its data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .arena import MAX_NAME, MAX_SRC, TENSOR_DTYPE, TENSOR_SIZE, Arena
from .dtypes import GGMLType, block_size, type_size
from .ops import GluOp, Op, TensorFlag
from .tensor import Tensor


def contiguous_nb(t: int, ne) -> tuple[int, int, int, int]:
    nb0 = type_size(t)
    nb1 = nb0 * (ne[0] // block_size(t))
    return (nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])


def _ne4(ne) -> tuple[int, int, int, int]:
    ne = tuple(map(int, ne))
    return ne + (1,) * (4 - len(ne))


# The struct from `type` through `name` (TENSOR_DTYPE's offsets), for one pack_into per new tensor: type,
# buffer, ne, nb, op, op_params (zero), flags (zero), src, view_src, view_offs, data (zero), name.
_STRUCT = struct.Struct(f"<i4xQ4q4Qi{4 * 16}xi{MAX_SRC}QQQQ{MAX_NAME}s")
assert _STRUCT.size == TENSOR_DTYPE.fields["extra"][1]
assert [TENSOR_DTYPE.fields[f][1] for f in ("op", "flags", "src", "name")] == [80, 148, 152, 256]
_NO_SRC = (0,) * MAX_SRC
_INPUT = int(TensorFlag.INPUT)


SORT_ASC, SORT_DESC = 0, 1       # enum ggml_sort_order


@dataclass(frozen=True)
class Yarn:
    """A rope's YaRN parameters as llama.cpp passes them to ggml_rope_ext (llama_context's cparams):
    freq_scale = 1 / rope.scaling.factor, n_ctx_orig = rope.scaling.original_context_length, ext_factor 1,
    attn_factor (the magnitude llama_context leaves after cancelling ggml's own 1 + 0.1 ln(1 / freq_scale)),
    beta_fast 32, beta_slow 1 (llama_hparams' defaults)."""

    freq_scale: float
    n_ctx_orig: int
    ext_factor: float = 1.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def corr_dims(self, n_dims: int, freq_base: float) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims in float32: the pair indices where the ramp from extrapolation (below) to
        interpolation (above) starts and ends."""
        f = np.float32

        def dim(n_rot: float) -> np.float32:
            return f(n_dims) * np.log(f(self.n_ctx_orig) / (f(n_rot) * f(2) * f(np.pi)), dtype=f) / \
                (f(2) * np.log(f(freq_base), dtype=f))
        return float(max(f(0), np.floor(dim(self.beta_fast)))), float(min(f(n_dims - 1), np.ceil(dim(self.beta_slow))))

class Ctx:
    """Tensor constructors over one arena (ggml_new_tensor_*, ggml_view_*, and the ops the model uses)."""

    def __init__(self, arena: Arena):
        self.arena = arena

    # -- raw -------------------------------------------------------------------------------------------
    def new_tensor(self, t: int, ne, name: str = "", op: Op = Op.NONE, srcs=(), view_src: Tensor | None = None,
                   view_offs: int = 0, nb=None) -> Tensor:
        if view_src is not None and view_src.view_src is not None:
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        arena = self.arena
        i = arena.new_slot()
        ne = _ne4(ne)
        nb = tuple(nb) if nb is not None else contiguous_nb(t, ne)
        src = _NO_SRC
        if srcs:
            src = tuple(0 if s is None else s.addr for s in srcs) + _NO_SRC[len(srcs):]
        vs = (view_src.addr, view_offs) if view_src is not None else (0, 0)
        # one write of every field (the slot is zeroed: what is not given stays 0), as the field by field
        # assignments would leave it; a name is cut to 63 bytes, so its NUL always fits
        _STRUCT.pack_into(arena.mem, i * TENSOR_SIZE, int(t), 0, *ne, *nb, int(op), 0, *src, *vs, 0,
                          name.encode()[:MAX_NAME - 1] if name else b"")
        return Tensor(arena, i)

    def new_input(self, t: int, ne, name: str) -> Tensor:
        x = self.new_tensor(t, ne, name)
        x.flags = x.flags | _INPUT
        return x

    # -- views -----------------------------------------------------------------------------------------
    def view(self, a: Tensor, ne, nb, offset: int = 0, name: str = "") -> Tensor:
        ne = _ne4(ne)
        nb = tuple(nb) + tuple(a.nb[len(nb):]) if len(nb) < 4 else tuple(nb)
        # fill strides of trailing unit dims like ggml_view_*d
        nb = list(nb)
        for d in range(1, 4):
            if d >= len(nb) or nb[d] is None:
                nb[d] = nb[d - 1] * ne[d - 1]
        return self.new_tensor(a.type, ne, name or f"{a.name} (view)", Op.VIEW, (a,), a, offset, tuple(nb))

    def reshape(self, a: Tensor, ne, name: str = "") -> Tensor:
        ne = _ne4(ne)
        if ne[0] * ne[1] * ne[2] * ne[3] != a.nelements():
            raise ValueError(f"reshape {a.ne} -> {ne} changes the element count")
        return self.new_tensor(a.type, ne, name or f"{a.name} (reshaped)", Op.RESHAPE, (a,), a, 0)

    # -- compute ops -----------------------------------------------------------------------------------
    def get_rows(self, a: Tensor, ids: Tensor, name: str) -> Tensor:
        ne = (a.ne[0], ids.ne[0], ids.ne[1], ids.ne[2])
        return self.new_tensor(GGMLType.F32, ne, name, Op.GET_ROWS, (a, ids))

    def rms_norm(self, a: Tensor, eps: float, name: str) -> Tensor:
        x = self.new_tensor(GGMLType.F32, a.ne, name, Op.RMS_NORM, (a,))
        x.set_param_f32(0, eps)
        return x

    def mul(self, a: Tensor, b: Tensor, name: str) -> Tensor:
        return self.new_tensor(GGMLType.F32, a.ne, name, Op.MUL, (a, b))

    def add(self, a: Tensor, b: Tensor, name: str) -> Tensor:
        return self.new_tensor(GGMLType.F32, a.ne, name, Op.ADD, (a, b))

    def div(self, a: Tensor, b: Tensor, name: str) -> Tensor:
        """a / b, b repeated to a's shape (ggml_div: a new tensor of a's shape)."""
        return self.new_tensor(GGMLType.F32, a.ne, name, Op.DIV, (a, b))

    def sum_rows(self, a: Tensor, name: str) -> Tensor:
        """Each row's sum: (1, ne1, ne2, ne3) of a's type (ggml_sum_rows)."""
        return self.new_tensor(a.type, (1, *a.ne[1:]), name, Op.SUM_ROWS, (a,))

    def clamp(self, a: Tensor, lo: float, hi: float, name: str) -> Tensor:
        """min(max(a, lo), hi) into a new tensor of a's shape (ggml_clamp: op_params f32 [lo, hi])."""
        x = self.new_tensor(a.type, a.ne, name, Op.CLAMP, (a,))
        x.set_param_f32(0, lo)
        x.set_param_f32(1, hi)
        return x

    def cont(self, a: Tensor, name: str) -> Tensor:
        """a copied into a new contiguous tensor of its shape (ggml_cont)."""
        return self.new_tensor(a.type, a.ne, name, Op.CONT, (a,))

    def mul_mat(self, a: Tensor, b: Tensor, name: str) -> Tensor:
        """a: (K, M, ...), b: (K, N, ...) -> (M, N, ...) F32, as ggml_mul_mat."""
        if a.ne[0] != b.ne[0]:
            raise ValueError(f"mul_mat {name}: inner dims {a.ne[0]} != {b.ne[0]}")
        ne = (a.ne[1], b.ne[1], b.ne[2], b.ne[3])
        return self.new_tensor(GGMLType.F32, ne, name, Op.MUL_MAT, (a, b))

    def mul_mat_id(self, as_: Tensor, b: Tensor, ids: Tensor, name: str) -> Tensor:
        """as_: (K, M, n_expert), b: (K, n_used or 1, T), ids: (n_used, T) I32 -> (M, n_used, T)."""
        ne = (as_.ne[1], ids.ne[0], b.ne[2], 1)
        return self.new_tensor(GGMLType.F32, ne, name, Op.MUL_MAT_ID, (as_, b, ids))

    def rope(self, a: Tensor, pos: Tensor, n_dims: int, freq_base: float, name: str, mode: int = 0,
             yarn: "Yarn | None" = None) -> Tensor:
        """ggml_rope_ext's op params: n_dims (1), mode (2), freq_base (5), freq_scale (6, 1 without `yarn`);
        with YaRN also n_ctx_orig (4), ext_factor (7), attn_factor (8), beta_fast (9), beta_slow (10)."""
        x = self.new_tensor(GGMLType.F32, a.ne, name, Op.ROPE, (a, pos))
        x.set_param_i32(1, n_dims)
        x.set_param_i32(2, mode)
        x.set_param_f32(5, freq_base)
        x.set_param_f32(6, 1.0 if yarn is None else yarn.freq_scale)
        if yarn is not None:
            x.set_param_i32(4, yarn.n_ctx_orig)
            for i, v in enumerate((yarn.ext_factor, yarn.attn_factor, yarn.beta_fast, yarn.beta_slow)):
                x.set_param_f32(7 + i, v)
        return x

    def set_rows(self, dst: Tensor, rows: Tensor, idxs: Tensor, name: str) -> Tensor:
        """Write rows of `rows` into `dst` at `idxs`; the result is a view of dst (ggml_set_rows)."""
        return self.new_tensor(dst.type, dst.ne, name, Op.SET_ROWS, (dst, rows, idxs), dst, 0, dst.nb)

    def scale(self, a: Tensor, s: float, name: str, bias: float = 0.0) -> Tensor:
        """a * s + bias (ggml_scale / ggml_scale_bias: op_params f32 [s, bias])."""
        x = self.new_tensor(GGMLType.F32, a.ne, name, Op.SCALE, (a,))
        x.set_param_f32(0, s)
        x.set_param_f32(1, bias)
        return x

    def soft_max(self, a: Tensor, name: str, scale: float = 1.0) -> Tensor:
        x = self.new_tensor(GGMLType.F32, a.ne, name, Op.SOFT_MAX, (a,))
        x.set_param_f32(0, scale)
        return x

    def argsort(self, a: Tensor, name: str, descending: bool = True) -> Tensor:
        """ggml_argsort: I32 indices ordering each row (op param 0: GGML_SORT_ORDER_ASC 0 / DESC 1)."""
        x = self.new_tensor(GGMLType.I32, a.ne, name, Op.ARGSORT, (a,))
        x.set_param_i32(0, SORT_DESC if descending else SORT_ASC)
        return x

    def argsort_top_k(self, a: Tensor, k: int, name: str, sort_name: str = "") -> Tensor:
        """ggml_argsort_top_k: a descending ARGSORT and a VIEW of its first k columns (what llama.cpp's
        build_moe_ffn routes with, and what CUDA's top-k MoE fusion matches; not GGML_OP_TOP_K)."""
        s = self.argsort(a, sort_name or f"{name} (argsort)")
        return self.view(s, (k, s.ne[1], s.ne[2], s.ne[3]), (s.nb[0], s.nb[1], s.nb[2], s.nb[3]), 0, name)

    def top_k(self, a: Tensor, k: int, name: str) -> Tensor:
        x = self.new_tensor(GGMLType.I32, (k, a.ne[1], a.ne[2], a.ne[3]), name, Op.TOP_K, (a,))
        x.set_param_i32(0, k)
        return x

    def flash_attn_ext(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, name: str) -> Tensor:
        """q: (D, n_head, T), k/v: (D, n_head_kv, n_kv) views of the cache, mask: (n_kv, T) -> (D, n_head, T)."""
        x = self.new_tensor(GGMLType.F32, (v.ne[0], q.ne[1], q.ne[2], 1), name, Op.FLASH_ATTN_EXT, (q, k, v, mask))
        x.set_param_f32(0, scale)
        return x

    def glu_split(self, a: Tensor, b: Tensor, op: GluOp, name: str) -> Tensor:
        x = self.new_tensor(GGMLType.F32, a.ne, name, Op.GLU, (a, b))
        x.set_param_i32(0, int(op))
        return x

    def swiglu_clamp(self, gate: Tensor, up: Tensor, limit: float, name: str) -> Tensor:
        """ggml_swiglu_clamp (0c1e57098): the split GLU SWIGLU_CLAMP, its limit an f32 in op param 3."""
        x = self.glu_split(gate, up, GluOp.SWIGLU_CLAMP, name)
        x.set_param_f32(3, limit)
        return x

    def swiglu_oai(self, gate: Tensor, up: Tensor, alpha: float, limit: float, name: str) -> Tensor:
        """ggml_swiglu_oai: the split GLU SWIGLU_OAI, alpha and limit f32 in op params 2 and 3."""
        x = self.glu_split(gate, up, GluOp.SWIGLU_OAI, name)
        x.set_param_f32(2, alpha)
        x.set_param_f32(3, limit)
        return x

    def add_id(self, a: Tensor, b: Tensor, ids: Tensor, name: str) -> Tensor:
        """ggml_add_id: a (n, n_used, T) plus row ids[i, t] of b (n, n_expert) at each (i, t); a's shape."""
        if a.ne[0] != b.ne[0] or a.ne[1] != ids.ne[0] or a.ne[2] != ids.ne[1]:
            raise ValueError(f"add_id {name}: a {a.ne}, b {b.ne}, ids {ids.ne} do not fit")
        return self.new_tensor(GGMLType.F32, a.ne, name, Op.ADD_ID, (a, b, ids))

    def cast(self, a: Tensor, t: int, name: str) -> Tensor:
        """a converted to type t (ggml_cast: a CPY node into a new tensor of a's shape). ggml also points the
        result's src[1] at itself; graphdiag leaves src[1] empty (a pointer that never changes decides
        nothing in the ledger)."""
        return self.new_tensor(t, a.ne, name, Op.CPY, (a,))

    def cpy(self, a: Tensor, b: Tensor, name: str) -> Tensor:
        """Copy a into b; the result is a view of b (ggml_cpy)."""
        return self.new_tensor(b.type, b.ne, name, Op.CPY, (a, b), b, 0, b.nb)

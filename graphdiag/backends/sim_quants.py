"""The simulated driver's kernels for the X_TYPES weights (kernels/mmvq.cu, mul_mat_bf16 of mul_mat.cu):
numpy twins over graphdiag.backends.qunits. Weights are viewed as raw row bytes; the MMVQ kernels' integer
dots are exact and their float combination is quants.cuh's (float32 rounding apart); GET_ROWS and the
prefill's dequantisation to F16 are bit for bit; BF16 (its MoE kernels too) and the sorted fallback's
gathered kernels compute float32 products of the dequantised weights; the quantized experts' other kernels
read Q8_1 x (sim_moe.py). Preconditions are checked as sim_kernels checks them (CUDA_ERROR_INVALID_VALUE).
"""

from __future__ import annotations

import numpy as np

from ..errors import CudaError
from ..ir.dtypes import GGMLType as G
from ..ir.dtypes import row_size
from ..memory import AddressSpace
from . import cpu_ops as ops
from . import qunits
from .abi import Q8_1
from .kernels import X_TYPES
from .sim_view import expert_biases, view

F32 = np.float32
MMV_MAX_N = 8
XTYPE = {"q4_0": G.Q4_0, "q5_0": G.Q5_0, "q5_1": G.Q5_1, "q4_k": G.Q4_K, "q5_k": G.Q5_K, "q6_k": G.Q6_K,
         "q2_k": G.Q2_K, "q3_k": G.Q3_K,
         "bf16": G.BF16, "q4_1": G.Q4_1, "iq4_nl": G.IQ4_NL, "iq4_xs": G.IQ4_XS, "mxfp4": G.MXFP4}


def _check(cond: bool, kernel: str, detail: str) -> None:
    if not cond:
        raise CudaError("CUDA_ERROR_INVALID_VALUE", kernel, detail)


def raw_rows(space: AddressSpace, p: np.ndarray, slot: int, t: int, kernel: str) -> np.ndarray:
    """Descriptor t[slot] of weight type t as raw rows: uint8 (ne3, ne2, ne1, row bytes); rows must be
    contiguous blocks (nb0 = the block's bytes), as ggml's quantized rows always are."""
    d = p["t"][slot]
    got = int(d["type"])
    _check(got == t, kernel, f"t[{slot}] is type {got}, the kernel reads {G(t).name}")
    ne, nb = [int(x) for x in d["ne"]], [int(x) for x in d["nb"]]
    _check(nb[0] == qunits.LAYOUT[G(t)][0] // (32 if t == G.BF16 else 1), kernel, f"t[{slot}] rows not contiguous")
    rb = row_size(t, ne[0])
    shape, strides = (ne[3], ne[2], ne[1], rb), (nb[3], nb[2], nb[1], 1)
    if 0 in shape:
        return np.zeros(shape, np.uint8)
    extent = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    buf, off = space.locate(int(d["data"]), extent)
    return np.ndarray(shape, np.uint8, buffer=buf, offset=off, strides=strides)


def glu(op: int, g: np.ndarray, u: np.ndarray, limit: float = 0.0) -> np.ndarray:
    """common.cuh glu(): 0 REGLU, 1 GEGLU (tanh approximation), 2 SWIGLU, 3 SWIGLU_OAI (upstream's fused-kernel
    constants: alpha 1.702, limit 7), 6 SWIGLU_CLAMP (`limit`), in float32."""
    g, u = g.astype(F32), u.astype(F32)
    if op == 0:
        return np.maximum(g, F32(0)) * u
    if op == 1:
        c = F32(0.7978845608028654)
        return F32(0.5) * g * (F32(1) + np.tanh(c * (g + F32(0.044715) * g * g * g))) * u
    if op == 6:
        return ops.swiglu_clamp(g, u, limit)
    if op == 3:
        return ops.swiglu_oai(g, u, 1.702, 7.0)
    return ops.swiglu(g, u)


def _product(name: str, t: int, space, p, wslot: int, xslot: int) -> np.ndarray:
    """W . x as the mat-vec kernel computes it (N <= 8): integer dots on Q8_1 x, or float32 for BF16."""
    quant = t != G.BF16
    got = int(p["t"][xslot]["type"])
    _check(got == (Q8_1 if quant else G.F32), name, f"t[{xslot}] is type {got}")
    x = view(space, p, xslot)
    _check(x.shape[2] <= MMV_MAX_N, name, f"N = {x.shape[2]} > {MMV_MAX_N} on the mat-vec path")
    raw = raw_rows(space, p, wslot, t, name)
    if quant:
        return qunits.q8_dot(raw, t, x)
    return ops.mul_mat(qunits.dequantize(raw, t), x)


def _mul_mat_vec(name: str, t: int):
    def k(space, p):
        view(space, p, 0)[...] = _product(name, t, space, p, 1, 2)
    return k


def _mul_mat_vec_add(name: str, t: int):
    def k(space, p):
        dst = view(space, p, 0)
        dst[...] = _product(name, t, space, p, 1, 2) + ops.repeat_to(ops.to_f32(view(space, p, 3)), dst.shape)
    return k


def _mul_mat_vec_glu(name: str, t: int):
    def k(space, p):
        op = int(p["ip"][0])
        _check(op in (0, 1, 2, 3, 6), name, f"glu op {op}")
        gate, up = _product(name, t, space, p, 1, 3), _product(name, t, space, p, 2, 3)
        view(space, p, 0)[...] = glu(op, gate, up, float(p["fp"][0]))
    return k


def _experts(space, p, slot: int, t: int, name: str) -> np.ndarray:
    return qunits.dequantize(raw_rows(space, p, slot, t, name), t)


def _mul_mat_id_vec(name: str, t: int):
    def k(space, p):
        out = ops.mul_mat_id(_experts(space, p, 1, t, name), view(space, p, 2), view(space, p, 3))
        bias = expert_biases(space, p, 4, glu=False)
        view(space, p, 0)[...] = out if bias is None else ops.add_id(out, bias, view(space, p, 3))
    return k


def _mul_mat_id_vec_glu(name: str, t: int):
    def k(space, p):
        x, ids = view(space, p, 3), view(space, p, 4)
        gate = ops.mul_mat_id(_experts(space, p, 1, t, name), x, ids)
        up = ops.mul_mat_id(_experts(space, p, 2, t, name), x, ids)
        bias = expert_biases(space, p, 5, glu=True)
        if bias is not None:
            gate, up = ops.add_id(gate, bias[0], ids), ops.add_id(up, bias[1], ids)
        view(space, p, 0)[...] = glu(int(p["ip"][0]), gate, up, float(p["fp"][0]))
    return k


def _mul_mat_id_gathered(name: str, t: int):
    def k(space, p):
        expert, n, first = (int(p["ip"][i]) for i in range(3))
        pairs = view(space, p, 3).reshape(-1, 2)[first: first + n]
        _check(len(pairs) == n, name, f"row map holds fewer than {first + n} pairs")
        ops.mul_mat_id_rows(view(space, p, 0), _experts(space, p, 1, t, name), view(space, p, 2), expert,
                            pairs[:, 0], pairs[:, 1])
    return k


def _get_rows(name: str, t: int):
    """As ops.get_rows over raw rows: dst[i3, i2, i1] = dequant(table[i3 % T3, i2 % T2, ids[i3, i2, i1]])."""
    def k(space, p):
        table = raw_rows(space, p, 1, t, name)
        ids = view(space, p, 2)[0].astype(np.intp)
        n3, n2, _ = ids.shape
        i3 = np.arange(n3)[:, None, None] % table.shape[0]
        i2 = np.arange(n2)[None, :, None] % table.shape[1]
        view(space, p, 0)[...] = qunits.dequantize(table[i3, i2, ids], t)
    return k


def _dequantize_f16(name: str, t: int):
    def k(space, p):
        dst = view(space, p, 0)
        _check(dst.dtype == np.float16, name, "t[0] is not F16")
        with np.errstate(over="ignore"):
            dst[...] = qunits.dequantize(raw_rows(space, p, 1, t, name), t).astype(np.float16)
    return k


def _mul_mat_bf16(space, p):
    w = qunits.dequantize(raw_rows(space, p, 1, G.BF16, "mul_mat_bf16"), G.BF16)
    view(space, p, 0)[...] = ops.mul_mat(w, view(space, p, 2))


def quant_kernels() -> dict:
    """Every X_TYPES kernel's twin, by catalogue name."""
    k = {"mul_mat_bf16": _mul_mat_bf16}
    for w in X_TYPES:
        t = XTYPE[w]
        for stem, make in (("get_rows", _get_rows), ("dequantize_f16", _dequantize_f16),
                           ("mul_mat_vec", _mul_mat_vec), ("mul_mat_vec_add", _mul_mat_vec_add),
                           ("mul_mat_vec_glu", _mul_mat_vec_glu), ("mul_mat_id_gathered", _mul_mat_id_gathered)):
            k[f"{stem}_{w}"] = make(f"{stem}_{w}", t)
    # BF16's experts read F32 x (MMF / MMVF upstream); the quantized types' MUL_MAT_ID kernels read Q8_1 x
    # (sim_moe.py)
    k["mul_mat_id_vec_bf16"] = _mul_mat_id_vec("mul_mat_id_vec_bf16", G.BF16)
    k["mul_mat_id_vec_glu_bf16"] = _mul_mat_id_vec_glu("mul_mat_id_vec_glu_bf16", G.BF16)
    return k

"""The simulated driver's MUL_MAT_ID kernels for quantized experts on Q8_1 x, and the expert-sorted map's
(kernels.py's _mmid_specs): mm_ids_helper, mul_mat_id_q_* (upstream's MMQ path, with its k-split) and
mul_mat_id_f_* (MMF above 16 tokens), and the mmvq path's mul_mat_id_vec(_glu)_* of the quantized types.

Each computes expert by expert: the pairs (token, slot) routed to an expert, their x rows against that
expert's matrix, with the mat-vec's arithmetic (integer dots on Q8_1 x: sim_kernels.q8_dot for Q8_0,
qunits.q8_dot for the other quantized types; float32 products for float experts). A map or bounds that do
not cover what a kernel reads are reported as CUDA_ERROR_INVALID_VALUE, as sim_kernels reports preconditions.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import CudaError
from ..ir.dtypes import GGMLType as G
from ..memory import AddressSpace
from . import cpu_ops as ops
from . import qunits
from .abi import Q8_1
from .kernels import MMID_F_TYPES, MMID_Q_TYPES
from .sim_quants import XTYPE, raw_rows
from .sim_quants import glu as _glu
from .sim_view import expert_biases, view

Kernel = Callable[[AddressSpace, np.ndarray], None]
Dot = Callable[[int, np.ndarray, slice], np.ndarray]     # (expert, x rows (N, ·), units) -> (N, M) float32
F32 = np.float32
_TYPE = {**XTYPE, "q8_0": G.Q8_0, "f32": G.F32, "f16": G.F16}


def _check(cond: bool, kernel: str, detail: str) -> None:
    if not cond:
        raise CudaError("CUDA_ERROR_INVALID_VALUE", kernel, detail)


def _check_type(p: np.ndarray, slot: int, want: int, kernel: str) -> None:
    got = int(p["t"][slot]["type"])
    _check(got == int(want), kernel, f"t[{slot}] is type {got}, the kernel reads type {int(want)}")


def _dot(space, p, slot: int, w: str, name: str, q8_0_dot) -> Dot:
    """The product of expert e's matrix (t[slot]) with x rows, as the kernel computes it: Q8_1 x for the
    quantized types (a range of units: a k part), F32 x for the float ones (all of K)."""
    t = _TYPE[w]
    if t == G.Q8_0:
        _check_type(p, slot, t, name)
        wv = view(space, p, slot)
        return lambda e, xs, u: q8_0_dot(wv[:, e:e + 1, :, u], xs[None, None, :, u])[0, 0]
    if t in (G.F32, G.F16):
        _check_type(p, slot, t, name)
        wv = view(space, p, slot)
        return lambda e, xs, u: ops.to_f32(xs) @ ops.to_f32(wv[0, e]).T
    raw = raw_rows(space, p, slot, t, name)
    if t == G.BF16:
        return lambda e, xs, u: ops.to_f32(xs) @ qunits.dequantize(raw[0, e], t).T
    return lambda e, xs, u: qunits.q8_dot(raw[:, e:e + 1], t, xs[None, None], units=u)[0, 0]


def _x(space, p, slot: int, quant: bool, name: str) -> np.ndarray:
    _check_type(p, slot, Q8_1 if quant else G.F32, name)
    return view(space, p, slot)                                   # (1, T, n_b, K or units)


def _rows(x: np.ndarray, tok: np.ndarray, slot: np.ndarray) -> np.ndarray:
    return x[0, tok, slot if x.shape[2] > 1 else 0]


def _by_ids(space, p, slot: int, n_expert: int, name: str):
    """(expert, tokens, slots) of the ids t[slot] (n_used, T), experts ascending."""
    _check_type(p, slot, G.I32, name)
    ids = view(space, p, slot)[0, 0]                              # (T, n_used)
    _check(bool(((ids >= 0) & (ids < n_expert)).all()), name, f"an id outside [0, {n_expert})")
    return [(int(e), *np.nonzero(ids == e)) for e in np.unique(ids)]


def _vec(name: str, w: str, q8_0_dot) -> Kernel:
    """mul_mat_id_vec_{w}: dst[t, s] = experts[ids[t, s]] . xq[t, s or 0] (ids t[3])."""
    def k(space, p):
        dot, x, dst = _dot(space, p, 1, w, name, q8_0_dot), _x(space, p, 2, True, name), view(space, p, 0)
        bias = expert_biases(space, p, 4, glu=False)           # ADD_ID fused (gpt-oss), or None
        for e, tok, slot in _by_ids(space, p, 3, int(p["t"][1]["ne"][2]), name):
            out = dot(e, _rows(x, tok, slot), slice(None))
            dst[0, tok, slot] = out if bias is None else out + bias[0, 0, e]
    return k


def _vec_glu(name: str, w: str, q8_0_dot) -> Kernel:
    """mul_mat_id_vec_glu_{w}: dst[t, s] = glu(G[ids[t, s]] . xq, U[ids[t, s]] . xq) (ids t[4])."""
    def k(space, p):
        op = int(p["ip"][0])
        _check(op in (0, 1, 2, 3, 6), name, f"glu op {op}")
        gate, up = _dot(space, p, 1, w, name, q8_0_dot), _dot(space, p, 2, w, name, q8_0_dot)
        x, dst = _x(space, p, 3, True, name), view(space, p, 0)
        bias = expert_biases(space, p, 5, glu=True)            # (gate, up) ADD_IDs fused (gpt-oss), or None
        for e, tok, slot in _by_ids(space, p, 4, int(p["t"][1]["ne"][2]), name):
            xs = _rows(x, tok, slot)
            g, u = gate(e, xs, slice(None)), up(e, xs, slice(None))
            if bias is not None:
                g, u = g + bias[0][0, 0, e], u + bias[1][0, 0, e]
            dst[0, tok, slot] = _glu(op, g, u, float(p["fp"][0]))
    return k


def _mm_ids_helper(space, p):
    """moe.cu mm_ids_helper: the pairs of expert e at bounds[e] = the count of lower ids, token by token."""
    name = "mm_ids_helper"
    for slot in (0, 1, 2):
        _check_type(p, slot, G.I32, name)
    bounds = view(space, p, 2)[0, 0, 0]                          # (E + 1,)
    n_expert = len(bounds) - 1
    ids = view(space, p, 1)[0, 0].reshape(-1)                     # flat k = t * n_used + s
    _check(bool(((ids >= 0) & (ids < n_expert)).all()), name, f"an id outside [0, {n_expert})")
    pairs = view(space, p, 0)[0, 0]                               # (P, 2): (slot, token)
    _check(len(pairs) >= len(ids), name, f"a map of {len(pairs)} pairs for {len(ids)}")
    n_used = int(p["t"][1]["ne"][0])
    order = np.argsort(ids, kind="stable")
    pairs[:len(ids), 0], pairs[:len(ids), 1] = order % n_used, order // n_used
    bounds[:] = np.searchsorted(ids[order], np.arange(n_expert + 1), side="left")


def _sorted(name: str, w: str, quant: bool, q8_0_dot, k_parts) -> Kernel:
    """mul_mat_id_q_{w} / mul_mat_id_f_{w}: expert e over its pairs [bounds[e], bounds[e + 1]) of the map
    t[4]; quantized: each k part of ip[0] (k_parts: mul_mat.cu's split) into dst (part 0) or the partials
    t[3] at i3 = part - 1."""
    def k(space, p):
        _check_type(p, 4, G.I32, name)
        _check_type(p, 5, G.I32, name)
        dot, x, dst = _dot(space, p, 1, w, name, q8_0_dot), _x(space, p, 2, quant, name), view(space, p, 0)
        pairs, bounds = view(space, p, 4).reshape(-1, 2), view(space, p, 5).reshape(-1)
        n_expert = int(p["t"][1]["ne"][2])
        _check(len(bounds) == n_expert + 1, name, f"{len(bounds)} bounds for {n_expert} experts")
        _check(0 <= bounds[0] and bool((np.diff(bounds) >= 0).all()) and bounds[-1] <= len(pairs), name,
               "bounds not an ascending cover of the map")
        parts = k_parts(p, int(p["t"][1]["ne"][0])) if quant else [(0, int(p["t"][1]["ne"][0]))]
        if len(parts) > 1:
            _check_type(p, 3, G.F32, name)
            partials = view(space, p, 3)                          # (S - 1, T, n_used, M)
            _check(partials.shape == (len(parts) - 1, *dst.shape[1:]), name,
                   f"partials {partials.shape[::-1]} do not hold {len(parts) - 1} parts of dst {dst.shape[::-1]}")
        for e in range(n_expert):
            seg = pairs[bounds[e]:bounds[e + 1]]
            if not len(seg):
                continue
            slot, tok = seg[:, 0].astype(np.intp), seg[:, 1].astype(np.intp)
            xs = _rows(x, tok, slot)
            for q, (k0, k1) in enumerate(parts):
                out = dot(e, xs, slice(k0 // 32, k1 // 32)) if k1 > k0 else np.zeros((len(seg), dst.shape[3]), F32)
                if q == 0:
                    dst[0, tok, slot] = out
                else:
                    partials[q - 1, tok, slot] = out
    return k


def build(q8_0_dot, k_parts) -> dict[str, Kernel]:
    """The kernels by catalogue name; sim_kernels passes its Q8_0 dot and its k-split (it imports this module)."""
    out: dict[str, Kernel] = {"mm_ids_helper": _mm_ids_helper}
    for w in MMID_Q_TYPES:
        out[f"mul_mat_id_vec_{w}"] = _vec(f"mul_mat_id_vec_{w}", w, q8_0_dot)
        out[f"mul_mat_id_vec_glu_{w}"] = _vec_glu(f"mul_mat_id_vec_glu_{w}", w, q8_0_dot)
        out[f"mul_mat_id_q_{w}"] = _sorted(f"mul_mat_id_q_{w}", w, True, q8_0_dot, k_parts)
    for w in MMID_F_TYPES:
        out[f"mul_mat_id_f_{w}"] = _sorted(f"mul_mat_id_f_{w}", w, False, q8_0_dot, k_parts)
    return out

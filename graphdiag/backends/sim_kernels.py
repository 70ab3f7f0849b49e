"""The simulated driver's kernels: one numpy implementation per catalogue kernel (graphdiag.backends.kernels).

Each kernel reads the descriptors of a KPARAMS record (t[0] = destination, t[1..] = sources, ip, fp), builds
strided views of the simulated device memory and writes the destination in place. The semantics are the
catalogue's, built on cpu_ops; fused kernels compose the unfused ops. Preconditions a real kernel would rely
on (weight type matching the kernel's suffix, N <= 8 on the mat-vec paths) are checked and reported as
CudaError("CUDA_ERROR_INVALID_VALUE"), so a lowering bug surfaces here rather than as garbage on the GPU.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import CudaError
from ..ir.dtypes import GGMLType
from ..ir.ops import GluOp
from ..memory import AddressSpace
from . import cpu_ops as ops
from .kernels import KERNELS, W_TYPES

Kernel = Callable[[AddressSpace, np.ndarray], None]
MMV_MAX_N = 8
_WTYPE = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0}


def view(space: AddressSpace, p: np.ndarray, slot: int) -> np.ndarray:
    """The strided view of descriptor t[slot]: shape (ne3, ne2, ne1, ne0) (Q8_0: block records)."""
    d = p["t"][slot]
    return space.ndarray(int(d["data"]), int(d["type"]), d["ne"], d["nb"])


def _fp(p: np.ndarray, i: int) -> float:
    return float(p["fp"][i])


def _ip(p: np.ndarray, i: int) -> int:
    return int(p["ip"][i])


def _check(cond: bool, kernel: str, detail: str) -> None:
    if not cond:
        raise CudaError("CUDA_ERROR_INVALID_VALUE", kernel, detail)


def _check_type(p: np.ndarray, slot: int, want: GGMLType, kernel: str) -> None:
    got = int(p["t"][slot]["type"])
    _check(got == want, kernel, f"t[{slot}] is {GGMLType(got).name}, the kernel reads {want.name}")


# -- weight-typed kernels (one per W_TYPES entry) ---------------------------------------------------------
def _get_rows(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 1, wt, name)
        view(space, p, 0)[...] = ops.get_rows(view(space, p, 1), view(space, p, 2))
    return k


def _mul_mat(name: str, wt: GGMLType, max_n: int | None) -> Kernel:
    def k(space, p):
        _check_type(p, 1, wt, name)
        x = view(space, p, 2)
        _check(max_n is None or x.shape[2] <= max_n, name, f"N = {x.shape[2]} > {max_n} on the mat-vec path")
        view(space, p, 0)[...] = ops.mul_mat(view(space, p, 1), x)
    return k


def _mul_mat_vec_glu(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 1, wt, name)
        _check_type(p, 2, wt, name)
        _check(_ip(p, 0) == GluOp.SWIGLU, name, f"glu op {_ip(p, 0)} (only SWIGLU = 2 is implemented)")
        x = view(space, p, 3)
        _check(x.shape[2] <= MMV_MAX_N, name, f"N = {x.shape[2]} > {MMV_MAX_N} on the mat-vec path")
        gate = ops.mul_mat(view(space, p, 1), x)
        up = ops.mul_mat(view(space, p, 2), x)
        view(space, p, 0)[...] = ops.swiglu(gate, up)
    return k


def _mul_mat_vec_add(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 1, wt, name)
        x = view(space, p, 2)
        _check(x.shape[2] <= MMV_MAX_N, name, f"N = {x.shape[2]} > {MMV_MAX_N} on the mat-vec path")
        view(space, p, 0)[...] = ops.mul_mat(view(space, p, 1), x) + view(space, p, 3)
    return k


def _mul_mat_id_vec(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 1, wt, name)
        view(space, p, 0)[...] = ops.mul_mat_id(view(space, p, 1), view(space, p, 2), view(space, p, 3))
    return k


def _mul_mat_id_gathered(name: str, wt: GGMLType) -> Kernel:
    """ip = (expert, n_rows, first pair); t[3] holds I32 (slot, token) pairs, read flat in ggml order."""
    def k(space, p):
        _check_type(p, 1, wt, name)
        expert, n, first = _ip(p, 0), _ip(p, 1), _ip(p, 2)
        pairs = view(space, p, 3).reshape(-1, 2)[first: first + n]
        _check(len(pairs) == n, name, f"row map holds fewer than {first + n} pairs")
        ops.mul_mat_id_rows(view(space, p, 0), view(space, p, 1), view(space, p, 2), expert,
                            pairs[:, 0], pairs[:, 1])
    return k


# -- activation kernels -----------------------------------------------------------------------------------
def _rms_norm(space, p):
    view(space, p, 0)[...] = ops.rms_norm(view(space, p, 1), _fp(p, 0))


def _rms_norm_mul(space, p):
    view(space, p, 0)[...] = ops.mul(ops.rms_norm(view(space, p, 1), _fp(p, 0)), view(space, p, 2))


def _mul(space, p):
    view(space, p, 0)[...] = ops.mul(view(space, p, 1), view(space, p, 2))


def _add(space, p):
    view(space, p, 0)[...] = ops.add(view(space, p, 1), view(space, p, 2))


def _rope_of(space, p) -> np.ndarray:
    """rope(t[1], pos t[2]) with ip = (n_dims, mode), fp = (freq_base, freq_scale)."""
    return ops.rope(view(space, p, 1), view(space, p, 2), _ip(p, 0), _fp(p, 0), _fp(p, 1), _ip(p, 1))


def _rope(space, p):
    view(space, p, 0)[...] = _rope_of(space, p)


def _set_rows(name: str, dt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 0, dt, name)
        ops.set_rows(view(space, p, 0), view(space, p, 1), view(space, p, 2))
    return k


def _rope_set_rows(space, p):
    _check_type(p, 0, GGMLType.F16, "rope_set_rows_f16")
    ops.set_rows(view(space, p, 0), _rope_of(space, p), view(space, p, 3))


def _flash_attn(space, p):
    """t[4] (mask) may be absent (data 0); t[5] (scratch) is the real kernel's workspace: not written here."""
    mask = view(space, p, 4) if int(p["t"][4]["data"]) else None
    view(space, p, 0)[...] = ops.flash_attn_ext(view(space, p, 1), view(space, p, 2), view(space, p, 3),
                                                mask, _fp(p, 0))


def _soft_max(space, p):
    view(space, p, 0)[...] = ops.soft_max(view(space, p, 1), _fp(p, 0))


def _top_k(space, p):
    view(space, p, 0)[...] = ops.top_k(view(space, p, 1), _ip(p, 0))


def _swiglu(space, p):
    view(space, p, 0)[...] = ops.swiglu(view(space, p, 1), view(space, p, 2))


def _cpy(name: str, dt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 0, dt, name)
        ops.copy(view(space, p, 0), view(space, p, 1))
    return k


def _rng_fill(name: str, wt: GGMLType) -> Kernel:
    """The numpy twin of rng.cu: the same integer hash and f32 conversion, then the same storage rounding."""
    def k(space, p):
        from ..memory import quantize_q8_0
        from .rng import draw_f32
        _check_type(p, 0, wt, name)
        seed = (int(p["ip"][0]) & 0xFFFFFFFF) | (int(p["ip"][1]) & 0xFFFFFFFF) << 32
        dst = view(space, p, 0)
        x = draw_f32(seed, int(p["ip"][2]) & 0xFFFFFFFF, int(np.prod(p["t"][0]["ne"])), p["fp"][0], p["fp"][1])
        x = x.reshape(*dst.shape[:-1], -1)
        dst[...] = quantize_q8_0(x) if wt == GGMLType.Q8_0 else x.astype(dst.dtype)
    return k


def _build() -> dict[str, Kernel]:
    k: dict[str, Kernel] = {}
    for w in W_TYPES:
        wt = _WTYPE[w]
        k[f"get_rows_{w}"] = _get_rows(f"get_rows_{w}", wt)
        k[f"mul_mat_vec_{w}"] = _mul_mat(f"mul_mat_vec_{w}", wt, MMV_MAX_N)
        k[f"mul_mat_{w}"] = _mul_mat(f"mul_mat_{w}", wt, None)
        k[f"mul_mat_vec_glu_{w}"] = _mul_mat_vec_glu(f"mul_mat_vec_glu_{w}", wt)
        k[f"mul_mat_vec_add_{w}"] = _mul_mat_vec_add(f"mul_mat_vec_add_{w}", wt)
        k[f"mul_mat_id_vec_{w}"] = _mul_mat_id_vec(f"mul_mat_id_vec_{w}", wt)
        k[f"mul_mat_id_gathered_{w}"] = _mul_mat_id_gathered(f"mul_mat_id_gathered_{w}", wt)
        k[f"rng_fill_{w}"] = _rng_fill(f"rng_fill_{w}", wt)
    k.update({
        "rms_norm_f32": _rms_norm, "rms_norm_mul_f32": _rms_norm_mul, "mul_f32": _mul, "add_f32": _add,
        "rope_f32": _rope, "set_rows_f16": _set_rows("set_rows_f16", GGMLType.F16),
        "set_rows_f32": _set_rows("set_rows_f32", GGMLType.F32), "rope_set_rows_f16": _rope_set_rows,
        "flash_attn_ext_f16": _flash_attn, "soft_max_f32": _soft_max, "top_k_f32": _top_k,
        "glu_swiglu_f32": _swiglu, "cpy_f32_f32": _cpy("cpy_f32_f32", GGMLType.F32),
        "cpy_f32_f16": _cpy("cpy_f32_f16", GGMLType.F16),
    })
    return k


SIM_KERNELS: dict[str, Kernel] = _build()
assert set(SIM_KERNELS) == set(KERNELS), sorted(set(SIM_KERNELS) ^ set(KERNELS))


def run_kernel(space: AddressSpace, name: str, params: np.ndarray) -> None:
    """Run catalogue kernel `name` on `space` with a 0-d KPARAMS record; unknown name -> CUDA_ERROR_NOT_FOUND."""
    fn = SIM_KERNELS.get(name)
    if fn is None:
        raise CudaError("CUDA_ERROR_NOT_FOUND", "run_kernel", f"no kernel named {name!r}")
    fn(space, params)

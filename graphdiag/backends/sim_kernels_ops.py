"""The simulator's twins of the Gemma 3 / Qwen kernels (kernels.py's _gemma_qwen_specs): scale, GEGLU and the
RMS_NORM fusions with ADD and with ROPE (and the K-cache write); and of 0c1e57098's RMS_NORM + SCALE fusion and
GLU SWIGLU_CLAMP (issue 29); of llama's MoE weight norm unfused (SUM_ROWS, CLAMP, DIV); of gpt-oss's ADD_ID and
GLU SWIGLU_OAI. Built on cpu_ops, composing the unfused ops in the order the fused CUDA kernels
compute them."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import CudaError
from ..ir.dtypes import GGMLType
from ..memory import AddressSpace
from . import cpu_ops as ops

Kernel = Callable[[AddressSpace, np.ndarray], None]


def build(view) -> dict[str, Kernel]:
    """The kernels, reading descriptors through sim_kernels.view (passed in: that module imports this one)."""

    def scale(space, p):
        view(space, p, 0)[...] = ops.scale(view(space, p, 1), float(p["fp"][0]), float(p["fp"][1]))

    def geglu(space, p):
        view(space, p, 0)[...] = ops.geglu(view(space, p, 1), view(space, p, 2))

    def swiglu_clamp(space, p):
        """silu(min(gate, limit)) * clamp(up, ±limit), the limit fp[0]."""
        view(space, p, 0)[...] = ops.swiglu_clamp(view(space, p, 1), view(space, p, 2), float(p["fp"][0]))

    def norm_scale(space, p):
        """rms_norm(t[1], eps fp[0]) times fp[1]: one rounded multiply, no bias (scale_f32's bytes at bias 0)."""
        view(space, p, 0)[...] = ops.rms_norm(view(space, p, 1), float(p["fp"][0])) * np.float32(p["fp"][1])

    def norm_mul(space, p) -> np.ndarray:
        """rms_norm(t[1], eps fp[0]) * t[2]."""
        return ops.mul(ops.rms_norm(view(space, p, 1), float(p["fp"][0])), view(space, p, 2))

    def norm_mul_add(space, p):
        view(space, p, 0)[...] = ops.add(norm_mul(space, p), view(space, p, 3))

    def norm_mul_rope_of(space, p) -> np.ndarray:
        """rope(rms_norm(x) * w, pos t[3]) with ip = (n_dims, mode), fp = (eps, freq_base, freq_scale)."""
        return ops.rope(norm_mul(space, p), view(space, p, 3), int(p["ip"][0]), float(p["fp"][1]),
                        float(p["fp"][2]), int(p["ip"][1]))

    def norm_mul_rope(space, p):
        view(space, p, 0)[...] = norm_mul_rope_of(space, p)

    def norm_mul_rope_set_rows(space, p):
        name = "rms_norm_mul_rope_set_rows_f16"
        if int(p["t"][0]["type"]) != GGMLType.F16:
            raise CudaError("CUDA_ERROR_INVALID_VALUE", name, "t[0] is not an F16 cache")
        ops.set_rows(view(space, p, 0), norm_mul_rope_of(space, p), view(space, p, 4))

    def sum_rows(space, p):
        view(space, p, 0)[...] = ops.sum_rows(view(space, p, 1))

    def clamp(space, p):
        view(space, p, 0)[...] = ops.clamp_cuda(view(space, p, 1), float(p["fp"][0]), float(p["fp"][1]))

    def div(space, p):
        view(space, p, 0)[...] = ops.div(view(space, p, 1), view(space, p, 2))

    def add_id(space, p):
        view(space, p, 0)[...] = ops.add_id(view(space, p, 1), view(space, p, 2), view(space, p, 3))

    def swiglu_oai(space, p):
        """The clamped SwiGLU, limit fp[0] and alpha fp[1]."""
        view(space, p, 0)[...] = ops.swiglu_oai(view(space, p, 1), view(space, p, 2), float(p["fp"][1]),
                                                float(p["fp"][0]))

    return {"sum_rows_f32": sum_rows, "clamp_f32": clamp, "div_f32": div, "add_id_f32": add_id,
            "glu_swiglu_oai_f32": swiglu_oai,
            "scale_f32": scale, "glu_geglu_f32": geglu, "glu_swiglu_clamp_f32": swiglu_clamp,
            "rms_norm_scale_f32": norm_scale, "rms_norm_mul_add_f32": norm_mul_add,
            "rms_norm_mul_rope_f32": norm_mul_rope, "rms_norm_mul_rope_set_rows_f16": norm_mul_rope_set_rows}

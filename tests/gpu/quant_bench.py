"""kernel_bench rows for the file's weight types (kernels/mmvq.cu): each decode mat-vec as the lowering
launches it (quantize_q8_1 then mul_mat_vec_{w}; BF16: the one MMVF kernel), the fused gate/up GEGLU, and
the prefill path (dequantize_f16_{w} then mul_mat_f16) — microseconds per node and GB/s of weight bytes
(the prefill's TFLOP/s). Shapes: Gemma 3 270M's (640-wide rows: 32-block types only) and 1b's."""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))   # tests/: support.quant_data as a script
from support.quant_data import random_rows  # noqa: E402

from graphdiag.ir.build import contiguous_nb  # noqa: E402
from graphdiag.ir.dtypes import GGMLType as G  # noqa: E402
from graphdiag.ir.dtypes import block_size, row_size  # noqa: E402

TYPES = {"q4_0": G.Q4_0, "q5_0": G.Q5_0, "q5_1": G.Q5_1, "q4_k": G.Q4_K, "q5_k": G.Q5_K, "q6_k": G.Q6_K,
         "q2_k": G.Q2_K, "q3_k": G.Q3_K, "bf16": G.BF16, "q4_1": G.Q4_1, "iq4_nl": G.IQ4_NL, "iq4_xs": G.IQ4_XS}
SHAPES = {"gemma270m": [(640, 1024), (640, 2048), (1024, 640), (2048, 640)],
          "1b": [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048)]}
RNG = np.random.default_rng(0)


def _weight(b, t, k, m):
    ne = (k, m, 1, 1)
    return (b.buf(random_rows(RNG, t, k, m)), int(t), ne, contiguous_nb(t, ne))


def _mmv_launches(b, w, t, W, k, m, glu_up=None):
    x, d = b.tensor(G.F32, (k, 1)), b.tensor(G.F32, (m, 1), np.zeros(m, np.float32))
    xs = x if t == G.BF16 else b.q8_1(k, 1)
    pre = [] if t == G.BF16 else [b.launch("quantize_q8_1", [xs, x])]
    if glu_up is not None:
        return pre + [b.launch(f"mul_mat_vec_glu_{w}", [d, W, glu_up, xs], ip=(1,))]
    from graphdiag.backends.geometry import mmv_warps_per_row
    return pre + [b.launch(f"mul_mat_vec_{w}", [d, W, xs], ip=(0, mmv_warps_per_row(m, k)))]


def quant_rows(b, only: str):
    for preset, ks in SHAPES.items():
        for w, t in TYPES.items():
            for k, m in ks:
                if k % block_size(t):          # the 256-blocks (K-quants, IQ4_XS) on Gemma's 640
                    continue
                wbytes = row_size(t, k) * m
                name = f"mmvq {w} {preset} K{k} M{m}"
                if only in name:
                    us = b.time_us(_mmv_launches(b, w, t, _weight(b, t, k, m), k, m))
                    yield {"row": name, "us": round(us, 2), "GB_s": round(wbytes / us / 1e3, 1)}
                    b.free()
                name = f"mmvq-geglu {w} {preset} K{k} M{m}"
                if only in name and m > k:
                    us = b.time_us(_mmv_launches(b, w, t, _weight(b, t, k, m), k, m, glu_up=_weight(b, t, k, m)))
                    yield {"row": name, "us": round(us, 2), "GB_s": round(2 * wbytes / us / 1e3, 1)}
                    b.free()
                name = f"prefill {w} {preset} K{k} M{m} N512"
                if only in name and t != G.BF16:
                    n, W = 512, _weight(b, t, k, m)
                    wf = (b.buf(nbytes=2 * k * m), int(G.F16), (k, m, 1, 1), contiguous_nb(G.F16, (k, m, 1, 1)))
                    x, d = b.tensor(G.F32, (k, n)), b.tensor(G.F32, (m, n), np.zeros((n, m), np.float32))
                    us = b.time_us([b.launch(f"dequantize_f16_{w}", [wf, W]), b.launch("mul_mat_f16", [d, wf, x])])
                    yield {"row": name, "us": round(us, 2), "TFLOP_s": round(2 * k * m * n / us / 1e6, 2)}
                    b.free()

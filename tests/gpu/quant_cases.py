"""Kernel cases for the file's weight types (kernels/mmvq.cu, mul_mat_bf16): random ggml blocks with sane
scales (random quant bytes, f16 scales in a small range), MMVQ shapes with K a multiple of 256 (the
K-quants' super-block) plus Gemma 3's 640-wide rows for the 32-blocks, rows shared by warps, 1..8 columns,
batch broadcast, the fused GLU (REGLU/GEGLU/SWIGLU) and ADD, GET_ROWS, the prefill's dequantisation, MoE (Q8_1 x
for the quantized experts, the expert-sorted map's mat-muls)."""

from __future__ import annotations

import numpy as np

from graphdiag.backends.kernels import X_TYPES
from graphdiag.backends.qunits import LAYOUT
from support.quant_data import random_rows
from graphdiag.ir.build import contiguous_nb
from graphdiag.ir.dtypes import GGMLType as G
from kernel_cases import F32_DOT, Case, Desc, expert_map

XT = {"q4_0": G.Q4_0, "q5_0": G.Q5_0, "q5_1": G.Q5_1, "q4_k": G.Q4_K, "q5_k": G.Q5_K, "q6_k": G.Q6_K,
      "q2_k": G.Q2_K, "q3_k": G.Q3_K,
      "bf16": G.BF16, "q4_1": G.Q4_1, "iq4_nl": G.IQ4_NL, "iq4_xs": G.IQ4_XS, "mxfp4": G.MXFP4}
# The MMVQ kernels' per-unit float combination (d * (dot d8 - 8 s8) ...) cancels: the compiler's fused
# multiply-adds round differently from numpy's separate float32 operations, by ulps of the unit terms.
Q_DOT = 1e-5
def qweights(c: Case, w: str, k: int, *ne) -> Desc:
    """A contiguous weight (k, *ne) of X type w."""
    t = XT[w]
    n = int(np.prod(ne)) if ne else 1
    c.bufs.append(random_rows(c.rng, t, k, n).reshape(-1))
    ne4 = (k, *ne) + (1,) * (3 - len(ne))
    return Desc(len(c.bufs) - 1, 0, int(t), ne4, contiguous_nb(t, ne4))


def _x(c: Case, w: str, k: int, *cols) -> Desc:
    return c.randn(G.F32, k, *cols) if w == "bf16" else c.q8_1(k, *cols)


def _bound(w: str) -> float:
    return F32_DOT if w == "bf16" else Q_DOT


def _mat_vec(w: str) -> list[Case]:
    out = []
    shapes = [(512, 77, 1, 1), (2048, 64, 1, 2), (1024, 40, 1, 4), (256, 33, 3, 1), (768, 20, 8, 1), (4096, 9, 1, 4)]
    if LAYOUT[XT[w]][1] == 1:
        shapes.append((640, 50, 1, 1))           # Gemma 3 270M's rows: no multiple of 256
    for k, m, n, parts in shapes:
        c = Case(f"mul_mat_vec_{w}", f"K{k}-M{m}-N{n}-{parts}-warps-per-row", _bound(w))
        out.append(c.set(c.output(G.F32, m, n), qweights(c, w, k, m), _x(c, w, k, n), ip=(0, parts)))
    c = Case(f"mul_mat_vec_{w}", "batch-broadcast", _bound(w))   # W (K, M, 1) over x (K, N, 2)
    out.append(c.set(c.output(G.F32, 30, 2, 2), qweights(c, w, 256, 30), _x(c, w, 256, 2, 2)))
    for k, m, n, parts in ((512, 77, 1, 1), (2048, 64, 1, 2), (256, 40, 3, 1)):
        c = Case(f"mul_mat_vec_add_{w}", f"K{k}-M{m}-N{n}-{parts}-warps-per-row", _bound(w))
        out.append(c.set(c.output(G.F32, m, n), qweights(c, w, k, m), _x(c, w, k, n), c.randn(G.F32, m, n),
                         ip=(0, parts)))
    for k, m, n, op in ((512, 77, 1, 2), (256, 40, 2, 1), (1024, 30, 1, 0), (768, 64, 1, 1), (512, 48, 2, 6)):
        # op 6: SWIGLU_CLAMP, limit 7: the clamp caps max|ref| (the error's measure) below the dots whose
        # rounding it carries, so 4x the bound (BF16 K512-M48-N2: 3.0e-6 on the H100 2026-12-07)
        c = Case(f"mul_mat_vec_glu_{w}", f"K{k}-M{m}-N{n}-op{op}", _bound(w) * (4 if op == 6 else 1))
        out.append(c.set(c.output(G.F32, m, n), qweights(c, w, k, m), qweights(c, w, k, m), _x(c, w, k, n), ip=(op,),
                         fp=(7.0,) if op == 6 else ()))
    return out


def _rows(w: str) -> list[Case]:
    out = []
    c = Case(f"get_rows_{w}", "2d-ids", 0.0)
    out.append(c.set(c.output(G.F32, 512, 3, 2), qweights(c, w, 512, 20), c.ints([[3, 0, 19], [7, 7, 1]])))
    c = Case(f"get_rows_{w}", "wide-row", 0.0)
    out.append(c.set(c.output(G.F32, 4096, 1), qweights(c, w, 4096, 5), c.ints([4])))
    c = Case(f"dequantize_f16_{w}", "K512-M40", 0.0)
    out.append(c.set(c.output(G.F16, 512, 40), qweights(c, w, 512, 40)))
    c = Case(f"dequantize_f16_{w}", "batched-K256-M8-B3", 0.0)
    out.append(c.set(c.output(G.F16, 256, 8, 3), qweights(c, w, 256, 8, 3)))
    return out


def _moe(w: str) -> list[Case]:
    out = []
    e, k, m, n_used, t = 4, 256, 100, 2, 3
    tg = 1 if w == "bf16" else t              # the fused gate/up: quantized up to 8 tokens (mmvq), BF16 at one
    for n_b in (1, n_used):
        c = Case(f"mul_mat_id_vec_{w}", f"E{e}-nb{n_b}", _bound(w))
        ids = c.ints(c.rng.permutation(e * t)[: n_used * t] % e, (n_used, t))
        out.append(c.set(c.output(G.F32, m, n_used, t), qweights(c, w, k, m, e), _x(c, w, k, n_b, t), ids))
        c = Case(f"mul_mat_id_vec_glu_{w}", f"E{e}-nb{n_b}-T{tg}", _bound(w))
        ids = c.ints(np.stack([c.rng.permutation(e)[:n_used] for _ in range(tg)]), (n_used, tg))
        out.append(c.set(c.output(G.F32, m, n_used, tg), qweights(c, w, k, m, e), qweights(c, w, k, m, e),
                         _x(c, w, k, n_b, tg), ids, ip=(1,)))
    out += _sorted_moe(w)
    c = Case(f"mul_mat_id_gathered_{w}", "rows-1..4", F32_DOT)
    pairs = c.ints([[0, 0], [1, 0], [0, 1], [1, 2], [0, 2], [1, 1]], (2, 6))
    out.append(c.set(c.output(G.F32, m, n_used, t), qweights(c, w, k, m, e), c.randn(G.F32, k, n_used, t),
                     pairs, ip=(2, 3, 1)))
    return out


def _sorted_moe(w: str) -> list[Case]:
    """The mat-mul over mm_ids_helper's map: mul_mat_id_q_{w} on Q8_1 x, whole and in 3 k parts (dst: part 0,
    the partials: the rest), mul_mat_id_f_bf16 on F32 x; 12 tokens of 2 of 6 experts (one without a pair)."""
    e, k, m, n_used, t = 6, 768, 40, 2, 12
    name, splits = (f"mul_mat_id_f_{w}", ((0, 0),)) if w == "bf16" else (f"mul_mat_id_q_{w}", ((0, 0), (3, 0), (3, 3)))
    out = []
    for n_b in (1, n_used):
        for parts, slot in splits:
            c = Case(name, f"E{e}-nb{n_b}-T{t}-parts{parts}-{'partials' if slot else 'dst'}", _bound(w))
            ids = np.stack([c.rng.permutation(e - 1)[:n_used] for _ in range(t)])
            pairs, bounds = expert_map(c, ids, e)
            partials = c.output(G.F32, m, n_used, t, 2) if parts else None
            out.append(c.set(c.output(G.F32, m, n_used, t), qweights(c, w, k, m, e), _x(c, w, k, n_b, t), partials,
                             pairs, bounds, ip=(parts,)))
            out[-1].out = slot
    return out


def quant_cases() -> list[Case]:
    out = []
    for w in X_TYPES:
        out += _mat_vec(w) + _rows(w) + _moe(w)
    for k, m, n, b in ((96, 50, 20, 1), (512, 33, 70, 1), (256, 40, 17, 2)):
        c = Case("mul_mat_bf16", f"K{k}-M{m}-N{n}-B{b}", F32_DOT)
        out.append(c.set(c.output(G.F32, m, n, b), qweights(c, "bf16", k, m), c.randn(G.F32, k, n, b)))
    return out

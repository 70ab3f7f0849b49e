"""The simulated driver's kernels: one numpy implementation per catalogue kernel (graphdiag.backends.kernels).

Each kernel reads the descriptors of a KPARAMS record (t[0] = destination, t[1..] = sources, ip, fp), builds
strided views of the simulated device memory and writes the destination in place. The semantics are the
catalogue's, built on cpu_ops; fused kernels compose the unfused ops. Where the GPU kernel rounds on
purpose (Q8_1 activations and integer dots for Q8_0 weights, F16 x on the tensor-core F16 mat-mul, the
split-KV attention partials), the twin does the same, so results agree to float rounding. Preconditions a real kernel would rely
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
from . import sim_kernels_ops, sim_moe
from .abi import Q8_1
from .geometry import FAM_KV
from .sim_quants import quant_kernels
from .sim_view import Q8_1_BLOCK, expert_biases, view   # noqa: F401  (view re-exported: the kernels' descriptor view)
from .kernels import (FA_HEAD_DIMS, FAV_GROUPS, KERNELS, W_TYPES, fa_direct_kernel, fa_mma_kernel, fa_vec_kernel,
                      fav_groups)

Kernel = Callable[[AddressSpace, np.ndarray], None]
MMV_MAX_N = 8
_WTYPE = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0}
F32 = np.float32

# Q8_1 (abi.Q8_1): the activations the Q8_0 kernels read, written by quantize_q8_1 into pool scratch.
_DOT_CHUNK = 1 << 23   # elements of the (blocks, columns, rows) integer-dot temporary per pass
# elements of W's quants widened to float32 per pass (32 MB): a matrix up to this size in one pass, a larger
# one (Gemma 3 270M's 262 144-row embedding, 0.67 GB widened) a block of rows at a time. The sums are the same
# formula; numpy may add a row's blocks in another order for another number of rows (float32's last bits)
_WIDEN_MAX = 1 << 23


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """(..., K) float32 -> (..., K / 32) Q8_1 records, byte for byte as quantize.cu: d = max|x| / 127,
    q = rint(x / d) (round half to even, 0 when d == 0), s = d * sum(q), both stored as f16."""
    b = np.asarray(x, F32).reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = np.abs(b).max(axis=-1)
    d = amax / F32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax[..., None] != 0, np.rint(b / d[..., None]), F32(0))
    out = np.empty(b.shape[:-1], Q8_1_BLOCK)
    out["qs"] = q.astype(np.int8)
    out["d"] = d.astype(np.float16)
    out["s"] = (d * q.sum(axis=-1, dtype=F32)).astype(np.float16)
    return out


def q8_dot(w: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """dst[b3, b2, n, m] = sum_b d_w[m, b] * d_x[n, b] * sum_i q_w[m, b, i] * q_x[n, b, i] (float32; the
    integer sums are exact: float32 holds every partial sum of 32 int8 products).

    w: (W3, W2, M, nb) Q8_0 records, broadcast over x's batch dims by division; xq: (B3, B2, N, nb) Q8_1."""
    b3n, b2n, n, nb = xq.shape
    m = w.shape[2]
    out = np.zeros((b3n, b2n, n, m), F32)
    m_step = max(1, _WIDEN_MAX // max(nb * 32, 1))   # rows of W widened to float32 per pass
    for b3 in range(b3n):
        for b2 in range(b2n):
            wb = w[b3 // (b3n // w.shape[0]), b2 // (b2n // w.shape[1])]
            xb = xq[b3, b2]
            for m0 in range(0, m, m_step):
                wc = wb[m0:m0 + m_step]
                qw, dw = wc["qs"].astype(F32).transpose(1, 2, 0), wc["d"].astype(F32).T   # (nb, 32, Mc), (nb, Mc)
                step = max(1, _DOT_CHUNK // max(nb * len(wc), 1))
                for n0 in range(0, n, step):
                    qx = xb["qs"][n0:n0 + step].astype(F32).transpose(1, 0, 2)         # (nb, Nc, 32)
                    dx = xb["d"][n0:n0 + step].astype(F32).T                          # (nb, Nc)
                    sums = np.matmul(qx, qw)                                          # (nb, Nc, Mc), exact
                    out[b3, b2, n0:n0 + step, m0:m0 + len(wc)] = \
                        ((dx[:, :, None] * dw[:, None, :]) * sums).sum(axis=0, dtype=F32)
    return out


def _fp(p: np.ndarray, i: int) -> float:
    return float(p["fp"][i])


def _ip(p: np.ndarray, i: int) -> int:
    return int(p["ip"][i])


def _check(cond: bool, kernel: str, detail: str) -> None:
    if not cond:
        raise CudaError("CUDA_ERROR_INVALID_VALUE", kernel, detail)


def _check_glu(p: np.ndarray, kernel: str) -> None:
    _check(_ip(p, 0) in (GluOp.GEGLU, GluOp.SWIGLU, GluOp.SWIGLU_OAI, GluOp.SWIGLU_CLAMP), kernel,
           f"glu op {_ip(p, 0)} (GEGLU = 1, SWIGLU = 2, SWIGLU_OAI = 3 and SWIGLU_CLAMP = 6 are implemented)")


def _type_name(t: int) -> str:
    return "Q8_1" if t == Q8_1 else GGMLType(t).name if t in GGMLType._value2member_map_ else f"type {t}"


def _check_type(p: np.ndarray, slot: int, want: int, kernel: str) -> None:
    got = int(p["t"][slot]["type"])
    _check(got == want, kernel, f"t[{slot}] is {_type_name(got)}, the kernel reads {_type_name(int(want))}")


# -- weight-typed kernels (one per W_TYPES entry) ---------------------------------------------------------
def _get_rows(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 1, wt, name)
        view(space, p, 0)[...] = ops.get_rows(view(space, p, 1), view(space, p, 2))
    return k


def _product(name: str, wt: GGMLType, space, p, wslot: int, xslot: int, max_n: int | None,
             tensor_cores: bool = False) -> np.ndarray:
    """W (t[wslot]) . x (t[xslot]) as the kernel computes it: Q8_0 weights read Q8_1 x (integer dots); the
    F16 tensor-core kernel rounds x to F16; otherwise float32 products of the stored values."""
    _check_type(p, wslot, wt, name)
    _check_type(p, xslot, Q8_1 if wt == GGMLType.Q8_0 else GGMLType.F32, name)
    x = view(space, p, xslot)
    _check(max_n is None or x.shape[2] <= max_n, name, f"N = {x.shape[2]} > {max_n} on the mat-vec path")
    w = view(space, p, wslot)
    if wt == GGMLType.Q8_0:
        return q8_dot(w, x)
    if tensor_cores:
        with np.errstate(over="ignore"):
            x = x.astype(np.float16)
    return ops.mul_mat(w, x)


def _mul_mat(name: str, wt: GGMLType, max_n: int | None) -> Kernel:
    tc = max_n is None and wt == GGMLType.F16
    if max_n is None and wt in (GGMLType.F16, GGMLType.Q8_0, GGMLType.F32):
        return _mul_mat_split(name, wt)
    def k(space, p):
        view(space, p, 0)[...] = _product(name, wt, space, p, 1, 2, max_n, tc)
    return k


def k_parts(p: np.ndarray, k: int) -> list[tuple[int, int]]:
    """mul_mat.cu's k-split: each part's k range [k0, k1) (one part, all of K, when ip[0] <= 1)."""
    s, u = max(_ip(p, 0), 1), -(-k // 64)
    return [(min(k, 64 * (q * u // s)), min(k, 64 * ((q + 1) * u // s))) for q in range(s)]


def _mul_mat_split(name: str, wt: GGMLType) -> Kernel:
    """mul_mat_f16 / mul_mat_q8_0 / mul_mat_f32 with their k-split: part 0's sum into dst, part q's into t[3]
    at batch i3 + (q - 1) * B3 (mul_mat_fixup_f32 adds them in)."""
    q8, f16 = wt == GGMLType.Q8_0, wt == GGMLType.F16
    def k(space, p):
        _check_type(p, 1, wt, name)
        if not (f16 and int(p["t"][2]["type"]) == GGMLType.F16):      # mul_mat_f16 reads F16 x as it is
            _check_type(p, 2, Q8_1 if q8 else GGMLType.F32, name)
        w, x, dst = view(space, p, 1), view(space, p, 2), view(space, p, 0)
        parts = k_parts(p, int(p["t"][1]["ne"][0]))
        if len(parts) > 1:
            _check_type(p, 3, GGMLType.F32, name)
            partials, b3 = view(space, p, 3), dst.shape[0]
            _check(partials.shape[0] == b3 * (len(parts) - 1) and partials.shape[1:] == dst.shape[1:], name,
                   f"partials {partials.shape[::-1]} do not hold {len(parts) - 1} parts of dst {dst.shape[::-1]}")
        if f16:
            with np.errstate(over="ignore"):
                x = x.astype(np.float16)
        for q, (k0, k1) in enumerate(parts):
            if k1 <= k0:
                out = np.zeros(dst.shape, F32)
            elif q8:
                out = q8_dot(w[..., k0 // 32:k1 // 32], x[..., k0 // 32:k1 // 32])
            else:
                out = ops.mul_mat(w[..., k0:k1], x[..., k0:k1])
            if q == 0:
                dst[...] = out
            else:
                partials[(q - 1) * b3:q * b3] = out
    return k


def _moe_weighted_reduction(space, p):
    """kernels/moe.cu: sum over the used experts of (experts * scale) * weights, in expert order."""
    name = "moe_weighted_reduction_f32"
    for slot in (0, 1, 2):
        _check_type(p, slot, GGMLType.F32, name)
    e, w = view(space, p, 1), view(space, p, 2)              # (B3, T, k, n_embd), (B3, T, k, 1)
    s = view(space, p, 3) if int(p["t"][3]["data"]) else None
    dst = view(space, p, 0)                                  # (1, 1, T, n_embd)
    _check(w.shape[:3] == e.shape[:3] and w.shape[3] == 1 and dst.size == e.size // e.shape[2], name,
           f"experts {e.shape[::-1]}, weights {w.shape[::-1]}, dst {dst.shape[::-1]}")
    e, w = e.reshape(-1, e.shape[2], e.shape[3]), w.reshape(-1, w.shape[2], 1)
    s = None if s is None else s.reshape(w.shape)
    acc = None
    for x in range(e.shape[1]):
        term = (e[:, x] * (s[:, x] if s is not None else F32(1))) * w[:, x]
        acc = term if acc is None else acc + term
    dst[...] = acc.reshape(dst.shape)


def _topk_moe(space, p):
    """kernels/moe.cu topk_moe_f32: per token, p = exp(x - max) * (1 / sum), a NaN p (a NaN or infinite logit)
    -FLT_MAX as upstream's; the k largest p (ties: the lower expert) as ids in descending order and
    p[ids] * fp[0] as the weights: what SOFT_MAX, ARGSORT, its VIEW and the GET_ROWS [and SCALE] compute
    unfused, to the last bit of the softmax's division. With ip[1] (the weight norm fused) each weight is
    (p[id] * (1 / max(s, fp[1]))) * fp[0], s the kept p summed as the kernel sums them: each lane (expert % 32)
    adds its experts' in round order, then the warp's butterfly sum (offsets 16 .. 1)."""
    name = "topk_moe_f32"
    _check_type(p, 2, GGMLType.F32, name)
    logits = view(space, p, 2).astype(F32)                     # (B3, B2, T, n_expert)
    k = _ip(p, 0)
    if _ip(p, 2):
        _topk_moe_delayed(space, p, logits, k)
        return
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mx = np.fmax.reduce(logits, axis=-1, keepdims=True)    # fmaxf: a NaN is passed over
        e = np.exp(logits - mx)
        probs = e * (F32(1) / e.sum(axis=-1, keepdims=True, dtype=F32))
    probs = np.where(np.isnan(probs), F32(-3.402823466e38), probs).astype(F32)   # upstream's NaN -> -FLT_MAX
    ids = ops.argsort(probs, True)[..., :k]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if _ip(p, 1):
        flat_ids, flat_w = ids.reshape(-1, k), weights.reshape(-1, k)
        lanes = np.zeros((flat_w.shape[0], 32), F32)
        rows = np.arange(flat_w.shape[0])
        with np.errstate(over="ignore", invalid="ignore"):
            for r in range(k):                                  # each lane's share, in round order
                lanes[rows, flat_ids[:, r] & 31] += flat_w[:, r]
            for off in (16, 8, 4, 2, 1):                        # warp_sum: lane l adds lane l ^ off
                lanes = lanes + lanes[:, np.arange(32) ^ off]
            norm = F32(1) / np.fmax(lanes[:, 0], F32(_fp(p, 1)))
            weights = (flat_w * norm[:, None]).reshape(weights.shape)    # -FLT_MAX rows overflow to -inf
    weights = weights * F32(_fp(p, 0))
    view(space, p, 1)[...] = ids.reshape(view(space, p, 1).shape)
    view(space, p, 0)[...] = weights.reshape(view(space, p, 0).shape)


def _warp_sum(lanes: np.ndarray) -> np.ndarray:
    """kernels' warp_sum over (rows, 32) lane values: lane l adds lane l ^ off, off 16 .. 1; lane 0's sum."""
    for off in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[:, np.arange(32) ^ off]
    return lanes[:, 0]


def _topk_moe_delayed(space, p, logits: np.ndarray, k: int) -> None:
    """topk_moe_f32 with ip[2] (gpt-oss's router): the k largest logits (a NaN -FLT_MAX; ties: the lower
    expert) as ids, then their softmax as the weights: e = exp(v - max), each lane's e (slot r at lane r % 32)
    summed by the warp's butterfly, e * (1 / sum), times fp[0]."""
    v = np.where(np.isnan(logits), F32(-3.402823466e38), logits).astype(F32)
    ids = ops.argsort(v, True)[..., :k]
    kept = np.take_along_axis(v, ids, axis=-1).reshape(-1, k)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(kept - kept.max(axis=-1, keepdims=True))
        lanes = np.zeros((e.shape[0], 32), F32)
        for r in range(k):
            lanes[:, r & 31] += e[:, r]
        w = e * (F32(1) / _warp_sum(lanes))[:, None] * F32(_fp(p, 0))
    view(space, p, 1)[...] = ids.reshape(view(space, p, 1).shape)
    view(space, p, 0)[...] = w.reshape(view(space, p, 0).shape)


def _mul_mat_fixup(space, p):
    dst, partials = view(space, p, 0), view(space, p, 1)
    b3, n = dst.shape[0], _ip(p, 0)
    _check(partials.shape[0] == b3 * n and partials.shape[1:] == dst.shape[1:], "mul_mat_fixup_f32",
           f"partials {partials.shape[::-1]} do not hold {n} parts of dst {dst.shape[::-1]}")
    acc = dst.astype(F32)
    for q in range(n):
        acc += partials[q * b3:(q + 1) * b3]
    dst[...] = acc


def _mul_mat_vec_glu(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 2, wt, name)
        _check_glu(p, name)
        gate = _product(name, wt, space, p, 1, 3, MMV_MAX_N)
        up = _product(name, wt, space, p, 2, 3, MMV_MAX_N)
        view(space, p, 0)[...] = ops.fused_glu(_ip(p, 0), gate, up, _fp(p, 0))
    return k


def _mul_mat_vec_add(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        dst = view(space, p, 0)
        prod = _product(name, wt, space, p, 1, 2, MMV_MAX_N)
        dst[...] = prod + ops.repeat_to(ops.to_f32(view(space, p, 3)), dst.shape)
    return k


def _quantize_q8_1(space, p):
    _check_type(p, 0, Q8_1, "quantize_q8_1")
    view(space, p, 0)[...] = quantize_q8_1(ops.to_f32(view(space, p, 1)))


def _mul_mat_id_vec_glu(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 1, wt, name)
        _check_type(p, 2, wt, name)
        _check_glu(p, name)
        x, ids = view(space, p, 3), view(space, p, 4)
        gate = ops.mul_mat_id(view(space, p, 1), x, ids)
        up = ops.mul_mat_id(view(space, p, 2), x, ids)
        bias = expert_biases(space, p, 5, glu=True)
        if bias is not None:                    # ADD_IDs fused (gpt-oss): each expert's bias row, then the GLU
            gate, up = ops.add_id(gate, bias[0], ids), ops.add_id(up, bias[1], ids)
        view(space, p, 0)[...] = ops.fused_glu(_ip(p, 0), gate, up, _fp(p, 0))
    return k


def _mul_mat_id_vec(name: str, wt: GGMLType) -> Kernel:
    def k(space, p):
        _check_type(p, 1, wt, name)
        out = ops.mul_mat_id(view(space, p, 1), view(space, p, 2), view(space, p, 3))
        bias = expert_biases(space, p, 4, glu=False)
        view(space, p, 0)[...] = out if bias is None else ops.add_id(out, bias, view(space, p, 3))
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
    """rope(t[1], pos t[2]) with ip = (n_dims, mode), fp = (freq_base, freq_scale[, ext_factor, attn_factor,
    corr_dim0, corr_dim1]: YaRN where attn_factor is set)."""
    yarn = (_fp(p, 2), _fp(p, 3), _fp(p, 4), _fp(p, 5)) if _fp(p, 3) != 0.0 else None
    return ops.rope(view(space, p, 1), view(space, p, 2), _ip(p, 0), _fp(p, 0), _fp(p, 1), _ip(p, 1), yarn)


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


def _fa_split_scores(space, p, name: str, q16: bool = False, direct: bool = False):
    """(scores (B, H, T, S, chunk), V per head (B, H, S, chunk, Dv), partials view, Dv) of a split-KV
    partial kernel: x_j = scale * q . k_j + mask, positions past n_kv padded with -inf scores and zero V;
    q rounded to F16 first when `q16`. t[4] (mask, F32 or F16) may be absent (data 0). `direct`: one split,
    t[0] the node itself (returned as the view)."""
    part = view(space, p, 0)                                   # (T * B, H, n_split, Dv + 2); direct: (B, T, H, Dv)
    q, k, v = (ops.to_f32(view(space, p, i)) for i in (1, 2, 3))
    if q16:
        q = q.astype(np.float16).astype(F32)
    b_, t_, h, _ = q.shape
    n_kv, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    n_split, chunk = (1 if direct else part.shape[2]), _ip(p, 0)
    _check((direct or part.shape[3] == dv + 2) and n_split * chunk >= n_kv, name, "partials shape")
    s = np.matmul(q.transpose(0, 2, 1, 3), np.repeat(k.transpose(0, 2, 3, 1), h // hkv, axis=1)) * F32(_fp(p, 0))
    if int(p["t"][4]["data"]):
        mask = ops.to_f32(view(space, p, 4))[:, :, :t_, :]
        s = s + ops.repeat_to(mask, (b_, h, t_, n_kv))
    pad = n_split * chunk - n_kv
    s = np.concatenate([s, np.full((b_, h, t_, pad), -np.inf, F32)], axis=-1).reshape(b_, h, t_, n_split, chunk)
    vh = np.repeat(v.transpose(0, 2, 1, 3), h // hkv, axis=1)  # (B, H, n_kv, Dv)
    vh = np.concatenate([vh, np.zeros((b_, h, pad, dv), F32)], axis=2).reshape(b_, h, n_split, chunk, dv)
    return s, vh, part, dv


def _fa_store(part, o, m, l, dv: int) -> None:
    """Partials (O (B, H, S, T, Dv), m and l (B, H, T, S)) into the (T * B, H, n_split, Dv + 2) scratch."""
    b_, h, n_split, t_, _ = o.shape
    out = np.empty((b_, t_, h, n_split, dv + 2), F32)
    out[..., :dv] = o.transpose(0, 3, 1, 2, 4)
    out[..., dv] = m.transpose(0, 2, 1, 3)
    out[..., dv + 1] = l.transpose(0, 2, 1, 3)
    part[...] = out.reshape(b_ * t_, h, n_split, dv + 2)


def _flash_attn_partial(space, p, name: str = "flash attention"):
    """The exact split-KV partials (the decode kernels): per split of ip[0] positions,
    (sum_j p_j v_j, m, sum_j p_j) with p_j = exp(x_j - m), m the split's max."""
    s, vh, part, dv = _fa_split_scores(space, p, name)
    m, e = _fa_exp(s)
    _fa_store(part, np.matmul(e.transpose(0, 1, 3, 2, 4), vh), m, e.sum(axis=-1, dtype=F32), dv)


def _fa_exp(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m, p) of split scores s (B, H, T, S, chunk): each split's max (-inf: nothing visible) and
    p = exp(s - m) (0 where masked or where nothing is visible)."""
    m = s.max(axis=-1)
    return m, np.exp(s - np.where(np.isfinite(m), m, F32(0))[..., None])


def _flash_attn_mma(d: int) -> Kernel:
    """The tensor-core partials (flash_attn.cu fa_mma): q rounded to F16; per split, tiles of FAM_KV positions
    from the split's start with an online softmax, each tile's p = exp(x - m_running) rounded to F16 before
    p . v (F32 sums), l summing the unrounded p; the same (O, m, l) layout as the decode kernels."""
    name = fa_mma_kernel(d)

    def k(space, p):
        _check(int(p["t"][1]["ne"][0]) == d, name, f"q head size {int(p['t'][1]['ne'][0])}")
        s, vh, part, dv = _fa_split_scores(space, p, name, q16=True)
        b_, h, t_, n_split, chunk = s.shape
        m = np.full((b_, h, t_, n_split), -np.inf, F32)
        l = np.zeros_like(m)
        o = np.zeros((b_, h, n_split, t_, dv), F32)
        with np.errstate(invalid="ignore"):
            for c in range(0, chunk, FAM_KV):
                st = s[..., c:c + FAM_KV]
                mn = np.maximum(m, st.max(axis=-1))
                alpha = np.where(np.isneginf(mn), F32(1), np.where(np.isneginf(m), F32(0), np.exp(m - mn)))
                e = np.where(np.isneginf(st), F32(0), np.exp(st - np.where(np.isneginf(mn), F32(0), mn)[..., None]))
                l = l * alpha + e.sum(axis=-1, dtype=F32)
                e16 = e.astype(np.float16).astype(F32).transpose(0, 1, 3, 2, 4)   # (B, H, S, T, tile)
                o = o * alpha.transpose(0, 1, 3, 2)[..., None] + np.matmul(e16, vh[:, :, :, c:c + FAM_KV])
                m = mn
        _fa_store(part, o, m, l, dv)
    return k


def _flash_attn_vec(d: int, gm: int) -> Kernel:
    name = fa_vec_kernel(d, gm)

    def k(space, p):
        q, kc = p["t"][1]["ne"], p["t"][2]["ne"]
        _check(int(q[0]) == d and fav_groups(int(q[1]) // max(int(kc[1]), 1)) == gm,
               name, f"q head size {int(q[0])}, {int(q[1])}/{int(kc[1])} heads")
        if _ip(p, 2):
            _flash_attn_direct(space, p, name)
        else:
            _flash_attn_partial(space, p)
    return k


def _flash_attn_vec_direct(d: int) -> Kernel:
    """flash_attn_vec_direct_f16_d{d}: one block per query head, normalised into the node (the math of the vec
    kernels' ip[2] branch; the blocks only split the heads)."""
    name = fa_direct_kernel(d)

    def k(space, p):
        _check(int(p["t"][1]["ne"][0]) == d, name, f"q head size {int(p['t'][1]['ne'][0])}")
        _check_type(p, 0, GGMLType.F32, name)   # the kernel writes O and reads Q as F32
        _check_type(p, 1, GGMLType.F32, name)
        _flash_attn_direct(space, p, name)
    return k


def _flash_attn_direct(space, p, name: str) -> None:
    """The vec kernel with ip[2] set: one split, normalised into the node (the combine of one split)."""
    s, vh, dst, dv = _fa_split_scores(space, p, name, direct=True)
    _, e = _fa_exp(s)                                          # one split: (B, H, T, 1, chunk)
    o = np.matmul(e.transpose(0, 1, 3, 2, 4), vh)[:, :, 0]     # (B, H, T, Dv)
    den = e.sum(axis=-1, dtype=F32)[..., 0][..., None]         # (B, H, T, 1)
    res = np.divide(o, den, out=np.zeros_like(o), where=den > 0)
    dst[...] = res.transpose(0, 2, 1, 3).reshape(dst.shape)


def _flash_attn_combine(space, p):
    dst = view(space, p, 0)                                    # (B, T, H, Dv)
    part = view(space, p, 1)                                   # (T * B, H, n_split, Dv + 2)
    dv = part.shape[3] - 2
    o, m, l = part[..., :dv], part[..., dv], part[..., dv + 1]
    mx = m.max(axis=2)
    with np.errstate(invalid="ignore"):
        w = np.where(np.isfinite(m), np.exp(m - np.where(np.isfinite(mx), mx, F32(0))[..., None]), F32(0))
    den = (l * w).sum(axis=2, dtype=F32)
    acc = (o * w[..., None]).sum(axis=2, dtype=F32)
    if int(p["t"][2]["data"]):                    # the heads' sinks: in the denominator only
        sk = view(space, p, 2).reshape(-1)[None, :]                  # (1, H) against (T * B, H)
        mn = np.maximum(mx, sk)
        with np.errstate(invalid="ignore"):
            rs = np.where(np.isneginf(mx), F32(0), np.exp(mx - mn))
        acc = acc * rs[..., None]
        den = den * rs + np.exp(sk - mn)
    res = np.divide(acc, den[..., None], out=np.zeros_like(acc), where=den[..., None] > 0)
    dst[...] = res.reshape(dst.shape)


def _soft_max(space, p):
    view(space, p, 0)[...] = ops.soft_max(view(space, p, 1), _fp(p, 0))


def _top_k(space, p):
    view(space, p, 0)[...] = ops.top_k(view(space, p, 1), _ip(p, 0))


def _argsort_desc(space, p):
    view(space, p, 0)[...] = ops.argsort(view(space, p, 1), True)


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
        if wt != GGMLType.Q8_0:    # Q8_0's read Q8_1 x (sim_moe.py)
            k[f"mul_mat_id_vec_{w}"] = _mul_mat_id_vec(f"mul_mat_id_vec_{w}", wt)
            k[f"mul_mat_id_vec_glu_{w}"] = _mul_mat_id_vec_glu(f"mul_mat_id_vec_glu_{w}", wt)
        k[f"mul_mat_id_gathered_{w}"] = _mul_mat_id_gathered(f"mul_mat_id_gathered_{w}", wt)
        k[f"rng_fill_{w}"] = _rng_fill(f"rng_fill_{w}", wt)
    k.update({
        "rms_norm_f32": _rms_norm, "rms_norm_mul_f32": _rms_norm_mul, "mul_f32": _mul, "add_f32": _add,
        "rope_f32": _rope, "set_rows_f16": _set_rows("set_rows_f16", GGMLType.F16),
        "set_rows_f32": _set_rows("set_rows_f32", GGMLType.F32), "rope_set_rows_f16": _rope_set_rows,
        **{fa_vec_kernel(d, gm): _flash_attn_vec(d, gm) for d in FA_HEAD_DIMS for gm in FAV_GROUPS},
        **{fa_direct_kernel(d): _flash_attn_vec_direct(d) for d in FA_HEAD_DIMS},
        **{fa_mma_kernel(d): _flash_attn_mma(d) for d in FA_HEAD_DIMS},
        "flash_attn_combine_f32": _flash_attn_combine,
        "quantize_q8_1": _quantize_q8_1, "mul_mat_fixup_f32": _mul_mat_fixup,
        "moe_weighted_reduction_f32": _moe_weighted_reduction, "topk_moe_f32": _topk_moe, "soft_max_f32": _soft_max, "top_k_f32": _top_k,
        "argsort_f32_i32_desc": _argsort_desc,
        "glu_swiglu_f32": _swiglu, "cpy_f32_f32": _cpy("cpy_f32_f32", GGMLType.F32),
        "cpy_f32_f16": _cpy("cpy_f32_f16", GGMLType.F16), "cpy_f16_f32": _cpy("cpy_f16_f32", GGMLType.F32),
    })
    k.update(quant_kernels())   # the file's weight types (sim_quants.py)
    k.update(sim_moe.build(q8_dot, k_parts))   # the quantized experts on Q8_1 x, the expert-sorted map
    k.update(sim_kernels_ops.build(view))
    return k


SIM_KERNELS: dict[str, Kernel] = _build()
assert set(SIM_KERNELS) == set(KERNELS), sorted(set(SIM_KERNELS) ^ set(KERNELS))


def run_kernel(space: AddressSpace, name: str, params: np.ndarray) -> None:
    """Run catalogue kernel `name` on `space` with a 0-d KPARAMS record; unknown name -> CUDA_ERROR_NOT_FOUND."""
    fn = SIM_KERNELS.get(name)
    if fn is None:
        raise CudaError("CUDA_ERROR_NOT_FOUND", "run_kernel", f"no kernel named {name!r}")
    fn(space, params)

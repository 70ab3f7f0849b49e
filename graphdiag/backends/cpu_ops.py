"""The operations' semantics as pure numpy functions (the CPU backend, the simulated kernels and the oracle).

Arrays are laid out as AddressSpace.ndarray returns them: axes outermost first, so a ggml tensor
(ne0, ne1, ne2, ne3) is an array of shape (ne3, ne2, ne1, ne0); a block-type tensor (Q8_0, Q4_K, ..., and
BF16) is an array of its graphdiag.quants.BLOCK_DTYPE records (ne3, ne2, ne1, ne0 // block). Everything computes in float32 (weights are dequantised to float32 first;
matmuls accumulate in float32). Functions return new arrays, except `set_rows`, `copy` and
`mul_mat_id_rows`, which write into a destination view in place.

Broadcasting follows ggml, and ggml has two rules: element-wise ops (add, mul) repeat a source that divides
the destination dim (index i % ne_src, as ggml_repeat tiles); mul_mat broadcasts the weight's batch dims by
blocks (index i // (ne_dst / ne_src), as ggml_mul_mat does for grouped heads).
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphdiagError
from ..quants import dequantize

F32 = np.float32


# -- helpers ---------------------------------------------------------------------------------------------
def to_f32(a: np.ndarray) -> np.ndarray:
    """Values of an F32/F16/I32 array or a block array as float32 (a block type's rows grow by its block size
    along the last axis: ggml's dequantize_row_* values)."""
    if a.dtype.names:
        return dequantize(a)
    return a.astype(F32, copy=False)


def repeat_to(b: np.ndarray, shape) -> np.ndarray:
    """`b` repeated (tiled) to `shape`, ggml_repeat style: each dim of b must divide the target dim."""
    shape = tuple(shape)
    if b.shape == shape:
        return b
    reps = []
    for n, m in zip(shape, b.shape):
        if m == 0 or n % m:
            raise ValueError(f"cannot broadcast {b.shape} to {shape}: {m} does not divide {n}")
        reps.append(n // m)
    if all(r == 1 or m == 1 for r, m in zip(reps, b.shape)):
        return np.broadcast_to(b, shape)  # numpy's broadcast is the tile when the source dim is 1
    return np.tile(b, reps)


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float32; -inf entries get 0; a fully masked row gives all zeros."""
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, F32(0))
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True, dtype=F32)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) in float32 (x / (1 + exp(-x)); exp overflow gives -0, as on the GPU)."""
    x = x.astype(F32, copy=False)
    with np.errstate(over="ignore"):
        return x / (F32(1) + np.exp(-x))


# -- element-wise and row ops ----------------------------------------------------------------------------
def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b, b repeated to a's shape (float32)."""
    return to_f32(a) + repeat_to(to_f32(b), a.shape)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a * b, b repeated to a's shape (float32)."""
    return to_f32(a) * repeat_to(to_f32(b), a.shape)


def div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, b repeated to a's shape (float32; a true division, as ggml's op_div)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return to_f32(a) / repeat_to(to_f32(b), a.shape)


def sum_rows(x: np.ndarray) -> np.ndarray:
    """Per row (last axis): the sum, kept as a length-1 axis (float32 accumulation)."""
    return to_f32(x).sum(axis=-1, keepdims=True, dtype=F32)


def clamp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """GGML_OP_CLAMP as ggml-cpu computes it, MAX(MIN(x, hi), lo) with C's comparison macros, in float32: a NaN
    becomes hi (NaN < hi is false). ggml-cuda's op_clamp differs there (clamp_cuda)."""
    x = to_f32(x)
    y = np.where(x < F32(hi), x, F32(hi))
    return np.where(y > F32(lo), y, F32(lo)).astype(F32)


def clamp_cuda(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """GGML_OP_CLAMP as ggml-cuda's op_clamp computes it, fminf(fmaxf(x, lo), hi): a NaN becomes lo."""
    return np.fmin(np.fmax(to_f32(x), F32(lo)), F32(hi))


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """Per row (last axis): x / sqrt(mean(x^2) + eps), float32."""
    x = to_f32(x)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    return x / np.sqrt(ms + F32(eps))


def soft_max(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Per row (last axis): softmax(scale * x), float32 with the row max subtracted."""
    return _softmax_rows(to_f32(x) * F32(scale))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up (same shapes), float32."""
    return silu(gate) * to_f32(up)


GELU_COEF_A = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """ggml's GELU, the tanh approximation, in float32 as ggml-cuda's op_gelu writes it:
    0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))). (ggml-cpu instead looks x up in an F16 table,
    GGML_GELU_FP16; the CPU backend follows the CUDA formula so the sim twins and CPU agree to float
    rounding, and the F16 table's ~1e-3 relative steps are not part of any kernel contract here.)"""
    x = x.astype(F32, copy=False)
    return F32(0.5) * x * (F32(1) + np.tanh(SQRT_2_OVER_PI * x * (F32(1) + GELU_COEF_A * x * x)))


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up (same shapes), float32 (GGML_GLU_OP_GEGLU, split form)."""
    return gelu_tanh(gate) * to_f32(up)


def swiglu_clamp(gate: np.ndarray, up: np.ndarray, limit: float) -> np.ndarray:
    """silu(min(gate, limit)) * clamp(up, -limit, limit), float32 (GGML_GLU_OP_SWIGLU_CLAMP, 0c1e57098; ggml-cpu's
    swiglu_clamp: the gate clamped from above only, up from both sides)."""
    lim = F32(limit)
    return silu(np.minimum(to_f32(gate), lim)) * np.clip(to_f32(up), -lim, lim)


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """x / (1 + exp(-alpha x)) * (y + 1) with x = min(gate, limit), y = clamp(up, -limit, limit), float32
    (GGML_GLU_OP_SWIGLU_OAI, gpt-oss's experts; ggml-cpu's swiglu_oai_f32)."""
    lim = F32(limit)
    x = np.minimum(to_f32(gate), lim)
    with np.errstate(over="ignore"):
        return x / (F32(1) + np.exp(F32(alpha) * -x)) * (np.clip(to_f32(up), -lim, lim) + F32(1))


def glu(op: int, gate: np.ndarray, up: np.ndarray, limit: float = 0.0, alpha: float = 0.0) -> np.ndarray:
    """The split GLU `op` (GluOp value: 1 GEGLU, 2 SWIGLU, 3 SWIGLU_OAI with `alpha` and `limit`, 6 SWIGLU_CLAMP
    with `limit`) of gate and up; other ops raise GraphdiagError."""
    if op == 2:
        return swiglu(gate, up)
    if op == 1:
        return geglu(gate, up)
    if op == 6:
        return swiglu_clamp(gate, up, limit)
    if op == 3:
        return swiglu_oai(gate, up, alpha, limit)
    raise GraphdiagError(f"glu: op {op} is not implemented (1 = GEGLU, 2 = SWIGLU, 3 = SWIGLU_OAI, "
                         f"6 = SWIGLU_CLAMP)")


def fused_glu(op: int, gate: np.ndarray, up: np.ndarray, limit: float = 0.0) -> np.ndarray:
    """The GLU of ggml-cuda's fused gate/up mat-vecs: `glu`, but SWIGLU_OAI with upstream's constants (alpha
    1.702, limit 7: ggml_cuda_op_swiglu_oai_single's defaults, which the fused kernels call with no others)."""
    return swiglu_oai(gate, up, 1.702, 7.0) if op == 3 else glu(op, gate, up, limit)


def add_id(a: np.ndarray, b: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """dst[0, t, i, :] = a[0, t, i, :] + b[0, 0, ids[t, i], :] in float32 (GGML_OP_ADD_ID: a (1, T, n_used, n),
    b (1, 1, E, n), ids I32 (1, 1, T, n_used); gpt-oss's per-expert biases)."""
    return to_f32(a) + to_f32(b)[0, 0][ids[0, 0]][None]


def scale(x: np.ndarray, s: float, bias: float = 0.0) -> np.ndarray:
    """x * s + bias in float32, two roundings (GGML_OP_SCALE; the CUDA kernel multiplies and adds
    without contracting to an FMA, so the bytes agree)."""
    return to_f32(x) * F32(s) + F32(bias)


def top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Per row (last axis): int32 indices of the k largest values, descending; ties: lower index first."""
    order = np.argsort(-to_f32(x), axis=-1, kind="stable")
    return order[..., :k].astype(np.int32)


def argsort(x: np.ndarray, descending: bool) -> np.ndarray:
    """Per row (last axis): int32 indices ordering the row; ties: lower index first (either order)."""
    x = to_f32(x)
    return np.argsort(-x if descending else x, axis=-1, kind="stable").astype(np.int32)


# -- rows in and out -------------------------------------------------------------------------------------
def get_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """dst[i3, i2, i1, :] = table[i3 % T3, i2 % T2, ids[0, i3, i2, i1], :] as float32.

    table: (T3, T2, n_rows, ne0) (a block type: blocks); ids: I32 (1, n3, n2, n1) -> (n3, n2, n1, ne0).
    Only the selected rows are dequantised."""
    ids = ids[0].astype(np.intp, copy=False)
    n3, n2, _ = ids.shape
    i3 = np.arange(n3)[:, None, None] % table.shape[0]
    i2 = np.arange(n2)[None, :, None] % table.shape[1]
    return to_f32(table[i3, i2, ids])


def set_rows(dst: np.ndarray, rows: np.ndarray, idx: np.ndarray) -> None:
    """In place: dst[0, 0, idx[r], :] = rows[r] converted to dst's dtype.

    dst: (1, 1, n_rows, W) (a view, e.g. the F16 KV cache); idx: I32, any shape, R entries in ggml order;
    rows: float32 whose elements, in ggml order, form R rows of W (e.g. (1, R, 1, W) or (1, R, Hkv, D) with
    Hkv * D = W: a token's heads flattened into one cache row)."""
    if dst.shape[0] * dst.shape[1] != 1:
        raise GraphdiagError(f"set_rows: destination batch dims {dst.shape[:2]} are not supported")
    idx = idx.reshape(-1).astype(np.intp, copy=False)
    w = dst.shape[-1]
    if rows.size != idx.size * w:
        raise GraphdiagError(f"set_rows: {rows.size} source elements are not {idx.size} rows of {w}")
    dst[0, 0, idx] = to_f32(rows).reshape(idx.size, w)


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """In place: dst = src element by element in ggml order (same element count), converted to dst's dtype."""
    if dst.size != src.size:
        raise GraphdiagError(f"copy: {src.size} elements into {dst.size}")
    with np.errstate(over="ignore"):
        dst[...] = src if src.shape == dst.shape else src.reshape(dst.shape)


# -- matrix products -------------------------------------------------------------------------------------
# A block-type weight (Q8_0, Q4_K, ...) of more than MUL_MAT_SLICE_BYTES as float32 is dequantised a slice of rows
# at a time, each slice's product giving its columns of dst: dequantised whole, Gemma 3 270M's tied LM head
# (262144 x 640 Q8_0) took 671 MB at every step. Smaller weights, and F16/BF16/F32 ones (the simulated kernels'
# float twins), take the one product as before. The sums stay float32 BLAS sums of the same values: with up to 4
# columns of x (a decode step, the last token's logits) OpenBLAS 0.3.31 gives the whole product's bits; with more
# it may block M differently and move a last bit, float32 accumulation order that the CPU backend never fixed
# (it differs by BLAS build and thread count) and that its oracle bound covers (ORACLE_FLOOR, 8x that noise).
MUL_MAT_SLICE_BYTES = 16 << 20


def weight_rows_step(m: int, k: int) -> int:
    """Rows of an (m, k) block-type weight that mul_mat dequantises at a time: MUL_MAT_SLICE_BYTES of float32
    in a multiple of 64 rows (at least 64), or all m."""
    return min(m, max(64, MUL_MAT_SLICE_BYTES // (4 * max(k, 1)) // 64 * 64))


def mul_mat(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dst[b3, b2, n, m] = sum_k W[b3 // r3, b2 // r2, m, k] * x[b3, b2, n, k] (float32).

    w: (W3, W2, M, K) any type (a block type: blocks); x: (B3, B2, N, K); r2 = B2 / W2, r3 = B3 / W3 -> (B3, B2, N, M).
    A big block-type weight is dequantised a slice of rows at a time (weight_rows_step)."""
    xf = to_f32(x)
    m = w.shape[2]
    step = weight_rows_step(m, xf.shape[-1]) if w.dtype.names else m
    if step >= m:
        return _mul_mat_f32(to_f32(w), xf)
    out = None
    for m0 in range(0, m, step):
        part = _mul_mat_f32(to_f32(w[:, :, m0:m0 + step]), xf)
        if out is None:
            out = np.empty((*part.shape[:-1], m), F32)
        out[..., m0:m0 + step] = part
    return out


def _mul_mat_f32(wf: np.ndarray, xf: np.ndarray) -> np.ndarray:
    """mul_mat of float32 operands (the weight's batch dims repeated by blocks to x's)."""
    for axis in (0, 1):
        if wf.shape[axis] != xf.shape[axis] and wf.shape[axis] != 1:
            wf = np.repeat(wf, xf.shape[axis] // wf.shape[axis], axis=axis)
    return np.matmul(xf, np.swapaxes(wf, -1, -2))


def mul_mat_id(experts: np.ndarray, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """dst[0, t, s, :] = experts[0, ids[t, s]] . x[0, t, s if n_b > 1 else 0] (float32).

    experts: (1, E, M, K) any type; x: (1, T, n_b, K) with n_b in {1, n_used}; ids: I32 (1, 1, T, n_used)
    -> (1, T, n_used, M). Each expert is dequantised once."""
    idv = ids[0, 0]
    t_, n_used = idv.shape
    out = np.zeros((1, t_, n_used, experts.shape[2]), F32)
    for e in np.unique(idv):
        tok, slot = np.nonzero(idv == e)
        mul_mat_id_rows(out, experts, x, int(e), slot, tok)
    return out


def mul_mat_id_rows(dst: np.ndarray, experts: np.ndarray, x: np.ndarray, expert: int,
                    slots: np.ndarray, tokens: np.ndarray) -> None:
    """In place, for each pair: dst[0, t, s, :] = experts[0, expert] . x[0, t, s if n_b > 1 else 0].

    The per-expert step of mul_mat_id (the sorted/gathered path): dst (1, T, n_used, M); slots, tokens: ints."""
    if len(slots) == 0:
        return
    slots = np.asarray(slots, np.intp)
    tokens = np.asarray(tokens, np.intp)
    w = to_f32(experts[0, expert])
    xs = to_f32(x[0, tokens, slots if x.shape[2] > 1 else 0])
    dst[0, tokens, slots] = xs @ w.T


# -- attention -------------------------------------------------------------------------------------------
ROPE_NORMAL, ROPE_NEOX = 0, 2


def rope(x: np.ndarray, pos: np.ndarray, n_dims: int, freq_base: float, freq_scale: float = 1.0,
         mode: int = 0, yarn: tuple[float, float, float, float] | None = None) -> np.ndarray:
    """x: (B3, T, H, D); pos: I32, T entries -> (B3, T, H, D) float32.

    For i < n_dims/2: th = pos[t] * freq_scale * freq_base^(-2i/n_dims) (float32); the pair (a, b) is
    (2i, 2i+1) in mode 0 (normal) and (i, i + n_dims/2) in mode 2 (NEOX);
    (y[a], y[b]) = (x_a cos th - x_b sin th, x_a sin th + x_b cos th); dims >= n_dims are copied.
    yarn = (ext_factor, attn_factor, corr_dim0, corr_dim1) (ggml's rope_yarn): th_e = pos * freq_base^(-2i/
    n_dims), th_i = freq_scale * th_e, r = (1 - clamp((i - c0) / max(0.001, c1 - c0), 0, 1)) * ext_factor,
    th = th_i (1 - r) + th_e r, and cos, sin times attn_factor * (1 + 0.1 ln(1 / freq_scale)) (ext_factor != 0)."""
    if mode not in (ROPE_NORMAL, ROPE_NEOX):
        raise GraphdiagError(f"rope: mode {mode} is not supported (0 normal, 2 NEOX)")
    x = to_f32(x)
    half = n_dims // 2
    i = np.arange(half, dtype=F32)
    inv = np.power(F32(freq_base), F32(-2) * i / F32(n_dims))
    if yarn is None:
        th = (pos.reshape(-1).astype(F32) * F32(freq_scale))[:, None, None] * inv  # (T, 1, n_dims/2)
        c, s = np.cos(th), np.sin(th)
    else:
        c, s = _yarn_cos_sin(pos.reshape(-1).astype(F32)[:, None, None] * inv, i, F32(freq_scale), *map(F32, yarn))
    a, b = (slice(0, n_dims, 2), slice(1, n_dims, 2)) if mode == ROPE_NORMAL else (slice(0, half), slice(half, n_dims))
    x0, x1 = x[..., a], x[..., b]
    out = x.copy()
    out[..., a] = x0 * c - x1 * s
    out[..., b] = x0 * s + x1 * c
    return out


def _yarn_cos_sin(th_e: np.ndarray, i: np.ndarray, fs, ext, attn, c0, c1) -> tuple[np.ndarray, np.ndarray]:
    """rope_yarn's cos and sin of pair i at the unscaled angles th_e (float32)."""
    th_i = fs * th_e
    mscale = attn
    if ext != 0:
        ramp = (F32(1) - np.minimum(F32(1), np.maximum(F32(0), (i - c0) / max(F32(0.001), c1 - c0)))) * ext
        th_i = th_i * (F32(1) - ramp) + th_e * ramp
        mscale = attn * (F32(1) + F32(0.1) * np.log(F32(1) / fs, dtype=F32))
    return np.cos(th_i) * mscale, np.sin(th_i) * mscale


def rope_neox(x: np.ndarray, pos: np.ndarray, n_dims: int, freq_base: float, freq_scale: float = 1.0) -> np.ndarray:
    """rope in mode 2 (NEOX: element i rotates with i + n_dims/2), float32; see rope."""
    return rope(x, pos, n_dims, freq_base, freq_scale, ROPE_NEOX)


def flash_attn_ext(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                   scale: float, sinks: np.ndarray | None = None) -> np.ndarray:
    """Attention with grouped KV heads, float32 (K/V upcast from F16; Q stays float32).

    q: (B, T, H, D); k: (B, n_kv, Hkv, D); v: (B, n_kv, Hkv, Dv); mask: (M3, M2, T_pad >= T, n_kv) added
    to the scaled scores (rows beyond T ignored; -inf masks) or None -> (B, T, H, Dv).
    Head h reads kv head h // (H // Hkv); p = softmax(scale * q.k + mask[t]); a fully masked row gives 0.
    sinks: F32 (H,) or None: head h's logit S_h joins each row's softmax denominator and adds no value
    (ggml_flash_attn_ext_add_sinks): p = exp(s - m) / (sum exp(s - m) + exp(S_h - m)), m = max(max s, S_h)."""
    h, hkv = q.shape[2], k.shape[2]
    if h % hkv:
        raise GraphdiagError(f"flash_attn_ext: {h} heads are not a multiple of {hkv} kv heads")
    qh = to_f32(q).transpose(0, 2, 1, 3)                                   # (B, H, T, D)
    kh = np.repeat(to_f32(k).transpose(0, 2, 3, 1), h // hkv, axis=1)      # (B, H, D, n_kv)
    vh = np.repeat(to_f32(v).transpose(0, 2, 1, 3), h // hkv, axis=1)      # (B, H, n_kv, Dv)
    s = np.matmul(qh, kh) * F32(scale)                                     # (B, H, T, n_kv)
    if mask is not None:
        s = s + to_f32(mask[:, :, : q.shape[1], :])
    if sinks is None:
        return np.matmul(_softmax_rows(s), vh).transpose(0, 2, 1, 3)
    sink = to_f32(sinks).reshape(1, h, 1, 1)
    m = np.maximum(s.max(axis=-1, keepdims=True), sink)
    e = np.exp(s - m)
    p = e / (e.sum(axis=-1, keepdims=True, dtype=F32) + np.exp(sink - m))
    return np.matmul(p, vh).transpose(0, 2, 1, 3)

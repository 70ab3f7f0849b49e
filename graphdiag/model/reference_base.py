"""The oracle's public interface: an independent forward pass in plain numpy, the one the graph-executed logits
are checked against, and its pieces (rms_norm, rope_pairs, rope, softmax, silu, SeqCache) for the
architectures' oracles (model/arch/: each subclasses ReferenceBase, overriding the blocks its forward does
differently). This module imports no architecture; model/reference.py picks a model's oracle from the registry.

It shares nothing with the graph path but the stored weights (dequantised, then widened to float64: a weight
of more than WIDE_MAX elements is kept as float32 and widened a block of rows at a time in its product, and a
block-quantised one of more than STORED_MAX stays in its blocks, dequantised where read). It
computes in float64, keeps its own KV cache per sequence indexed by position, and rounds K (after rope) and V to
float16 on the way in, as the F16 cache does. Arrays here are numpy-natural: tokens along axis 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..ir.dtypes import block_size
from ..quants import dequantize, q8_1_activations, type_of
from .presets import MOE_NORM_MIN, ROPE_NEOX

if TYPE_CHECKING:                      # annotations only: weights imports the registry, which imports this
    from .weights import Model

F64 = np.float64

# Weights of more than WIDE_MAX elements (8 MB as float64) are kept as float32 (a dequantised value is a
# float32: exact) and widened to float64 WIDE_BLOCK elements at a time inside each product (_times_t): Gemma 3
# 270M's weights take 1.1 GB instead of 2.2 GB, and a block that stays in cache costs no time (one core: its
# sim run against the oracle took 10-14 s of CPU instead of 15). The products are float64 sums over the same
# float64 values (BLAS may block a narrower product otherwise: the last bits).
WIDE_MAX = 1 << 20
WIDE_BLOCK = 1 << 18

# A block-quantised weight of more than STORED_MAX elements is not kept dequantised at all: it stays in its stored
# blocks (the file's mapped bytes, or the draw's) and is dequantised where it is read, a block of rows at a time in
# _times_t and the rows an index picks (StoredWeight). Gemma 3 270M's tied embedding (262144 x 640, Q8_0) took
# 671 MB as float32 in each oracle. Dequantisation works block by block, so the values, and the float64 products
# over them, are those of the whole array's.
STORED_MAX = 1 << 24


class StoredWeight:
    """A block-quantised (..., rows, blocks) weight read as the float32 (..., rows, K) it dequantises to:
    `w[i]` (i indexing the leading axes: rows, or experts) dequantises only what i selects."""

    dtype = np.dtype(np.float32)

    def __init__(self, stored: np.ndarray):
        self.stored = stored
        self.shape = (*stored.shape[:-1], stored.shape[-1] * block_size(type_of(stored)))

    def __getitem__(self, i) -> np.ndarray:
        return dequantize(self.stored[i])


def greedy(logits: np.ndarray) -> np.ndarray:
    """Greedy sampling: the argmax token of each row of (n_outputs, n_vocab) logits (ties: lowest id)."""
    return np.argmax(logits, axis=-1).astype(np.int64)


def _times_t(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T in float64 for a stored (out, in) weight; a float32 one (or a StoredWeight) widened WIDE_BLOCK
    elements at a time."""
    if w.dtype == F64:
        return x @ w.T
    n_out, k = w.shape
    rows = max(1, WIDE_BLOCK // k)
    out = np.empty((*x.shape[:-1], n_out))
    block = np.empty((min(rows, n_out), k))
    for i in range(0, n_out, rows):
        b = block[:min(rows, n_out - i)]
        b[...] = w[i:i + rows]
        out[..., i:i + len(b)] = x @ b.T
    return out


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _q8_1_rounded(x: np.ndarray) -> np.ndarray:
    """x (..., K) with every block of 32 replaced by its Q8_1 value d_f16 * q (float64)."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax != 0, np.rint(b / d), np.float32(0))
    return (q.astype(F64) * d.astype(np.float16).astype(F64)).reshape(x.shape)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool = False) -> np.ndarray:
    """Rotate each head's pairs by pos * base^(-2i/head_dim). x: (T, H, hd). The pairs: adjacent elements
    (2i, 2i+1) in ggml's NORM mode (llama), elements i and i + hd/2 in NEOX mode (qwen2, qwen3, gemma3)."""
    hd = x.shape[-1]
    theta = pos[:, None].astype(F64) * base ** (-np.arange(0, hd, 2, dtype=F64) / hd)  # (T, hd/2)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    first, second = (np.s_[..., : hd // 2], np.s_[..., hd // 2:]) if neox else (np.s_[..., 0::2], np.s_[..., 1::2])
    x0, x1 = x[first], x[second]
    out = np.empty_like(x)
    out[first] = x0 * c - x1 * s
    out[second] = x0 * s + x1 * c
    return out


def rope_neox(x: np.ndarray, pos: np.ndarray, base: float, n_dims: int | None = None) -> np.ndarray:
    """NEOX rope (llama.cpp's mode 2, Gemma 3 / Qwen): element i < n_dims/2 of each head rotates with
    i + n_dims/2 by pos * base^(-2i/n_dims); dims past n_dims (default: all of head_dim) are kept. x: (T, H, hd)."""
    hd = x.shape[-1]
    n_dims = hd if n_dims is None else n_dims
    half = n_dims // 2
    theta = pos[:, None].astype(F64) * base ** (-2.0 * np.arange(half, dtype=F64) / n_dims)  # (T, half)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_dims]
    out = np.array(x, dtype=F64)
    out[..., :half] = x0 * c - x1 * s
    out[..., half:n_dims] = x0 * s + x1 * c
    return out


def rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool = False) -> np.ndarray:
    """The rope of an architecture: NEOX (neox=True) or adjacent pairs (llama's). x: (T, H, hd)."""
    return rope_neox(x, pos, base) if neox else _rope(x, pos, base)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, the tanh approximation (ggml_gelu, what Gemma 3's GEGLU applies), in float64."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up (ggml_geglu_split), float64."""
    return gelu_tanh(gate) * up


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis: a token's row, or each head's (QK-norm on (T, H, hd))."""
    return _rms_norm(x, w, eps)


def rope_pairs(x: np.ndarray, pos: np.ndarray, base: float, neox: bool = False) -> np.ndarray:
    """_rope: each head's pairs rotated, adjacent (NORM) or i and i + hd/2 (neox)."""
    return _rope(x, pos, base, neox)


softmax, silu = _softmax, _silu


class _SeqCache:
    """One sequence's K/V rows per layer, float16, indexed by position: (n_layer, n_pos, n_embd_kv)."""

    def __init__(self, n_layer: int, width: int):
        self.k = np.zeros((n_layer, 0, width), np.float16)
        self.v = np.zeros((n_layer, 0, width), np.float16)

    @property
    def n_pos(self) -> int:
        return self.k.shape[1]

    def grow(self, n_pos: int) -> None:
        if n_pos > self.n_pos:
            pad = ((0, 0), (0, n_pos - self.n_pos), (0, 0))
            self.k, self.v = np.pad(self.k, pad), np.pad(self.v, pad)


class ReferenceBase:
    """Forward passes over ubatches, with a KV cache per sequence (positions continue where they left off):
    llama's forward, which an architecture's oracle (model/arch/) overrides block by block."""

    def __init__(self, model: Model, q8_1_activations: bool = False, jitter: float = 0.0,
                 weights_of: "ReferenceBase | None" = None, jitter_floats: bool = False):
        """q8_1_activations: the backend rounds x to Q8_1 before products with a block-quantised weight (the
        GPU backend, as ggml's MMVQ/MMQ paths); the numpy CPU backend multiplies plain floats.

        jitter: a relative perturbation of every activation just before its Q8_1 rounding (x * (1 + jitter * n),
        n standard normal from a fixed seed, so the same on every host): the twin that measures how far the
        model's own Q8_1 rounding noise carries two runs apart when their float paths differ by float32's
        last bits, as a GPU's summation order and the oracle's float64 do. weights_of: share another
        reference's float64 weights (8 bytes a parameter: 2 GB for Gemma 3 270M) instead of a second copy.
        jitter_floats: the jitter also moves x before products with every other weight (F16, BF16, F32): the
        twin of a float MoE run on a GPU, whose x the mat-mul kernels round to F16 (MMF, cuBLAS's F16 path) or
        TF32 (cuBLAS's F32 GEMMs: the router's `s1688gemm`), the noise that decides its router's near-ties."""
        self.m, self.cfg = model, model.cfg
        self.q8_1 = q8_1_activations
        self.jitter = jitter
        self.jitter_floats = jitter_floats
        self._rng = np.random.default_rng(0x6a17)
        self.seqs: dict[int, _SeqCache] = {}
        self._w: dict[str, np.ndarray] = {}   # float64 weights (float32 past WIDE_MAX elements)
        self._q8: set[str] = set()            # weights whose products take Q8_1-rounded activations on a GPU
        # a MoE layer's choice, (il, router logits (T, E), top (T, k)) -> the ids used: the oracle's hook
        # (oracle_router.RouterFollow) that may take the run's at a near-tie; None: its own top k
        self.router = None
        if weights_of is not None:
            self._w, self._q8 = weights_of._w, weights_of._q8

    def snapshot(self) -> tuple:
        """The caches and the jitter's generator state, for restore (a step computed twice)."""
        caches = {s: (c.k.copy(), c.v.copy()) for s, c in self.seqs.items()}
        return caches, self._rng.bit_generator.state

    def restore(self, state: tuple) -> None:
        caches, self._rng.bit_generator.state = state
        self.seqs = {}
        for s, (k, v) in caches.items():
            c = self.seqs[s] = _SeqCache(self.cfg.n_layer, self.cfg.n_embd_kv)
            c.k, c.v = k.copy(), v.copy()

    def seq_len(self, seq: int) -> int:
        return self.seqs[seq].n_pos if seq in self.seqs else 0

    def w(self, name: str) -> np.ndarray | StoredWeight:
        """The stored weight dequantised (numpy axes outermost first); cached. Float64, or float32 past WIDE_MAX
        elements, or a block type's past STORED_MAX dequantised where read (StoredWeight): any product with a
        float64 operand is still computed in float64 (_times_t in _mm)."""
        if name not in self._w:
            a = self.m.host[name]
            if a.dtype.names and q8_1_activations(type_of(a)):
                self._q8.add(name)
            if a.dtype.names and a.size * block_size(type_of(a)) > STORED_MAX:
                self._w[name] = StoredWeight(a)
                return self._w[name]
            v = dequantize(a) if a.dtype.names else a
            self._w[name] = v.astype(F64) if v.size <= WIDE_MAX else v.astype(np.float32, copy=False)
        return self._w[name]

    # -- public API --------------------------------------------------------------------------------------
    def decode(self, tokens: Mapping[int, int] | Sequence[int]) -> np.ndarray:
        """One token for each sequence ({seq: token}, or a list for seqs 0..n-1) -> (n_seqs, n_vocab) f32."""
        items = list(tokens.items()) if isinstance(tokens, Mapping) else list(enumerate(tokens))
        seqs = np.array([s for s, _ in items])
        pos = np.array([self.seq_len(s) for s, _ in items])
        return self.forward(np.array([t for _, t in items]), seqs, pos, np.arange(len(items)))

    def prefill(self, tokens: Sequence[int], seq: int = 0, all_logits: bool = False) -> np.ndarray:
        """Many tokens of one sequence -> logits of the last token (1, n_vocab), or of every token."""
        n = len(tokens)
        pos = self.seq_len(seq) + np.arange(n)
        out = np.arange(n) if all_logits else np.array([n - 1])
        return self.forward(np.asarray(tokens), np.full(n, seq), pos, out)

    def forward(self, tokens: np.ndarray, seqs: np.ndarray, pos: np.ndarray, out_rows: np.ndarray) -> np.ndarray:
        """tokens/seqs/pos: (T,) ints; out_rows: token rows whose logits are returned -> (len, n_vocab) f32."""
        cfg = self.cfg
        for s in np.unique(seqs):
            self.seqs.setdefault(int(s), _SeqCache(cfg.n_layer, cfg.n_embd_kv)).grow(int(pos[seqs == s].max()) + 1)
        x = self._embed(tokens)
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            h = _rms_norm(x, self.w(p + "attn_norm.weight"), cfg.norm_eps)
            x = x + self._attention(il, h, seqs, pos)
            h = _rms_norm(x, self.w(p + "ffn_norm.weight"), cfg.norm_eps)
            x = x + (self._moe(il, h) if cfg.is_moe else self._ffn(il, h))
        h = _rms_norm(x[out_rows], self.w("output_norm.weight"), cfg.norm_eps)
        return self._mm(h, "token_embd.weight" if cfg.tied_output else "output.weight").astype(np.float32)

    # -- blocks (an architecture's subclass overrides those its forward does differently) ------------------
    def _embed(self, tokens: np.ndarray) -> np.ndarray:
        return self.w("token_embd.weight")[tokens].astype(F64)

    def _proj(self, h: np.ndarray, p: str, name: str) -> np.ndarray:
        """h @ W^T (+ the bias where the file or preset has one: `p + name + ".bias"`)."""
        y = self._mm(h, p + name + ".weight")
        bias = p + name + ".bias"
        return y + self.w(bias) if bias in self.m.host else y

    def _qk(self, il: int, q: np.ndarray, k: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Q and K (T, heads, hd) roped in the model's rope type."""
        neox = self.cfg.rope_type == ROPE_NEOX
        return _rope(q, pos, self.cfg.rope_base, neox), _rope(k, pos, self.cfg.rope_base, neox)

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W^T for a stored (out, in) weight. Against a block-quantised weight (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
        Q2_K..Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), x is first rounded to Q8_1 as ggml's quantized mat-vec and mat-mul paths do (per 32 values: d = max|x| / 127 stored as f16, q = rint(x/d))
        — the arithmetic llama.cpp defines, so the oracle bound stays tight for quantised runs (GPU backend)."""
        w = self.w(name)
        return _times_t(self._x_for(x, name), w)

    def _x_for(self, x: np.ndarray, name: str) -> np.ndarray:
        """x as a product with weight `name` reads it: rounded to Q8_1 (jittered first in a noise twin) where
        the GPU backend rounds it (a block-quantised weight), else x itself (jittered in a float run's twin).
        `name` must have been loaded."""
        if not (self.q8_1 and name in self._q8):
            if self.jitter and self.jitter_floats:
                return x * (1.0 + self.jitter * self._rng.standard_normal(x.shape))
            return x
        if self.jitter:
            x = x * (1.0 + self.jitter * self._rng.standard_normal(x.shape))
        return _q8_1_rounded(x)

    def _attention(self, il: int, h: np.ndarray, seqs: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cfg, p, t = self.cfg, f"blk.{il}.", h.shape[0]
        hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_head_kv
        q = self._proj(h, p, "attn_q").reshape(t, nh, hd)
        k = self._proj(h, p, "attn_k").reshape(t, nkv, hd)
        q, k = self._qk(il, q, k, pos)
        v = self._proj(h, p, "attn_v")
        for i in range(t):  # the cache write, f16 as the F16 cache
            c = self.seqs[int(seqs[i])]
            c.k[il, pos[i]] = k[i].reshape(-1)
            c.v[il, pos[i]] = v[i]
        out = np.zeros((t, nh, hd))
        for s in np.unique(seqs):
            rows = np.nonzero(seqs == s)[0]
            out[rows] = self._attend(il, q[rows], pos[rows], self.seqs[int(s)])
        return self._mm(out.reshape(t, nh * hd), p + "attn_output.weight")

    def _attend(self, il: int, q: np.ndarray, qpos: np.ndarray, c: _SeqCache) -> np.ndarray:
        """Causal attention of q (Tq, H, hd) over the sequence's cached positions 0..max(qpos)."""
        cfg = self.cfg
        hd, group = cfg.head_dim, cfg.n_head // cfg.n_head_kv
        n = int(qpos.max()) + 1
        k = c.k[il, :n].astype(F64).reshape(n, cfg.n_head_kv, hd)
        v = c.v[il, :n].astype(F64).reshape(n, cfg.n_head_kv, hd)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)     # (n, H, hd): head h -> kv h // group
        s = np.einsum("thd,nhd->htn", q, k) / np.sqrt(hd)                 # (H, Tq, n)
        s = np.where(np.arange(n)[None, None, :] <= qpos[None, :, None], s, -np.inf)
        return np.einsum("htn,nhd->thd", _softmax(s), v)

    def _ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        p = f"blk.{il}."
        g = self._mm(h, p + "ffn_gate.weight")
        u = self._mm(h, p + "ffn_up.weight")
        return self._mm(_silu(g) * u, p + "ffn_down.weight")

    def _moe(self, il: int, h: np.ndarray) -> np.ndarray:
        """Softmax router, top-k experts (ties: lower id), outputs weighted by the router probabilities — with
        cfg.moe_norm_w divided by their sum over the k chosen (at least F16's smallest normal, as llama.cpp)."""
        cfg, p = self.cfg, f"blk.{il}."
        z = self._mm(h, p + "ffn_gate_inp.weight")                        # (T, E)
        probs = _softmax(z)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, : cfg.n_expert_used]
        if self.router is not None:
            top = self.router(il, z, top)
        weight = probs
        if cfg.moe_norm_w:
            total = np.take_along_axis(probs, top, axis=-1).sum(axis=-1, keepdims=True)
            weight = probs / np.maximum(total, MOE_NORM_MIN)
        names = [p + f"ffn_{n}_exps.weight" for n in ("gate", "up", "down")]
        gate, up, down = (self.w(n) for n in names)
        out = np.zeros_like(h)
        for e in np.unique(top):
            rows, _ = np.nonzero(top == e)
            x = self._x_for(h[rows], names[0])     # quantised experts read Q8_1 x, as upstream's mmvq / mmq
            a = _silu(x @ gate[e].T) * (x @ up[e].T)
            out[rows] += weight[rows, e][:, None] * (self._x_for(a, names[2]) @ down[e].T)
        return out


SeqCache = _SeqCache

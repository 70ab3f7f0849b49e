"""Gemma 3's independent numpy forward (the oracle), in float64 with the F16 cache's rounding of K and V.

It shares nothing with the graph path but the stored weights, and nothing with the cells either: each sequence
keeps every position's K/V (model/reference_base.SeqCache), and a sliding layer attends to the positions p0 of its
sequence with p1 - n_swa < p0 <= p1, the window llama.cpp's SWA mask leaves visible. Formulas written from
Gemma 3's definition: embedding * sqrt(n_embd); QK-norm over head_dim; NEOX rope (element i rotates with
i + head_dim/2: reference_base.rope_pairs) with the layer's base; Q * f_attention_scale; post-attention and post-FFN RMS norms before
the residual adds; GEGLU with the tanh GELU; tied lm_head.
"""

from __future__ import annotations

import numpy as np

from ..reference_base import F64, ReferenceBase, SeqCache, rms_norm, rope_pairs, softmax

_SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): the GELU ggml's GEGLU uses."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))


class Reference(ReferenceBase):
    """The oracle's interface (decode, prefill, forward) for a Gemma 3 model (cfg: gemma3.Gemma3Config)."""

    def forward(self, tokens: np.ndarray, seqs: np.ndarray, pos: np.ndarray, out_rows: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        for s in np.unique(seqs):
            self.seqs.setdefault(int(s), SeqCache(cfg.n_layer, cfg.n_embd_kv)).grow(int(pos[seqs == s].max()) + 1)
        x = self.w("token_embd.weight")[tokens].astype(F64) * np.sqrt(F64(cfg.n_embd))
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            h = self._attention(il, rms_norm(x, self.w(p + "attn_norm.weight"), cfg.norm_eps), seqs, pos)
            x = x + rms_norm(h, self.w(p + "post_attention_norm.weight"), cfg.norm_eps)
            h = self._ffn(il, rms_norm(x, self.w(p + "ffn_norm.weight"), cfg.norm_eps))
            x = x + rms_norm(h, self.w(p + "post_ffw_norm.weight"), cfg.norm_eps)
        h = rms_norm(x[out_rows], self.w("output_norm.weight"), cfg.norm_eps)
        lm = "token_embd.weight" if cfg.tied_output else "output.weight"
        return self._mm(h, lm).astype(np.float32)

    def _normed_roped(self, il: int, h: np.ndarray, pos: np.ndarray, which: str, n_head: int) -> np.ndarray:
        """Q or K: projection, per-head RMS norm by attn_{q,k}_norm, NEOX rope at the layer's base."""
        cfg, p, t = self.cfg, f"blk.{il}.", h.shape[0]
        x = self._mm(h, p + f"attn_{which}.weight").reshape(t, n_head, cfg.head_dim)
        x = rms_norm(x, self.w(p + f"attn_{which}_norm.weight"), cfg.norm_eps)
        return rope_pairs(x, pos, cfg.rope_base_of(il), neox=True)

    def _attention(self, il: int, h: np.ndarray, seqs: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cfg, p, t = self.cfg, f"blk.{il}.", h.shape[0]
        q = self._normed_roped(il, h, pos, "q", cfg.n_head) * cfg.f_attention_scale
        k = self._normed_roped(il, h, pos, "k", cfg.n_head_kv)
        v = self._mm(h, p + "attn_v.weight")
        for i in range(t):                       # the cache write, f16 as the F16 cache
            c = self.seqs[int(seqs[i])]
            c.k[il, pos[i]] = k[i].reshape(-1)
            c.v[il, pos[i]] = v[i]
        out = np.zeros((t, cfg.n_head, cfg.head_dim))
        for s in np.unique(seqs):
            rows = np.nonzero(seqs == s)[0]
            out[rows] = self._attend(il, q[rows], pos[rows], self.seqs[int(s)])
        return self._mm(out.reshape(t, cfg.n_embd_q), p + "attn_output.weight")

    def _attend(self, il: int, q: np.ndarray, qpos: np.ndarray, c: SeqCache) -> np.ndarray:
        """Attention of q (Tq, H, hd), already scaled, over the sequence's positions p0 <= p1, and within
        the window (p1 - p0 < n_swa) on a sliding layer."""
        cfg = self.cfg
        hd, group = cfg.head_dim, cfg.n_head // cfg.n_head_kv
        n = int(qpos.max()) + 1
        k = np.repeat(c.k[il, :n].astype(F64).reshape(n, cfg.n_head_kv, hd), group, axis=1)
        v = np.repeat(c.v[il, :n].astype(F64).reshape(n, cfg.n_head_kv, hd), group, axis=1)
        s = np.einsum("thd,nhd->htn", q, k)                              # (H, Tq, n): scale 1 (Q was scaled)
        p0, p1 = np.arange(n)[None, None, :], qpos[None, :, None]
        seen = p0 <= p1
        if cfg.is_swa(il):
            seen = seen & (p1 - p0 < cfg.n_swa)
        s = np.where(seen, s, -np.inf)
        return np.einsum("htn,nhd->thd", softmax(s), v)

    def _ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        p = f"blk.{il}."
        g = self._mm(h, p + "ffn_gate.weight")
        u = self._mm(h, p + "ffn_up.weight")
        return self._mm(gelu_tanh(g) * u, p + "ffn_down.weight")

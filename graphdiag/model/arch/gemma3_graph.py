"""Gemma 3's decode/prefill graph, built as llama.cpp 0c1e57098 builds it (models/gemma3.cpp with the iSWA
attention input of llama-graph.cpp); gemma3.py says what differs from llama.

Node for node, views included (12 per layer: the Q/K/V reshapes, the cache-write views of K and V, the cache
views, Q's 4-d view, the three permutes and the attention's reshape), so the node count and op census equal
upstream's (727 nodes, 511 compute for Gemma 3 270M). Names are llama.cpp's (its `cb` names, ggml's
"(view)"/"(permuted)" suffixes); the few nodes llama.cpp leaves unnamed get a label in the same style (said
where). The KQ masks are F16 inputs flash attention reads directly (0c1e57098 builds no cast); the SWA
cache's inputs carry a "_swa" suffix (upstream names both "attn_inp_kq_mask"), so a report tells the two
masks apart. Flash attention gets upstream's permuted operands (ir/attention.py says how backends read them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...ir.build import Ctx
from ...ir.dtypes import GGMLType
from ...ir.ops import GluOp, Op, TensorFlag
from ...ir.tensor import Tensor
from ..graph_context import BuiltGraph, GraphContext, permute
from ..presets import ROPE_NEOX


@dataclass(frozen=True)
class IswaInputs:
    """Input tensors (flag INPUT) of a graph over the iSWA cache, in llama.cpp's creation order. Masks are
    F16 (n_kv, n_tokens): 0 visible, -inf masked; idxs I32 (n_tokens): the cell each token's K/V row goes to.
    The `_swa` ones belong to the sliding-window cache (None without a window)."""

    tokens: Tensor
    pos: Tensor
    k_idxs: Tensor
    v_idxs: Tensor
    kq_mask: Tensor
    k_idxs_swa: Tensor | None
    v_idxs_swa: Tensor | None
    kq_mask_swa: Tensor | None
    out_ids: Tensor

    @property
    def kq_mask_cnv(self) -> Tensor:
        """What flash attention reads: the mask itself (0c1e57098 makes it F16, no cast)."""
        return self.kq_mask


class Builder(GraphContext):
    """One ubatch's graph. `model.cfg` is a gemma3.Gemma3Config; params carry n_kv (global) and n_kv_swa.
    Built afresh each time: GraphTemplates stamps one n_kv-shaped set, an iSWA graph has two."""

    TEMPLATES = False

    @property
    def c(self) -> Ctx:
        return self.ctx

    def inputs(self, tokens: Tensor) -> IswaInputs:
        c, t, swa = self.c, self.p.n_tokens, self.cfg.n_swa > 0
        pos = c.new_input(GGMLType.I32, (t,), "inp_pos")
        k_idxs = c.new_input(GGMLType.I32, (t,), "attn_inp_k_idxs")
        v_idxs = c.new_input(GGMLType.I32, (t,), "attn_inp_v_idxs")
        mask = c.new_input(GGMLType.F16, (self.p.n_kv, t), "attn_inp_kq_mask")
        extra = (None, None, None)
        if swa:
            extra = (c.new_input(GGMLType.I32, (t,), "attn_inp_k_idxs_swa"),
                     c.new_input(GGMLType.I32, (t,), "attn_inp_v_idxs_swa"),
                     c.new_input(GGMLType.F16, (self.p.n_kv_swa, t), "attn_inp_kq_mask_swa"))
        out_ids = c.new_input(GGMLType.I32, (self.p.n_outputs,), "inp_out_ids")
        return IswaInputs(tokens, pos, k_idxs, v_idxs, mask, *extra, out_ids)

    def norm(self, x: Tensor, w: Tensor, name: str, il: int, norm_il: int | None = None) -> Tensor:
        """build_norm (RMS): RMS_NORM named norm-il (`norm` for il -1), MUL named by the caller's cb."""
        nil = il if norm_il is None else norm_il
        r = self.c.rms_norm(x, self.cfg.norm_eps, "norm" if nil < 0 else f"norm-{nil}")
        return self.c.mul(r, w, name if il < 0 else f"{name}-{il}")

    def qk(self, w: Tensor, norm_w: Tensor, cur: Tensor, n_head: int, tag: str, il: int, inp) -> Tensor:
        """Mat-mul, reshape to (head_dim, heads, tokens), QK-norm, NEOX rope with the layer's base."""
        c, cfg, t = self.c, self.cfg, self.p.n_tokens
        x = c.reshape(c.mul_mat(w, cur, f"{tag}-{il}"), (cfg.head_dim, n_head, t), f"{tag}-{il}")
        x = self.norm(x, norm_w, f"{tag}_normed", il)
        return c.rope(x, inp.pos, cfg.head_dim, cfg.rope_base_of(il), f"{tag}-{il}", mode=ROPE_NEOX)

    def attention(self, lay, il: int, cur: Tensor, inp: IswaInputs) -> Tensor:
        c, cfg, t = self.c, self.cfg, self.p.n_tokens
        q = self.qk(lay.wq, lay.attn_q_norm, cur, cfg.n_head, "Qcur", il, inp)
        k = self.qk(lay.wk, lay.attn_k_norm, cur, cfg.n_head_kv, "Kcur", il, inp)
        v = c.reshape(c.mul_mat(lay.wv, cur, f"Vcur-{il}"), (cfg.head_dim, cfg.n_head_kv, t), f"Vcur-{il}")
        # unnamed in llama.cpp (ggml_scale after the cb): labelled here
        q = c.scale(q, cfg.f_attention_scale, f"Qcur_scaled-{il}")
        return self.mha(q, *self.iswa_kv(lay, il, inp, q, k, v), lay, il)

    def iswa_kv(self, lay, il: int, inp, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """build_attn's start on the iSWA cache: Q, K, V expanded together, in this order; K and V written into
        layer il's cache (cpy_k, cpy_v: SET_ROWS of a VIEW); the cache views and the mask attention reads (the
        sliding window's on a SWA layer)."""
        c, g, cfg, t = self.c, self.g, self.cfg, self.p.n_tokens
        for x in (q, k, v):
            g.build_forward_expand(x)
        swa = cfg.is_swa(il)
        k_idxs, v_idxs = (inp.k_idxs_swa, inp.v_idxs_swa) if swa else (inp.k_idxs, inp.v_idxs)
        for cur_kv, cache, idxs in ((k, lay.k_cache, k_idxs), (v, lay.v_cache, v_idxs)):   # cpy_k, cpy_v
            rows = c.view(cur_kv, (cfg.n_embd_kv, t), (cur_kv.nb[0], cur_kv.nb[2]), 0)
            g.build_forward_expand(c.set_rows(cache, rows, idxs, f"{cache.name} (view)"))
        n_kv = self.p.n_kv_swa if swa else self.p.n_kv
        mask = inp.kq_mask_swa if swa else inp.kq_mask
        return self.cache_view(lay.k_cache, n_kv), self.cache_view(lay.v_cache, n_kv), mask

    def cache_view(self, cache: Tensor, n_kv: int) -> Tensor:
        """get_k / get_v (V not transposed under flash attention): the cache itself, (head_dim, n_head_kv,
        n_kv, 1) — a view of the cache tensor, not of the SET_ROWS node, as upstream."""
        cfg, es = self.cfg, cache.nb[0]
        return self.c.view(cache, (cfg.head_dim, cfg.n_head_kv, n_kv, 1),
                           (es, es * cfg.head_dim, es * cfg.n_embd_kv, es * cfg.n_embd_kv * cache.ne[1]), 0)

    def mha(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, lay, il: int) -> Tensor:
        """build_attn_mha with flash attention: Q's 4-d view (one stream), the permutes, FLASH_ATTN_EXT at
        scale 1 (Q was scaled), its 2-d reshape (kqv_out) and the output mat-mul."""
        c, t = self.c, self.p.n_tokens
        q = c.view(q, (q.ne[0], q.ne[1], t, 1), (q.nb[0], q.nb[1], q.nb[2], q.nb[2] * t), 0)
        q, k, v = (permute(c, x, (0, 2, 1, 3)) for x in (q, k, v))
        # unnamed in llama.cpp: labelled as graphdiag's llama graph labels it
        fa = c.new_tensor(GGMLType.F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), f"__fattn__-{il}",
                          Op.FLASH_ATTN_EXT, (q, k, v, mask))
        fa.set_param_f32(0, 1.0)
        kqv = c.reshape(fa, (fa.ne[0] * fa.ne[1], fa.ne[2] * fa.ne[3]), f"kqv_out-{il}")
        return c.mul_mat(lay.wo, kqv, f"attn_out-{il}")   # unnamed in llama.cpp

    def ffn(self, lay, il: int, cur: Tensor) -> Tensor:
        """build_ffn GELU/PAR: up, gate, GEGLU (split), down (cb'd ffn_out by gemma3.cpp)."""
        c = self.c
        up = c.mul_mat(lay.ffn_up, cur, f"ffn_up-{il}")
        gate = c.mul_mat(lay.ffn_gate, cur, f"ffn_gate-{il}")
        glu = c.glu_split(gate, up, GluOp.GEGLU, f"ffn_geglu-{il}")
        return c.mul_mat(lay.ffn_down, glu, f"ffn_out-{il}")

    def layer(self, lay, il: int, x: Tensor, inp: IswaInputs) -> Tensor:
        c = self.c
        cur = self.attention(lay, il, self.norm(x, lay.attn_norm, "attn_norm", il), inp)
        if il == self.cfg.n_layer - 1:
            cur = c.get_rows(cur, inp.out_ids, f"attn_out_rows-{il}")    # unnamed in llama.cpp
            x = c.get_rows(x, inp.out_ids, f"inp_rows-{il}")
        cur = self.norm(cur, lay.attn_post_norm, "attn_post_norm", il)
        sa_out = c.add(cur, x, f"sa_out-{il}")
        cur = self.ffn(lay, il, self.norm(sa_out, lay.ffn_norm, "ffn_norm", il))
        cur = self.norm(cur, lay.ffn_post_norm, "ffn_post_norm", il, norm_il=-1)
        return c.add(cur, sa_out, f"l_out-{il}")

    def build(self) -> BuiltGraph:
        """embd (build_inp_embd's cb), inp_scaled, the inputs, the layers, result_norm, result_output (tied:
        token_embd)."""
        c, cfg = self.c, self.cfg
        tokens = c.new_input(GGMLType.I32, (self.p.n_tokens,), "inp_tokens")
        x = c.scale(c.get_rows(self.m.tok_embd, tokens, "embd"), math.sqrt(cfg.n_embd), "inp_scaled")
        inp = self.inputs(tokens)
        for il, lay in enumerate(self.m.layers):
            x = self.layer(lay, il, x, inp)
        x = self.norm(x, self.m.output_norm, "result_norm", -1)
        logits = c.mul_mat(self.m.output, x, "result_output")
        logits.flags = logits.flags | TensorFlag.OUTPUT
        self.g.build_forward_expand(logits)
        return BuiltGraph(self.g, self.p, inp, logits)

"""The decode/prefill graph of one ubatch, built from graph params with ggml-style node names.

Only metadata is built (structs in the arena's compute region), so any preset builds without data. The build is
deterministic: after `arena.reset()` the same params give identical structs at identical addresses. Node order is
chosen as llama.cpp's, because the GPU runtime pattern-matches it: attn_norm feeds exactly the three mat-muls
Qcur/Kcur/Vcur (the concurrent-streams fork); ROPE(K), VIEW, SET_ROWS are consecutive (fused into one kernel
that writes the cache); ffn_gate, ffn_up, GLU are consecutive (fused gate/up mat-vec). The KQ mask follows
the model's upstream (Model.upstream): an F16 input flash attention reads as it is (llama.cpp 0c1e57098), or
an F32 input and a CPY casting it to F16 in layer 0's attention (ggml d99724f2's graphs here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.build import Ctx, contiguous_nb
from ..ir.dtypes import GGMLType
from ..ir.graph import Graph
from ..ir.ops import GluOp, TensorFlag
from ..ir.tensor import Tensor
from .presets import MOE_NORM_MIN
from .weights import Layer, Model

DECODE, PREFILL = "decode", "prefill"
KV_PAD = 256          # cells: n_kv is padded to a multiple of this (llama.cpp's kv-cache padding)
KQ_MASK_PAD = 1       # mask rows (tokens) padding, GGML_KQ_MASK_PAD (d99724f2; 0c1e57098 pads none)
CAST_MASK_UPSTREAM = "d99724f2"   # the upstream (config.UPSTREAMS) whose graphs cast an F32 KQ mask to F16


@dataclass(frozen=True)
class GraphParams:
    """What uniquely determines the graph's topology and shapes (llm_graph_params)."""

    n_tokens: int
    n_seqs: int
    n_outputs: int
    gtype: str        # DECODE | PREFILL
    n_kv: int         # KV cells the attention reads, padded to KV_PAD (capped at n_ctx)
    n_kv_swa: int = 0  # the same for the sliding-window cache of an iSWA model (0: none)

    def __post_init__(self):
        if self.gtype not in (DECODE, PREFILL):
            raise ValueError(f"graph type {self.gtype!r}")
        if not 0 <= self.n_outputs <= self.n_tokens:
            raise ValueError(f"n_outputs {self.n_outputs} not in 0..n_tokens ({self.n_tokens})")


@dataclass(frozen=True)
class GraphInputs:
    """Input tensors (flag INPUT); set_inputs fills them each step."""

    tokens: Tensor    # I32 (n_tokens)
    pos: Tensor       # I32 (n_tokens)
    kq_mask: Tensor   # (n_kv, n_tokens), 0 = visible, -inf = masked: F16 at 0c1e57098 (attn_inp_kq_mask);
    #                   F32, tokens padded to KQ_MASK_PAD, at d99724f2 (kq_mask)
    kq_mask_cnv: Tensor  # what flash attention reads: the mask itself (0c1e57098), its cast to F16 (a CPY
    #                      node, d99724f2)
    k_idxs: Tensor    # I32 (n_tokens): cache cell each token's K row is written to
    v_idxs: Tensor    # I32 (n_tokens)
    out_ids: Tensor   # I32 (n_outputs): token rows whose logits are computed (always built, as llama.cpp)


@dataclass(frozen=True)
class BuiltGraph:
    graph: Graph
    params: GraphParams
    inputs: GraphInputs
    logits: Tensor    # result_output: F32 (n_vocab, n_outputs), flag OUTPUT


def _pad(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class _Builder:
    TEMPLATES = True   # GraphTemplates may stamp this builder's graphs out again (one n_kv-shaped set)

    def __init__(self, model: Model, params: GraphParams):
        self.m, self.cfg, self.p = model, model.cfg, params
        self.ctx = Ctx(model.arena)
        self.g = Graph(model.arena)
        # (slot, layout(n_kv) -> (ne, nb)) of every tensor whose shape n_kv sets: all that GraphTemplates
        # rewrites to serve another n_kv
        self.n_kv_shaped: list[tuple[int, object]] = []

    def inputs(self, tokens: Tensor) -> GraphInputs:
        """The inputs made after the embedding, in llama.cpp's order: inputs are created where first used, so
        the first node (inp_embd) sits at the same address for every graph type (prefill and decode share the
        key). At 0c1e57098 (llama.cpp's build_inp_pos, build_attn_inp_kv, build_inp_out_ids): inp_pos, the
        cache's K and V cell indices, the KQ mask — F16 as flash attention reads it, no cast, no padding —
        and inp_out_ids. d99724f2's inputs: _inputs_cast."""
        if self.m.upstream == CAST_MASK_UPSTREAM:
            return self._inputs_cast(tokens)
        c, p = self.ctx, self.p
        t = p.n_tokens
        pos = c.new_input(GGMLType.I32, (t,), "inp_pos")
        k_idxs = c.new_input(GGMLType.I32, (t,), "k_idxs")
        v_idxs = c.new_input(GGMLType.I32, (t,), "v_idxs")
        mask_ne = _mask_layout(GGMLType.F16, t, pad=1)
        mask = c.new_input(GGMLType.F16, mask_ne(p.n_kv)[0], "attn_inp_kq_mask")
        self.n_kv_shaped.append((mask.idx, mask_ne))
        out_ids = c.new_input(GGMLType.I32, (p.n_outputs,), "inp_out_ids")
        return GraphInputs(tokens=tokens, pos=pos, kq_mask=mask, kq_mask_cnv=mask, k_idxs=k_idxs, v_idxs=v_idxs,
                           out_ids=out_ids)

    def _inputs_cast(self, tokens: Tensor) -> GraphInputs:
        """The inputs as graphdiag built them under d99724f2's rules: inp_pos, an F32 mask of tokens padded to
        KQ_MASK_PAD and its cast to F16 (a CPY node), inp_out_ids, then the K and V cell indices."""
        c, p = self.ctx, self.p
        t = p.n_tokens
        pos = c.new_input(GGMLType.I32, (t,), "inp_pos")
        mask_ne = _mask_layout(GGMLType.F32, t, KQ_MASK_PAD)
        mask = c.new_input(GGMLType.F32, mask_ne(p.n_kv)[0], "kq_mask")
        # made with the mask (build_attn_inp_kv), entered into the graph where layer 0's attention first
        # reads it: between that layer's Q/K/V fork and its join
        cnv = c.cast(mask, GGMLType.F16, f"{mask.name} (copy)")
        self.n_kv_shaped += [(mask.idx, mask_ne), (cnv.idx, _mask_layout(GGMLType.F16, t, KQ_MASK_PAD))]
        return GraphInputs(
            tokens=tokens,
            pos=pos,
            kq_mask=mask,
            kq_mask_cnv=cnv,
            # llama.cpp builds inp_out_ids even when every token is an output ("this would make the graph
            # topology depend on the number of output tokens"): the last layer always has two GET_ROWS
            out_ids=c.new_input(GGMLType.I32, (p.n_outputs,), "inp_out_ids"),
            k_idxs=c.new_input(GGMLType.I32, (t,), "k_idxs"),
            v_idxs=c.new_input(GGMLType.I32, (t,), "v_idxs"),
        )

    def norm(self, x: Tensor, w: Tensor, name: str, il: int | None) -> Tensor:
        """RMS_NORM (`norm-l`) then MUL by the weight (`name`)."""
        sfx = "" if il is None else f"-{il}"
        return self.ctx.mul(self.ctx.rms_norm(x, self.cfg.norm_eps, "norm" + sfx), w, name + sfx)

    def attention(self, lay: Layer, il: int, cur: Tensor, inp: GraphInputs) -> Tensor:
        """Q/K/V, rope, cache writes, flash attention and the output projection: (n_embd, n_tokens)."""
        c, g, cfg, t = self.ctx, self.g, self.cfg, self.p.n_tokens
        dkv = cfg.n_embd_kv
        q, k, v = self.qkv(lay, il, cur)
        q, k = self.rope_qk(lay, il, q, k, inp)
        # as llama.cpp's build_attn: Q, then V, then K last so ROPE(K) is followed by its cache write
        for x in (q, v, k):
            g.build_forward_expand(x)
        k2 = c.view(k, (dkv, t), (k.nb[0], k.nb[2], k.nb[2] * t, k.nb[2] * t), 0, f"{k.name} (view)")
        k_set = c.set_rows(lay.k_cache, k2, inp.k_idxs, f"cache_k_l{il} (set_rows)")
        g.build_forward_expand(k_set)
        v2 = c.reshape(v, (dkv, t), f"Vcur-{il} (reshaped 2d)")
        v_set = c.set_rows(lay.v_cache, v2, inp.v_idxs, f"cache_v_l{il} (set_rows)")
        g.build_forward_expand(v_set)
        k_all = self.cache_view(k_set, f"k-{il}")
        v_all = self.cache_view(v_set, f"v-{il}")
        fa = c.flash_attn_ext(q, k_all, v_all, inp.kq_mask_cnv, self.kq_scale(il), f"__fattn__-{il}")
        kqv = c.reshape(fa, (cfg.n_embd_q, t), f"kqv_out-{il}")
        return c.mul_mat(lay.wo, kqv, f"attn_out-{il}")

    # -- the architecture's hooks (model/arch/*: a subclass overrides what its graph does differently) ------
    def qkv(self, lay: Layer, il: int, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V as (head_dim, heads, n_tokens): llama.cpp's build_qkv over separate weights."""
        cfg = self.cfg
        return (self.projection(lay.wq, lay.bq, cur, "Qcur", il, cfg.n_head),
                self.projection(lay.wk, lay.bk, cur, "Kcur", il, cfg.n_head_kv),
                self.projection(lay.wv, lay.bv, cur, "Vcur", il, cfg.n_head_kv))

    def projection(self, w: Tensor, b: Tensor | None, cur: Tensor, name: str, il: int, heads: int) -> Tensor:
        """MUL_MAT, the bias ADD where the layer has one (both named `name-il`, as llama.cpp's callback names
        them), then the per-head reshape."""
        c = self.ctx
        x = c.mul_mat(w, cur, f"{name}-{il}")
        if b is not None:
            x = c.add(x, b, f"{name}-{il}")
        return c.reshape(x, (self.cfg.head_dim, heads, self.p.n_tokens), f"{name}-{il} (reshaped)")

    def rope_qk(self, lay: Layer, il: int, q: Tensor, k: Tensor, inp: GraphInputs) -> tuple[Tensor, Tensor]:
        """Q and K roped (the arch's rope type, the layer's base); qwen3/gemma3 norm them first."""
        return self.rope(q, il, inp, f"Qcur_rope-{il}"), self.rope(k, il, inp, f"Kcur_rope-{il}")

    def rope(self, x: Tensor, il: int, inp: GraphInputs, name: str) -> Tensor:
        cfg = self.cfg
        return self.ctx.rope(x, inp.pos, cfg.head_dim, self.rope_base(il), name, mode=cfg.rope_type)

    def rope_base(self, il: int) -> float:
        """The layer's rope frequency base (gemma3's sliding layers have their own)."""
        return self.cfg.rope_base

    def kq_scale(self, il: int) -> float:
        """Flash attention's KQ scale: 1/sqrt(head_dim) (llama, qwen2, qwen3)."""
        return 1.0 / math.sqrt(self.cfg.head_dim)

    def embed(self, tokens: Tensor) -> Tensor:
        """The token embedding rows (inp_embd); gemma3 scales them."""
        return self.ctx.get_rows(self.m.tok_embd, tokens, "inp_embd")

    def cache_view(self, cache_set: Tensor, name: str) -> Tensor:
        """The first n_kv cells of a cache as (head_dim, n_head_kv, n_kv); src[0] is the SET_ROWS node."""
        layout = _cache_view_layout(self.cfg, cache_set.nb[0])
        ne, nb = layout(self.p.n_kv)
        v = self.ctx.view(cache_set, ne[:3], nb, 0, name)
        self.n_kv_shaped.append((v.idx, layout))
        return v

    def ffn_dense(self, lay: Layer, il: int, cur: Tensor) -> Tensor:
        c = self.ctx
        gate = c.mul_mat(lay.ffn_gate, cur, f"ffn_gate-{il}")
        up = c.mul_mat(lay.ffn_up, cur, f"ffn_up-{il}")
        glu = c.glu_split(gate, up, GluOp.SWIGLU, f"ffn_swiglu-{il}")
        return c.mul_mat(lay.ffn_down, glu, f"ffn_down-{il}")

    def ffn_moe(self, lay: Layer, il: int, cur: Tensor) -> Tensor:
        """Router, top-k, expert mat-muls and the weighted sum over the used experts: (n_embd, n_tokens), as
        llama.cpp's build_moe_ffn with softmax gating, no expert bias, no shared experts, the weights applied
        after the experts, and norm_w when cfg.moe_norm_w (llama's MoE)."""
        c, g, cfg, t = self.ctx, self.g, self.cfg, cur.ne[1]
        k = cfg.n_expert_used
        probs = c.soft_max(c.mul_mat(lay.ffn_gate_inp, cur, f"ffn_moe_logits-{il}"), f"ffn_moe_probs-{il}")
        # ggml_argsort_top_k, as llama.cpp's build_moe_ffn (ARGSORT "ffn_moe_argsort" + VIEW "ffn_moe_topk")
        topk = c.argsort_top_k(probs, k, f"ffn_moe_topk-{il}", f"ffn_moe_argsort-{il}")
        probs3 = c.reshape(probs, (1, cfg.n_expert, t), f"ffn_moe_probs-{il} (reshaped)")
        weights = c.get_rows(probs3, topk, f"ffn_moe_weights-{il}")
        if cfg.moe_norm_w:
            weights = self.moe_norm_weights(weights, il, k, t)
        cur3 = c.reshape(cur, (cfg.n_embd, 1, t), f"ffn_moe_in-{il}")
        # router work first, so the expert ops form one contiguous run (one CPU split with --n-cpu-moe)
        g.build_forward_expand(weights)
        g.build_forward_expand(cur3)
        gate = c.mul_mat_id(lay.ffn_gate_exps, cur3, topk, f"ffn_moe_gate-{il}")
        up = c.mul_mat_id(lay.ffn_up_exps, cur3, topk, f"ffn_moe_up-{il}")
        glu = c.glu_split(gate, up, GluOp.SWIGLU, f"ffn_moe_swiglu-{il}")
        down = c.mul_mat_id(lay.ffn_down_exps, glu, topk, f"ffn_moe_down-{il}")
        weighted = c.mul(down, weights, f"ffn_moe_weighted-{il}")
        views = [c.view(weighted, (cfg.n_embd, t), (weighted.nb[0], weighted.nb[2], weighted.nb[2] * t, weighted.nb[2] * t),
                        i * weighted.nb[1],
                        f"ffn_moe_weighted-{il} (view {i})") for i in range(k)]
        for v in views:  # views before the adds, as llama.cpp's build_moe_ffn
            g.build_forward_expand(v)
        out = views[0]
        for i in range(1, k):
            out = c.add(out, views[i], f"ffn_moe_out-{il}" if i == k - 1 else f"ffn_moe_sum{i}-{il}")
        if k == 1:      # build_moe_ffn: "avoid returning a non-contiguous tensor"
            out = c.cont(out, f"ffn_moe_out-{il}")
        return out

    def moe_norm_weights(self, weights: Tensor, il: int, k: int, t: int) -> Tensor:
        """build_moe_ffn's norm_w (llama-graph.cpp 2148-2161 at 0c1e57098): the (1, k, T) router weights as
        (k, T), their SUM_ROWS, CLAMPed to [6.103515625e-5 (F16's smallest normal), inf], the weights DIVided by
        it, reshaped back to (1, k, T)."""
        c = self.ctx
        w2 = c.reshape(weights, (k, t), f"{weights.name} (reshaped)")
        total = c.sum_rows(w2, f"ffn_moe_weights_sum-{il}")
        total = c.clamp(total, MOE_NORM_MIN, math.inf, f"ffn_moe_weights_sum_clamped-{il}")
        norm = c.div(w2, total, f"ffn_moe_weights_norm-{il}")
        return c.reshape(norm, (1, k, t), f"{norm.name} (reshaped)")

    def layer(self, lay: Layer, il: int, x: Tensor, inp: GraphInputs) -> Tensor:
        c = self.ctx
        cur = self.attention(lay, il, self.norm(x, lay.attn_norm, "attn_norm", il), inp)
        if il == self.cfg.n_layer - 1:
            # only the output rows go on past the last attention (llama.cpp's inp_out_ids)
            cur = c.get_rows(cur, inp.out_ids, f"attn_out_rows-{il}")
            x = c.get_rows(x, inp.out_ids, f"inp_rows-{il}")
        ffn_inp = c.add(cur, x, f"ffn_inp-{il}")
        cur = self.norm(ffn_inp, lay.ffn_norm, "ffn_norm", il)
        cur = self.ffn_moe(lay, il, cur) if self.cfg.is_moe else self.ffn_dense(lay, il, cur)
        out = c.add(cur, ffn_inp, f"l_out-{il}")
        self.g.build_forward_expand(out)
        return out

    def build(self) -> BuiltGraph:
        tokens = self.ctx.new_input(GGMLType.I32, (self.p.n_tokens,), "inp_tokens")
        x = self.embed(tokens)
        inp = self.inputs(tokens)
        for il, lay in enumerate(self.m.layers):
            x = self.layer(lay, il, x, inp)
        x = self.norm(x, self.m.output_norm, "result_norm", None)
        logits = self.ctx.mul_mat(self.m.output, x, "result_output")
        logits.flags = logits.flags | TensorFlag.OUTPUT
        self.g.build_forward_expand(logits)
        return BuiltGraph(self.g, self.p, inp, logits)


def _mask_layout(t: GGMLType, n_tokens: int, pad: int):
    """(ne, nb) of the KQ mask (or its cast) of type t for a given n_kv: (n_kv, tokens padded to `pad`),
    contiguous; one stream (graphdiag's KV cache is unified, as llama.cpp's with kv_unified)."""
    def layout(n_kv: int):
        ne = (n_kv, _pad(n_tokens, pad), 1, 1)
        return ne, contiguous_nb(t, ne)
    return layout


def _cache_view_layout(cfg, es: int):
    """(ne, nb) of the first n_kv cells of a cache of `es`-byte elements, as (head_dim, n_head_kv, n_kv)."""
    def layout(n_kv: int):
        return ((cfg.head_dim, cfg.n_head_kv, n_kv, 1),
                (es, es * cfg.head_dim, es * cfg.n_embd_kv, es * cfg.n_embd_kv * n_kv))
    return layout


def build_graph(model: Model, params: GraphParams, templates: "GraphTemplates | None" = None) -> BuiltGraph:
    """Build the ubatch's graph in the arena's compute region (call `arena.reset()` first to rebuild); with
    `templates`, a graph of the same shape built before is stamped out instead (the same structs)."""
    if params.n_kv > model.cfg.n_ctx:
        raise ValueError(f"n_kv {params.n_kv} > n_ctx {model.cfg.n_ctx}")
    if templates is not None and _stampable(model) and builder_for(model).TEMPLATES:
        return templates.build(model, params)
    return builder_for(model)(model, params).build()


def builder_for(model: Model) -> type["_Builder"]:
    """The graph builder of the model's architecture (model/arch/: the registry)."""
    from .arch import get_arch
    return get_arch(model.cfg.arch).Builder


def _stampable(model: Model) -> bool:
    """Whether GraphTemplates may stamp the arch's graphs: it rewrites one set of n_kv-shaped tensors, so an
    arch whose graphs have others (gemma3's SWA cache) sets STAMPABLE = False and is built afresh."""
    from .arch import get_arch
    return getattr(get_arch(model.cfg.arch), "STAMPABLE", True)


def padded_n_kv(used_cells: int, n_ctx: int) -> int:
    """llama.cpp's n_kv: cells in use (highest used cell + 1) padded to KV_PAD, at most n_ctx."""
    return min(n_ctx, max(KV_PAD, _pad(used_cells, KV_PAD)))

"""The graph builder's public interface, as llama.cpp's llm_graph_context serves src/models/*.cpp.

The architecture modules (model/arch/) build on `GraphContext` and its layer pieces, named as upstream names
them: build_inp_embd, build_norm, build_qkv, build_attn (cpy_k, cpy_v, get_k, get_v, build_attn_mha),
build_ffn, build_moe_ffn. This module imports no architecture; the registry (model/arch/__init__.py) sits
above it, and model/build.py picks an architecture's builder from the registry.

Only metadata is built (structs in the arena's compute region), so any preset builds without data. The build is
deterministic: after `arena.reset()` the same params give identical structs at identical addresses. Node for
node as llama.cpp 0c1e57098 with flash attention and a unified KV cache: the same ops, types, shapes and, where
upstream names a node (its `cb` names, ggml's "(view)"/"(reshaped)"/"(permuted)" suffixes), the same names
(tests/unit/test_upstream_nodes.py holds them against llama.cpp's own scheduler). A node upstream leaves
unnamed (ggml names it `node_<index>`) gets a label here: `__fattn__-il`, `attn_out-il` (qwen2/qwen3),
`attn_out_rows-il`, `inp_rows-il`. The order is llama.cpp's, which the GPU runtime pattern-matches:
attn_norm feeds exactly the three mat-muls Qcur/Kcur/Vcur (the concurrent-streams fork); ROPE(K), VIEW,
SET_ROWS are consecutive (fused into one kernel that writes the cache); ffn_gate, ffn_up, GLU are
consecutive (fused gate/up mat-vec). The KQ mask follows the model's upstream (Model.upstream): an F16
input flash attention reads as it is (llama.cpp 0c1e57098), or an F32 input and a CPY casting it to F16 in
layer 0's attention (ggml d99724f2's graphs here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir.build import Ctx, contiguous_nb
from ..ir.dtypes import GGMLType
from ..ir.graph import Graph
from ..ir.ops import GluOp, Op, TensorFlag
from ..ir.tensor import Tensor
from .presets import MOE_NORM_MIN

if TYPE_CHECKING:                      # annotations only: weights imports the registry, which imports this
    from .weights import Layer, Model

DECODE, PREFILL = "decode", "prefill"
KV_PAD = 256          # cells: n_kv is padded to a multiple of this (llama.cpp's kv-cache padding)
KQ_MASK_PAD = 1       # mask rows (tokens) padding, GGML_KQ_MASK_PAD (d99724f2; 0c1e57098 pads none)
CAST_MASK_UPSTREAM = "d99724f2"   # the upstream (config.UPSTREAMS) whose graphs cast an F32 KQ mask to F16
SWAP_1_2 = (0, 2, 1, 3)           # build_attn_mha's permute of q, k and v


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


def permute(c: Ctx, a: Tensor, axes: tuple, name: str = "") -> Tensor:
    """ggml_permute: source dim i becomes dim axes[i] (a view; op_params hold the axes), named as ggml names
    it ("<source> (permuted)") unless `name` is given."""
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    x = c.new_tensor(a.type, ne, name or f"{a.name} (permuted)", Op.PERMUTE, (a,), a, 0, nb)
    for i, ax in enumerate(axes):
        x.set_param_i32(i, ax)
    return x


class GraphContext:
    """One ubatch's graph of a llama-family model (llama's own graph, src/models/llama.cpp); an architecture
    subclasses it where its graph differs (a hook: build_rope_qk, build_ffn_out_name, ...)."""

    TEMPLATES = True   # GraphTemplates may stamp this builder's graphs out again (one n_kv-shaped set)
    ATTN_OUT = "attn_out"   # the attention output mat-mul's name (llama cb's it; qwen2/qwen3 leave it unnamed)

    def __init__(self, model: Model, params: GraphParams):
        self.m, self.cfg, self.p = model, model.cfg, params
        self.ctx = Ctx(model.arena)
        self.g = Graph(model.arena)
        # (slot, layout(n_kv) -> (ne, nb)) of every tensor whose shape n_kv sets: all that GraphTemplates
        # rewrites to serve another n_kv
        self.n_kv_shaped: list[tuple[int, object]] = []

    # -- inputs ---------------------------------------------------------------------------------------------
    def build_inp_embd(self, tokens: Tensor) -> Tensor:
        """The token embedding rows: GET_ROWS named `embd` (build_inp_embd's cb)."""
        x = self.ctx.get_rows(self.m.tok_embd, tokens, "embd")
        self.g.build_forward_expand(x)
        return x

    def build_inputs(self, tokens: Tensor) -> GraphInputs:
        """The inputs made after the embedding, in llama.cpp's order: inputs are created where first used, so
        the first node (embd) sits at the same address for every graph type (prefill and decode share the
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

    # -- the layer pieces -----------------------------------------------------------------------------------
    def build_norm(self, x: Tensor, w: Tensor, name: str, il: int | None) -> Tensor:
        """build_norm (RMS): RMS_NORM (`norm-il`) then MUL by the weight, named by the caller's cb (`name-il`)."""
        sfx = "" if il is None else f"-{il}"
        return self.ctx.mul(self.ctx.rms_norm(x, self.cfg.norm_eps, "norm" + sfx), w, name + sfx)

    def build_qkv(self, lay: Layer, il: int, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V as (head_dim, heads, n_tokens): llama.cpp's build_qkv over separate weights."""
        cfg = self.cfg
        return (self._projection(lay.wq, lay.bq, cur, "Qcur", il, cfg.n_head),
                self._projection(lay.wk, lay.bk, cur, "Kcur", il, cfg.n_head_kv),
                self._projection(lay.wv, lay.bv, cur, "Vcur", il, cfg.n_head_kv))

    def _projection(self, w: Tensor, b: Tensor | None, cur: Tensor, name: str, il: int, heads: int) -> Tensor:
        """MUL_MAT, the bias ADD where the layer has one, the per-head RESHAPE: all three named `name-il`
        (build_qkv cb's each)."""
        c, nm = self.ctx, f"{name}-{il}"
        x = c.mul_mat(w, cur, nm)
        if b is not None:
            x = c.add(x, b, nm)
        return c.reshape(x, (self.cfg.head_dim, heads, self.p.n_tokens), nm)

    def build_rope_qk(self, lay: Layer, il: int, q: Tensor, k: Tensor, inp: GraphInputs) -> tuple[Tensor, Tensor]:
        """Q and K roped (the arch's rope type, the layer's base), named Qcur-il / Kcur-il (the model's cb);
        qwen3 norms them first."""
        return self.rope(q, il, inp, f"Qcur-{il}"), self.rope(k, il, inp, f"Kcur-{il}")

    def rope(self, x: Tensor, il: int, inp: GraphInputs, name: str) -> Tensor:
        cfg = self.cfg
        return self.ctx.rope(x, inp.pos, cfg.head_dim, self.rope_base(il), name, mode=cfg.rope_type)

    def rope_base(self, il: int) -> float:
        """The layer's rope frequency base."""
        return self.cfg.rope_base

    def kq_scale(self, il: int) -> float:
        """Flash attention's KQ scale: 1/sqrt(head_dim) (llama, qwen2, qwen3)."""
        return 1.0 / math.sqrt(self.cfg.head_dim)

    def build_attn(self, lay: Layer, il: int, q: Tensor, k: Tensor, v: Tensor, inp: GraphInputs) -> Tensor:
        """build_attn over the unified KV cache: Q, V, then K expanded (K last, so ROPE(K) is followed by its
        cache write), the cache writes (cpy_k, cpy_v), the cache views (get_k, get_v), build_attn_mha and the
        output mat-mul: (n_embd, n_tokens)."""
        g = self.g
        for x in (q, v, k):
            g.build_forward_expand(x)
        k_set = self.cpy_k(lay.k_cache, k, inp.k_idxs)
        g.build_forward_expand(k_set)
        v_set = self.cpy_v(lay.v_cache, v, inp.v_idxs)
        g.build_forward_expand(v_set)
        kqv = self.build_attn_mha(q, self.get_k(k_set, lay.k_cache), self.get_v(v_set, lay.v_cache),
                                  inp.kq_mask_cnv, self.kq_scale(il), il)
        return self.ctx.mul_mat(lay.wo, kqv, f"{self.ATTN_OUT}-{il}")

    def cpy_k(self, cache: Tensor, cur: Tensor, idxs: Tensor) -> Tensor:
        """llama_kv_cache::cpy_k: the (head_dim, heads, tokens) rows as a 2-d VIEW (dims 0 and 1 merged,
        `<cur> (view)`), SET_ROWS into the cache (a view of it: `<cache> (view)`)."""
        rows = self.ctx.view(cur, (cur.ne[0] * cur.ne[1], cur.ne[2]), (cur.nb[0], cur.nb[2]), 0)
        return self.ctx.set_rows(cache, rows, idxs, f"{cache.name} (view)")

    def cpy_v(self, cache: Tensor, cur: Tensor, idxs: Tensor) -> Tensor:
        """llama_kv_cache::cpy_v with flash attention (V not transposed): as cpy_k."""
        return self.cpy_k(cache, cur, idxs)

    def get_k(self, cache_set: Tensor, cache: Tensor) -> Tensor:
        """get_k / get_v: the first n_kv cells as (head_dim, n_head_kv, n_kv, 1), named `<cache> (view)` as
        upstream's view of the cache tensor. Its source is the cache's SET_ROWS node (a view of the same bytes
        at offset 0), so the attention's dependence on this step's cache write is an edge of the graph."""
        layout = _cache_view_layout(self.cfg, cache_set.nb[0])
        ne, nb = layout(self.p.n_kv)
        v = self.ctx.view(cache_set, ne, nb, 0, f"{cache.name} (view)")
        self.n_kv_shaped.append((v.idx, layout))
        return v

    def get_v(self, cache_set: Tensor, cache: Tensor) -> Tensor:
        """get_v with flash attention (V not transposed): as get_k."""
        return self.get_k(cache_set, cache)

    def build_attn_mha(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, kq_scale: float, il: int) -> Tensor:
        """build_attn_mha with flash attention, one stream: Q's 4-d VIEW, the (0, 2, 1, 3) PERMUTEs of q, k and
        v, FLASH_ATTN_EXT (unnamed upstream: `__fattn__-il`) and its 2-d RESHAPE `kqv_out-il`."""
        c, t = self.ctx, q.ne[2]
        q = c.view(q, (q.ne[0], q.ne[1], t, 1), (q.nb[0], q.nb[1], q.nb[2], q.nb[2] * t), 0)
        q = permute(c, q, SWAP_1_2)
        k, v = (self._permuted_n_kv(x) for x in (k, v))
        fa = c.new_tensor(GGMLType.F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), f"__fattn__-{il}",
                          Op.FLASH_ATTN_EXT, (q, k, v, mask))
        fa.set_param_f32(0, kq_scale)
        return c.reshape(fa, (fa.ne[0] * fa.ne[1], fa.ne[2] * fa.ne[3]), f"kqv_out-{il}")

    def _permuted_n_kv(self, view: Tensor) -> Tensor:
        """A cache view's (0, 2, 1, 3) permute, registered as n_kv-shaped with the view's layout permuted."""
        x = permute(self.ctx, view, SWAP_1_2)
        layout = _cache_view_layout(self.cfg, view.nb[0])
        self.n_kv_shaped.append((x.idx, lambda n_kv: _swapped_1_2(*layout(n_kv))))
        return x

    def build_ffn(self, lay: Layer, il: int, cur: Tensor) -> Tensor:
        """build_ffn SILU/PAR: gate, up, SWIGLU (split), down — named ffn_out-il by the model's cb."""
        c = self.ctx
        gate = c.mul_mat(lay.ffn_gate, cur, f"ffn_gate-{il}")
        up = c.mul_mat(lay.ffn_up, cur, f"ffn_up-{il}")
        glu = c.glu_split(gate, up, GluOp.SWIGLU, f"ffn_swiglu-{il}")
        return c.mul_mat(lay.ffn_down, glu, f"ffn_out-{il}")

    def build_moe_ffn(self, lay: Layer, il: int, cur: Tensor) -> Tensor:
        """Router, top-k, expert mat-muls and the weighted sum over the used experts: (n_embd, n_tokens), as
        llama.cpp's build_moe_ffn with softmax gating, no expert bias, no shared experts, the weights applied
        after the experts, and norm_w when cfg.moe_norm_w (llama's MoE)."""
        c, g, cfg, t = self.ctx, self.g, self.cfg, cur.ne[1]
        k = cfg.n_expert_used
        probs = c.soft_max(c.mul_mat(lay.ffn_gate_inp, cur, f"ffn_moe_logits-{il}"), f"ffn_moe_probs-{il}")
        # ggml_argsort_top_k, as llama.cpp's build_moe_ffn (ARGSORT "ffn_moe_argsort" + VIEW "ffn_moe_topk")
        topk = c.argsort_top_k(probs, k, f"ffn_moe_topk-{il}", f"ffn_moe_argsort-{il}")
        probs3 = c.reshape(probs, (1, cfg.n_expert, t))
        weights = c.get_rows(probs3, topk, f"ffn_moe_weights-{il}")
        if cfg.moe_norm_w:
            weights = self._moe_norm_weights(weights, il, k, t)
        cur3 = c.reshape(cur, (cfg.n_embd, 1, t))
        # router work first, so the expert ops form one contiguous run (one CPU split with --n-cpu-moe)
        g.build_forward_expand(weights)
        g.build_forward_expand(cur3)
        gate = c.mul_mat_id(lay.ffn_gate_exps, cur3, topk, f"ffn_moe_gate-{il}")
        up = c.mul_mat_id(lay.ffn_up_exps, cur3, topk, f"ffn_moe_up-{il}")
        glu = c.glu_split(gate, up, GluOp.SWIGLU, f"ffn_moe_swiglu-{il}")
        down = c.mul_mat_id(lay.ffn_down_exps, glu, topk, f"ffn_moe_down-{il}")
        weighted = c.mul(down, weights, f"ffn_moe_weighted-{il}")
        nb = weighted.nb
        views = [c.view(weighted, (cfg.n_embd, t), (nb[0], nb[2], nb[2] * t, nb[2] * t), i * nb[1])
                 for i in range(k)]
        for v in views:  # views before the adds, as llama.cpp's build_moe_ffn
            g.build_forward_expand(v)
        out = views[0]
        for i in range(1, k):
            out = c.add(out, views[i], f"ffn_moe_out-{il}" if i == k - 1 else f"ffn_moe_sum{i}-{il}")
        if k == 1:      # build_moe_ffn: "avoid returning a non-contiguous tensor"
            out = c.cont(out, f"ffn_moe_out-{il}")
        return out

    def _moe_norm_weights(self, weights: Tensor, il: int, k: int, t: int) -> Tensor:
        """build_moe_ffn's norm_w (llama-graph.cpp 2148-2161 at 0c1e57098): the (1, k, T) router weights as
        (k, T), their SUM_ROWS, CLAMPed to [6.103515625e-5 (F16's smallest normal), inf], the weights DIVided by
        it, reshaped back to (1, k, T)."""
        c = self.ctx
        w2 = c.reshape(weights, (k, t))
        total = c.sum_rows(w2, f"ffn_moe_weights_sum-{il}")
        total = c.clamp(total, MOE_NORM_MIN, math.inf, f"ffn_moe_weights_sum_clamped-{il}")
        norm = c.div(w2, total, f"ffn_moe_weights_norm-{il}")
        return c.reshape(norm, (1, k, t))

    def build_layer(self, lay: Layer, il: int, x: Tensor, inp: GraphInputs) -> Tensor:
        """One layer as src/models/llama.cpp (qwen2.cpp, qwen3.cpp) builds it."""
        c = self.ctx
        cur = self.build_norm(x, lay.attn_norm, "attn_norm", il)
        q, k, v = self.build_qkv(lay, il, cur)
        q, k = self.build_rope_qk(lay, il, q, k, inp)
        cur = self.build_attn(lay, il, q, k, v, inp)
        if il == self.cfg.n_layer - 1:
            # only the output rows go on past the last attention (llama.cpp's inp_out_ids; unnamed upstream)
            cur = c.get_rows(cur, inp.out_ids, f"attn_out_rows-{il}")
            x = c.get_rows(x, inp.out_ids, f"inp_rows-{il}")
        ffn_inp = c.add(cur, x, f"ffn_inp-{il}")
        cur = self.build_norm(ffn_inp, lay.ffn_norm, "ffn_norm", il)
        cur = self.build_moe_ffn(lay, il, cur) if self.cfg.is_moe else self.build_ffn(lay, il, cur)
        out = c.add(cur, ffn_inp, f"l_out-{il}")
        self.g.build_forward_expand(out)
        return out

    def build(self) -> BuiltGraph:
        tokens = self.ctx.new_input(GGMLType.I32, (self.p.n_tokens,), "inp_tokens")
        x = self.build_inp_embd(tokens)
        inp = self.build_inputs(tokens)
        for il, lay in enumerate(self.m.layers):
            x = self.build_layer(lay, il, x, inp)
        x = self.build_norm(x, self.m.output_norm, "result_norm", None)
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


def _swapped_1_2(ne, nb):
    """(ne, nb) with dims 1 and 2 swapped: a (0, 2, 1, 3) permute's layout."""
    return (ne[0], ne[2], ne[1], ne[3]), (nb[0], nb[2], nb[1], nb[3])

"""gpt-oss (LLM_ARCH_OPENAI_MOE: gpt-oss-20b, gpt-oss-120b), as llama.cpp 0c1e57098's src/models/openai-moe.cpp
builds it.

Per layer: attn_norm (RMS_NORM, MUL); Q/K/V mat-muls each followed by its bias ADD and the per-head RESHAPE
(build_qkv); NEOX rope at the layer's base (rope.freq_base_swa on sliding layers, which defaults to
rope.freq_base, not to 10 000 as gemma3's); K and V into the layer's cache of llama.cpp's iSWA cache; flash
attention at scale 1/sqrt(head_dim) with the layer's `attn_sinks` (one learned logit per head, src[4] of
FLASH_ATTN_EXT: it joins each row's softmax denominator and adds no value); attn_output's mat-mul and bias ADD
(`attn_out-il`); residual ADD `ffn_inp-il`; post_attention_norm (RMS, `attn_post_norm-il`: gpt-oss's only
pre-FFN norm); build_moe_ffn with LLM_FFN_SWIGLU_OAI_MOE and LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT:
the router's logits plus its bias (`ffn_moe_probs-il`: the biased logits are the probs), their top k by
ARGSORT, the k chosen logits' softmax as the weights (no norm_w, no scale: expert_weights_scale is never read),
each expert's gate and up mat-muls with their biases (ADD_ID: row ids[i, t] of the (width, n_expert) bias),
the clamped SwiGLU (GLU SWIGLU_OAI, alpha 1.702, limit 7), down and its bias, the weighted sum; residual ADD
`l_out-il`. Layer il slides when il % 2 == 0 (load_swa_pattern(ml, 2): the window on every other layer,
starting with layer 0) unless the file gives the pattern. Untied output (output.weight is required).

Required keys: attention.sliding_window, expert_feed_forward_length, expert_count, expert_used_count and the
common ones (common.base_config). Rope scaling as llama.cpp reads it for gpt-oss: rope.scaling.type `yarn` (the
released files': factor 32, original_context_length 4096) scales every layer's rope (presets.GptOssConfig.yarn:
llama_context's ext_factor 1, attn_factor, beta_fast 32, beta_slow 1; original_context_length defaults to
context_length), `none` or `linear` at factor 1 is none, linear at another factor is refused (graphdiag's
rope has no linear scaling). Refused too: a fused attn_qkv and the per-weight scales. Q/K/V biases are optional to llama.cpp's loader (create_tensor_qkv) and to graphdiag; every other
bias, the sinks and the post-attention norm are required.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...ir.dtypes import GGMLType
from ...ir.ops import Op, TensorFlag
from ...ir.tensor import Tensor
from ..graph_context import SWAP_1_2, BuiltGraph, permute
from ..presets import ROPE_NEOX, GptOssConfig, ModelConfig, swa_pattern
from ..reference_base import F64, ReferenceBase, SeqCache, rms_norm, rope_pairs, softmax
from .common import (BIAS, NORM, ROUTER, WEIGHT, Meta, TensorSpec, base_config, expert_counts, refuse_present,
                     sliding_window_layers)
from .gemma3 import kv_layers  # noqa: F401  (the registry's name: the iSWA cache's layers)
from .gemma3_graph import Builder as IswaBuilder
from .gemma3_graph import IswaInputs

NAME = "gpt-oss"
ROPE_TYPE = ROPE_NEOX
EXPERTS = (True,)                             # its graph always has experts
EXPERT_FF_KEY = "expert_feed_forward_length"
SWA_PATTERN = 2                               # load_swa_pattern(ml, 2): what an absent pattern key means
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0       # build_moe_ffn's LLM_FFN_SWIGLU_OAI_MOE constants
UNSUPPORTED = ("attn_qkv.weight", "attn_qkv.bias")


def config(meta: Meta) -> GptOssConfig:
    refuse_present(meta, UNSUPPORTED)
    n_expert, n_used = expert_counts(meta)
    if not n_expert:
        raise meta.fail(f"{NAME}.expert_count is missing or 0: llama.cpp's {NAME} needs experts")
    base = base_config(meta, ff_required=False, own_rope_scaling=True, rope_type=ROPE_TYPE)
    n_swa = meta.need("attention.sliding_window")
    layers = sliding_window_layers(meta, NAME, base.n_layer, SWA_PATTERN)
    fields = dataclasses.asdict(base)
    fields.update(n_ff=0, n_ff_exp=meta.need(EXPERT_FF_KEY), n_expert=n_expert, n_expert_used=n_used,
                  moe_norm_w=False, tied_output=False)
    return GptOssConfig(**fields, n_swa=n_swa, swa_layers=layers,
                        rope_base_swa=meta.finite("rope.freq_base_swa", base.rope_base, positive=True),
                        **_yarn_fields(meta))


def _yarn_fields(meta: Meta) -> dict:
    """GptOssConfig's YaRN fields from rope.scaling.* (llama_model_base::load_hparams' reading), {} for none."""
    kind = meta.get("rope.scaling.type", "linear")
    factor = meta.real("rope.scaling.factor", meta.real("rope.scale_linear", 0.0))
    if kind == "yarn":
        if not (factor >= 0 and np.isfinite(factor)):
            raise meta.fail(f"{NAME}.rope.scaling.factor {factor} is not a non-negative finite number")
        orig = meta.count("rope.scaling.original_context_length", 0) or meta.need("context_length")
        return dict(yarn_factor=factor or 1.0, yarn_orig_ctx=orig,
                    yarn_attn_factor=meta.finite("rope.scaling.attn_factor", 1.0, positive=True))
    if kind == "none" or (kind == "linear" and factor in (0.0, 1.0)):
        return {}
    raise meta.fail(f"rope scaling ({NAME}.rope.scaling.type {kind!r}, factor {factor}) is not computed by "
                    f"graphdiag (YaRN is)")


def layer_specs(cfg: ModelConfig, il: int):
    """load_arch_tensors' order for one layer: the weights, then the biases."""
    p, d, q, kv, e, f = f"blk.{il}.", cfg.n_embd, cfg.n_embd_q, cfg.n_embd_kv, cfg.n_expert, cfg.n_ff_exp
    rows = [("attn_norm.weight", (d,), NORM, "attn_norm"), ("post_attention_norm.weight", (d,), NORM, "attn_post_norm"),
            ("attn_q.weight", (d, q), WEIGHT, "wq"), ("attn_k.weight", (d, kv), WEIGHT, "wk"),
            ("attn_v.weight", (d, kv), WEIGHT, "wv")]
    if cfg.qkv_bias:
        rows += [("attn_q.bias", (q,), BIAS, "bq"), ("attn_k.bias", (kv,), BIAS, "bk"), ("attn_v.bias", (kv,), BIAS, "bv")]
    rows += [("attn_output.weight", (q, d), WEIGHT, "wo"), ("attn_sinks.weight", (cfg.n_head,), BIAS, "attn_sinks"),
             ("ffn_gate_inp.weight", (d, e), ROUTER, "ffn_gate_inp"),
             ("ffn_gate_exps.weight", (d, f, e), WEIGHT, "ffn_gate_exps"),
             ("ffn_down_exps.weight", (f, d, e), WEIGHT, "ffn_down_exps"),
             ("ffn_up_exps.weight", (d, f, e), WEIGHT, "ffn_up_exps"),
             ("attn_output.bias", (d,), BIAS, "bo"), ("ffn_gate_inp.bias", (e,), BIAS, "ffn_gate_inp_b"),
             ("ffn_gate_exps.bias", (f, e), BIAS, "ffn_gate_exps_b"),
             ("ffn_down_exps.bias", (d, e), BIAS, "ffn_down_exps_b"),
             ("ffn_up_exps.bias", (f, e), BIAS, "ffn_up_exps_b")]
    for n, ne, kind, fld in rows:
        yield TensorSpec(p + n, ne, kind, fld, il)


def tensors(cfg: ModelConfig) -> list[TensorSpec]:
    """token_embd, output_norm, output, then the layers: llama.cpp's gpt-oss load order."""
    d = cfg.n_embd
    out = [TensorSpec("token_embd.weight", (d, cfg.n_vocab), WEIGHT, "tok_embd"),
           TensorSpec("output_norm.weight", (d,), NORM, "output_norm"),
           TensorSpec("output.weight", (d, cfg.n_vocab), WEIGHT, "output")]
    for il in range(cfg.n_layer):
        out += layer_specs(cfg, il)
    return out


def preset(cfg: ModelConfig) -> GptOssConfig:
    """A MoE preset as gpt-oss (export-gguf --arch gpt-oss): the Q/K/V biases, untied output, window 128 on
    every other layer, NEOX rope; a gpt-oss preset (gpt-oss-tiny) as it is. A dense preset is refused by
    export-gguf (EXPERTS)."""
    if isinstance(cfg, GptOssConfig) and cfg.arch == NAME:
        return cfg
    base = dataclasses.replace(cfg, arch=NAME, rope_type=ROPE_TYPE, tied_output=False, qkv_bias=True, moe_norm_w=False)
    return GptOssConfig(**dataclasses.asdict(base), n_swa=128, swa_layers=swa_pattern(cfg.n_layer, SWA_PATTERN),
                        rope_base_swa=cfg.rope_base)


class Builder(IswaBuilder):
    """openai-moe.cpp's graph over the iSWA inputs (gemma3_graph's: the two caches' indices and masks)."""

    def rope_base(self, il: int) -> float:
        return self.cfg.rope_base_of(il)

    def rope(self, x: Tensor, il: int, inp, name: str) -> Tensor:
        """ggml_rope_ext, NEOX, the layer's base, the file's YaRN on every layer."""
        cfg = self.cfg
        return self.c.rope(x, inp.pos, cfg.head_dim, self.rope_base(il), name, mode=ROPE_NEOX, yarn=cfg.yarn())

    def attention(self, lay, il: int, cur: Tensor, inp: IswaInputs) -> Tensor:
        """build_qkv (biases), NEOX rope, build_attn over the layer's cache with its sinks; `attn_out-il` is
        the output bias ADD (its mat-mul is unnamed upstream: labelled `kqv_wo-il`, the cb name upstream
        leaves commented out)."""
        c = self.c
        q, k, v = self.build_qkv(lay, il, cur)
        q = self.rope(q, il, inp, f"Qcur-{il}")
        k = self.rope(k, il, inp, f"Kcur-{il}")
        k_view, v_view, mask = self.iswa_kv(lay, il, inp, q, k, v)
        kqv = self.mha_sinks(q, k_view, v_view, mask, lay.attn_sinks, il)
        return c.add(c.mul_mat(lay.wo, kqv, f"kqv_wo-{il}"), lay.bo, f"attn_out-{il}")

    def mha_sinks(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor, il: int) -> Tensor:
        """build_attn_mha with flash attention and sinks: Q's 4-d view, the permutes, FLASH_ATTN_EXT at scale
        1/sqrt(head_dim) with src[4] = sinks (ggml_flash_attn_ext_add_sinks), its 2-d reshape (kqv_out)."""
        c, t = self.c, self.p.n_tokens
        q = c.view(q, (q.ne[0], q.ne[1], t, 1), (q.nb[0], q.nb[1], q.nb[2], q.nb[2] * t), 0)
        q, k, v = (permute(c, x, SWAP_1_2) for x in (q, k, v))
        fa = c.new_tensor(GGMLType.F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), f"__fattn__-{il}",
                          Op.FLASH_ATTN_EXT, (q, k, v, mask, sinks))
        fa.set_param_f32(0, 1.0 / math.sqrt(self.cfg.head_dim))
        return c.reshape(fa, (fa.ne[0] * fa.ne[1], fa.ne[2] * fa.ne[3]), f"kqv_out-{il}")

    def moe(self, lay, il: int, cur: Tensor) -> Tensor:
        """build_moe_ffn with gpt-oss's arguments (the module docstring); (n_embd, n_tokens)."""
        c, g, cfg, t = self.c, self.g, self.cfg, cur.ne[1]
        k = cfg.n_expert_used
        logits = c.mul_mat(lay.ffn_gate_inp, cur, f"ffn_moe_logits-{il}")
        probs = c.add(logits, lay.ffn_gate_inp_b, f"ffn_moe_probs-{il}")    # SOFTMAX_WEIGHT: probs = logits
        topk = c.argsort_top_k(probs, k, f"ffn_moe_topk-{il}", f"ffn_moe_argsort-{il}")
        weights = c.get_rows(c.reshape(probs, (1, cfg.n_expert, t)), topk, f"ffn_moe_weights-{il}")
        sm = c.soft_max(c.reshape(weights, (k, t)), f"ffn_moe_weights_sm-{il}")   # unnamed upstream
        weights = c.reshape(sm, (1, k, t), f"ffn_moe_weights_softmax-{il}")
        g.build_forward_expand(weights)
        cur3 = c.reshape(cur, (cfg.n_embd, 1, t))
        gate = c.add_id(c.mul_mat_id(lay.ffn_gate_exps, cur3, topk, f"ffn_moe_gate-{il}"), lay.ffn_gate_exps_b, topk,
                        f"ffn_moe_gate_biased-{il}")
        up = c.add_id(c.mul_mat_id(lay.ffn_up_exps, cur3, topk, f"ffn_moe_up-{il}"), lay.ffn_up_exps_b, topk,
                      f"ffn_moe_up_biased-{il}")
        glu = c.swiglu_oai(gate, up, SWIGLU_ALPHA, SWIGLU_LIMIT, f"ffn_moe_swiglu_oai-{il}")
        down = c.add_id(c.mul_mat_id(lay.ffn_down_exps, glu, topk, f"ffn_moe_down-{il}"), lay.ffn_down_exps_b, topk,
                        f"ffn_moe_down_biased-{il}")
        weighted = c.mul(down, weights, f"ffn_moe_weighted-{il}")
        g.build_forward_expand(weighted)
        nb = weighted.nb
        views = [c.view(weighted, (cfg.n_embd, t), (nb[0], nb[2], nb[2] * t, nb[2] * t), i * nb[1]) for i in range(k)]
        for x in views:
            g.build_forward_expand(x)
        out = views[0]
        for i in range(1, k):
            out = c.add(out, views[i], f"ffn_moe_out-{il}" if i == k - 1 else f"ffn_moe_sum{i}-{il}")
            g.build_forward_expand(out)
        return c.cont(out, f"ffn_moe_out-{il}") if k == 1 else out

    def layer(self, lay, il: int, x: Tensor, inp: IswaInputs) -> Tensor:
        c = self.c
        cur = self.attention(lay, il, self.norm(x, lay.attn_norm, "attn_norm", il), inp)
        ffn_inp = c.add(cur, x, f"ffn_inp-{il}")
        cur = self.moe(lay, il, self.norm(ffn_inp, lay.attn_post_norm, "attn_post_norm", il))
        out = c.add(cur, ffn_inp, f"l_out-{il}")
        self.g.build_forward_expand(out)
        return out

    def build(self) -> BuiltGraph:
        """embd, the inputs, the layers, the output rows (one GET_ROWS after the last layer, unnamed upstream:
        `l_out_rows-<last>`), result_norm, result_output."""
        c, cfg = self.c, self.cfg
        tokens = c.new_input(GGMLType.I32, (self.p.n_tokens,), "inp_tokens")
        x = self.build_inp_embd(tokens)
        inp = self.inputs(tokens)
        for il, lay in enumerate(self.m.layers):
            x = self.layer(lay, il, x, inp)
        x = c.get_rows(x, inp.out_ids, f"l_out_rows-{cfg.n_layer - 1}")
        x = self.norm(x, self.m.output_norm, "result_norm", -1)
        logits = c.mul_mat(self.m.output, x, "result_output")
        logits.flags = logits.flags | TensorFlag.OUTPUT
        self.g.build_forward_expand(logits)
        return BuiltGraph(self.g, self.p, inp, logits)


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> np.ndarray:
    """x * sigmoid(alpha x) * (y + 1) with x = min(gate, limit), y = clamp(up, -limit, limit) (float64)."""
    x = np.minimum(gate, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (np.clip(up, -limit, limit) + 1.0)


def yarn_neox(x: np.ndarray, pos: np.ndarray, base: float, yarn) -> np.ndarray:
    """NEOX rope with YaRN in float64 (x: (T, H, hd); element i rotates with i + hd/2), written from the YaRN
    paper's recipe as ggml applies it: per pair i the angle pos * base^(-2i/hd) extrapolated below the ramp
    (i <= c0), interpolated (times freq_scale) above it (i >= c1), mixed linearly between; cos and sin scaled
    by attn_factor * (1 + 0.1 ln(1 / freq_scale)); c0, c1 from yarn.corr_dims (beta_fast, beta_slow)."""
    hd = x.shape[-1]
    half = hd // 2
    i = np.arange(half, dtype=F64)
    c0, c1 = yarn.corr_dims(hd, base)
    ramp = (1.0 - np.clip((i - c0) / max(0.001, c1 - c0), 0.0, 1.0)) * yarn.ext_factor
    th_e = pos[:, None].astype(F64) * base ** (-2.0 * i / hd)                      # (T, half)
    th = th_e * yarn.freq_scale * (1.0 - ramp) + th_e * ramp
    m = yarn.attn_factor * (1.0 + 0.1 * np.log(1.0 / yarn.freq_scale))
    c, s = (np.cos(th) * m)[:, None, :], (np.sin(th) * m)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


class Reference(ReferenceBase):
    """gpt-oss's forward in float64, written from the model's definition: biased projections, NEOX rope at the
    layer's base, attention with a per-head sink logit in the softmax's denominator (and the window on sliding
    layers), the post-attention norm before the experts, a router whose top-k logits (plus bias) are
    softmaxed into the weights, biased experts through the clamped SwiGLU."""

    def forward(self, tokens: np.ndarray, seqs: np.ndarray, pos: np.ndarray, out_rows: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        for s in np.unique(seqs):
            self.seqs.setdefault(int(s), SeqCache(cfg.n_layer, cfg.n_embd_kv)).grow(int(pos[seqs == s].max()) + 1)
        x = self._embed(tokens)
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            x = x + self._attention(il, rms_norm(x, self.w(p + "attn_norm.weight"), cfg.norm_eps), seqs, pos)
            x = x + self._moe(il, rms_norm(x, self.w(p + "post_attention_norm.weight"), cfg.norm_eps))
        h = rms_norm(x[out_rows], self.w("output_norm.weight"), cfg.norm_eps)
        return self._mm(h, "output.weight").astype(np.float32)

    def _qk(self, il: int, q: np.ndarray, k: np.ndarray, pos: np.ndarray):
        base, yarn = self.cfg.rope_base_of(il), self.cfg.yarn()
        if yarn is None:
            return rope_pairs(q, pos, base, neox=True), rope_pairs(k, pos, base, neox=True)
        return yarn_neox(q, pos, base, yarn), yarn_neox(k, pos, base, yarn)

    def _attention(self, il: int, h: np.ndarray, seqs: np.ndarray, pos: np.ndarray) -> np.ndarray:
        out = super()._attention(il, h, seqs, pos)      # attn_output's product: its bias added here
        return out + self.w(f"blk.{il}.attn_output.bias")

    def _attend(self, il: int, q: np.ndarray, qpos: np.ndarray, c: SeqCache) -> np.ndarray:
        """Attention of q (Tq, H, hd) over positions p0 <= p1 (within the window on a sliding layer), each
        head's sink logit S_h joining the softmax: exp(s - m) / (sum exp(s - m) + exp(S_h - m))."""
        cfg = self.cfg
        hd, group = cfg.head_dim, cfg.n_head // cfg.n_head_kv
        n = int(qpos.max()) + 1
        k = np.repeat(c.k[il, :n].astype(F64).reshape(n, cfg.n_head_kv, hd), group, axis=1)
        v = np.repeat(c.v[il, :n].astype(F64).reshape(n, cfg.n_head_kv, hd), group, axis=1)
        s = np.einsum("thd,nhd->htn", q, k) / np.sqrt(hd)                # (H, Tq, n)
        p0, p1 = np.arange(n)[None, None, :], qpos[None, :, None]
        seen = p0 <= p1
        if cfg.is_swa(il):
            seen = seen & (p1 - p0 < cfg.n_swa)
        s = np.where(seen, s, -np.inf)
        sink = self.w(f"blk.{il}.attn_sinks.weight")[:, None, None]        # (H, 1, 1)
        m = np.maximum(s.max(axis=-1, keepdims=True), sink)
        e = np.exp(s - m)
        prob = e / (e.sum(axis=-1, keepdims=True) + np.exp(sink - m))
        return np.einsum("htn,nhd->thd", prob, v)

    def _moe(self, il: int, h: np.ndarray) -> np.ndarray:
        """Router logits + bias; the top k (ties: lower id); their softmax as the weights; each chosen expert's
        gate/up (+ biases), clamped SwiGLU, down (+ bias), weighted and summed."""
        cfg, p = self.cfg, f"blk.{il}."
        z = self._mm(h, p + "ffn_gate_inp.weight") + self.w(p + "ffn_gate_inp.bias")     # (T, E)
        top = np.argsort(-z, axis=-1, kind="stable")[:, : cfg.n_expert_used]
        if self.router is not None:
            top = self.router(il, z, top)
        weight = softmax(np.take_along_axis(z, top, axis=-1))                          # (T, k)
        names = [p + f"ffn_{n}_exps.weight" for n in ("gate", "up", "down")]
        gate, up, down = (self.w(n) for n in names)
        bg, bu, bd = (self.w(p + f"ffn_{n}_exps.bias") for n in ("gate", "up", "down"))
        out = np.zeros_like(h)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            x = self._x_for(h[rows], names[0])
            a = swiglu_oai(x @ gate[e].T + bg[e], x @ up[e].T + bu[e])
            out[rows] += weight[rows, slot][:, None] * (self._x_for(a, names[2]) @ down[e].T + bd[e])
        return out

"""gemma3, as llama.cpp 0c1e57098's src/models/gemma3.cpp builds it (the iSWA graph when the file has a window).

What differs from llama: the embedding is scaled by sqrt(n_embd); Q and K are RMS-normed over head_dim
(QK-norm) before a NEOX rope whose base is per layer (rope.freq_base on global layers, rope.freq_base_swa,
default 10 000, on sliding ones); Q is scaled by f_attention_scale (1/sqrt(head_dim)) and flash attention
runs at scale 1; the attention and FFN outputs are RMS-normed again (post norms) before their residual adds;
the FFN is GEGLU (tanh GELU); head_dim is key_length, not n_embd/n_head; the output is tied to token_embd
when output.weight is absent; no final-logit soft-capping (the key is absent in Gemma 3 files). With a
sliding window, layer il slides unless (il + 1) % pattern == 0 (llama_hparams::set_swa_pattern, pattern 6
by default, or one bool per layer) and reads llama.cpp's iSWA cache: its own K/V cache, cell indices, mask.
The graph: gemma3_graph.py; the oracle: gemma3_reference.py.
"""

from __future__ import annotations

import dataclasses

from ..presets import ROPE_NEOX, SWA_PATTERN, Gemma3Config, ModelConfig, swa_pattern
from .common import NORM, WEIGHT, Meta, TensorSpec, base_config, refuse_present, sliding_window_layers
from .gemma3_graph import Builder  # noqa: F401  (the registry's names)
from .gemma3_reference import Reference  # noqa: F401

NAME = "gemma3"
ROPE_TYPE = ROPE_NEOX
EXPERTS = (False,)               # no experts in its graph (is_moe values it can express)
# what llama.cpp's gemma3 reads when present and graphdiag's graph does not compute: refused, not ignored
UNSUPPORTED = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_qkv.weight", "dense_2.weight", "dense_3.weight")


def config(meta: Meta) -> Gemma3Config:
    """The common keys (common.base_config) plus gemma3's: attention.sliding_window (absent: no window),
    sliding_window_pattern (absent: 6), rope.freq_base_swa (absent: 10 000), final_logit_softcapping
    (refused when non-zero: graphdiag's graph has no soft-capping)."""
    refuse_present(meta, UNSUPPORTED)
    cap = float(meta.get("final_logit_softcapping", 0.0) or 0.0)
    if cap != 0.0:
        raise meta.fail(f"{NAME}.final_logit_softcapping {cap}: soft-capped logits are not computed by graphdiag")
    base = base_config(meta, rope_type=ROPE_TYPE)
    n_swa = int(meta.get("attention.sliding_window", 0) or 0)
    layers = sliding_window_layers(meta, NAME, base.n_layer, SWA_PATTERN)
    return Gemma3Config(**dataclasses.asdict(base), n_swa=n_swa,
                        swa_layers=layers if n_swa > 0 else (False,) * base.n_layer,
                        rope_base_swa=meta.finite("rope.freq_base_swa", 10000.0, positive=True))


def layer_specs(cfg: ModelConfig, il: int):
    """load_arch_tensors' order for one layer."""
    p, d, f, q, kv, hd = f"blk.{il}.", cfg.n_embd, cfg.n_ff, cfg.n_embd_q, cfg.n_embd_kv, cfg.head_dim
    for n, fld, ne, kind in (
            ("attn_norm", "attn_norm", (d,), NORM), ("attn_q", "wq", (d, q), WEIGHT), ("attn_k", "wk", (d, kv), WEIGHT),
            ("attn_v", "wv", (d, kv), WEIGHT), ("attn_output", "wo", (q, d), WEIGHT),
            ("post_attention_norm", "attn_post_norm", (d,), NORM), ("attn_k_norm", "attn_k_norm", (hd,), NORM),
            ("attn_q_norm", "attn_q_norm", (hd,), NORM), ("ffn_norm", "ffn_norm", (d,), NORM),
            ("ffn_gate", "ffn_gate", (d, f), WEIGHT), ("ffn_up", "ffn_up", (d, f), WEIGHT),
            ("ffn_down", "ffn_down", (f, d), WEIGHT), ("post_ffw_norm", "ffn_post_norm", (d,), NORM)):
        yield TensorSpec(p + n + ".weight", ne, kind, fld, il)


def tensors(cfg: ModelConfig) -> list[TensorSpec]:
    """token_embd, output_norm, output (unless tied), then the layers: llama.cpp's gemma3 load order."""
    d = cfg.n_embd
    out = [TensorSpec("token_embd.weight", (d, cfg.n_vocab), WEIGHT, "tok_embd"),
           TensorSpec("output_norm.weight", (d,), NORM, "output_norm")]
    if not cfg.tied_output:
        out.append(TensorSpec("output.weight", (d, cfg.n_vocab), WEIGHT, "output"))
    for il in range(cfg.n_layer):
        out += layer_specs(cfg, il)
    return out


def kv_layers(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(layer, cells) of each layer's K/V cache in creation order: llama_kv_cache_iswa makes the global
    cache's layers (n_ctx cells) before the SWA cache's (swa_size cells)."""
    swa = getattr(cfg, "is_swa", lambda il: False)
    base = [(il, cfg.n_ctx) for il in range(cfg.n_layer) if not swa(il)]
    return base + [(il, cfg.swa_size) for il in range(cfg.n_layer) if swa(il)]


def preset(cfg: ModelConfig) -> Gemma3Config:
    """A preset's shapes as gemma3 (export-gguf --arch gemma3): tied output, window 512 on pattern 6 (as
    Gemma 3 270M), rope bases 1e6 / 1e4, rms eps 1e-6. A Gemma 3 preset (gemma3-tiny) is already one: as it is."""
    if isinstance(cfg, Gemma3Config) and cfg.arch == NAME:
        return cfg
    base = dataclasses.replace(cfg, arch=NAME, rope_type=ROPE_TYPE, tied_output=True, rope_base=1e6, norm_eps=1e-6)
    return Gemma3Config(**dataclasses.asdict(base), n_swa=512, swa_layers=swa_pattern(cfg.n_layer))

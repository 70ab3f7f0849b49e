"""llama (Mistral-style files too), as llama.cpp 0c1e57098's src/models/llama.cpp builds it.

Per layer: attn_norm (RMS_NORM, MUL); Q/K/V mat-muls (a bias ADD after each where the file has one:
create_tensor_qkv makes them optional for every arch); NORM rope (adjacent pairs); K and V into the cache;
flash attention (scale 1/sqrt(head_dim)); attn_output; residual ADD; ffn_norm; SwiGLU FFN, or with experts
(`llama.expert_count`, Mixtral-style) build_moe_ffn with llama's arguments: softmax gating, the top
`expert_used_count`, the weights normalised (norm_w: SUM_ROWS, CLAMP, DIV), no weight scale (llama never reads
`expert_weights_scale`), no expert bias or shared experts, the experts' FFN as wide as `feed_forward_length`;
residual ADD. The output projection is token_embd when output.weight is absent (tied).
The base builder (model/graph_context.GraphContext) and oracle (model/reference_base.ReferenceBase) are
this graph.
"""

from __future__ import annotations

import dataclasses

from ..graph_context import GraphContext
from ..presets import ROPE_NORM, ModelConfig
from ..reference_base import ReferenceBase
from .common import (Meta, TensorSpec, attention_specs, base_config, expert_counts, ffn_specs, model_specs,
                     refuse_present)

NAME = "llama"
ROPE_TYPE = ROPE_NORM
EXPERTS = (False, True)          # dense or Mixtral-style MoE (is_moe values it can express)
EXPERT_FF_KEY = "feed_forward_length"   # a MoE file gives the experts' width under this key
# tensors llama.cpp's llama graph uses when present and graphdiag's does not: refused, not ignored
UNSUPPORTED = ("rope_freqs.weight", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias",
               "attn_qkv.weight")   # and every weight's .scale / .input_scale (common.WEIGHT_SCALES)


def config(meta: Meta) -> ModelConfig:
    refuse_present(meta, UNSUPPORTED)
    cfg = base_config(meta, rope_type=ROPE_TYPE)
    n_expert, n_used = expert_counts(meta)
    if not n_expert:
        return cfg
    # llama's MoE layers read feed_forward_length as the experts' width and have no dense FFN
    return dataclasses.replace(cfg, n_ff=0, n_ff_exp=cfg.n_ff, n_expert=n_expert, n_expert_used=n_used,
                               moe_norm_w=True)


def layer_specs(cfg: ModelConfig, il: int):
    yield from attention_specs(cfg, il)
    yield from ffn_specs(cfg, il)


def tensors(cfg: ModelConfig) -> list[TensorSpec]:
    return model_specs(cfg, layer_specs)


def preset(cfg: ModelConfig) -> ModelConfig:
    """The preset as a llama file builds it: a MoE preset's router normalises its weights (moe-tiny's does not)."""
    return dataclasses.replace(cfg, arch=NAME, rope_type=ROPE_TYPE, moe_norm_w=cfg.is_moe)


class Builder(GraphContext):
    """llama's graph is the base builder's."""


class Reference(ReferenceBase):
    """llama's forward is the base oracle's."""

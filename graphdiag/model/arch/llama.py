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
from .common import Meta, TensorSpec, attention_specs, base_config, ffn_specs, model_specs, refuse_present

NAME = "llama"
ROPE_TYPE = ROPE_NORM
# tensors llama.cpp's llama graph uses when present and graphdiag's does not: refused, not ignored
UNSUPPORTED = ("rope_freqs.weight", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias",
               "attn_qkv.weight")   # and every weight's .scale / .input_scale (common.WEIGHT_SCALES)
MAX_EXPERTS = 1024       # llama-hparams.h LLAMA_MAX_EXPERTS


def config(meta: Meta) -> ModelConfig:
    refuse_present(meta, UNSUPPORTED)
    cfg = base_config(meta, rope_type=ROPE_TYPE)
    n_expert, n_used = _experts(meta)
    if not n_expert:
        return cfg
    # llama's MoE layers read feed_forward_length as the experts' width and have no dense FFN
    return dataclasses.replace(cfg, n_ff=0, n_ff_exp=cfg.n_ff, n_expert=n_expert, n_expert_used=n_used,
                               moe_norm_w=True)


def _experts(meta: Meta) -> tuple[int, int]:
    """(expert_count, expert_used_count) with llama_model_base::load_hparams' checks (it asserts them), and
    refusing the grouped selection build_moe_ffn would add (expert_group_count > 1), which graphdiag does not
    build. (0, 0) for a dense file."""
    n_expert = meta.count("expert_count", 0)
    n_used = meta.count("expert_used_count", 0)
    groups = meta.count("expert_group_count", 0)
    if n_expert <= 0:
        if n_used or groups:
            raise meta.fail(f"{NAME}.expert_used_count {n_used} / expert_group_count {groups} without experts "
                            f"(expert_count {n_expert}): llama.cpp asserts they are 0")
        return 0, 0
    if n_expert > MAX_EXPERTS or not 0 < n_used <= n_expert:
        raise meta.fail(f"{NAME}.expert_count {n_expert}, expert_used_count {n_used}: llama.cpp needs "
                        f"0 < expert_used_count <= expert_count <= {MAX_EXPERTS}")
    if groups > 1:
        raise meta.fail(f"{NAME}.expert_group_count {groups}: build_moe_ffn's grouped expert selection is not "
                        f"built by graphdiag")
    return n_expert, n_used


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

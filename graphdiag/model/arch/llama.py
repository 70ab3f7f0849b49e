"""llama (Mistral-style files too), as llama.cpp 0c1e57098's src/models/llama.cpp builds it.

Per layer: attn_norm (RMS_NORM, MUL); Q/K/V mat-muls (a bias ADD after each where the file has one:
create_tensor_qkv makes them optional for every arch); NORM rope (adjacent pairs); K and V into the cache;
flash attention (scale 1/sqrt(head_dim)); attn_output; residual ADD; ffn_norm; SwiGLU FFN (or graphdiag's
MoE presets); residual ADD. The output projection is token_embd when output.weight is absent (tied).
The base builder (model/build._Builder) and oracle (model/reference.Reference) are this graph.
"""

from __future__ import annotations

import dataclasses

from ..build import _Builder
from ..presets import ROPE_NORM, ModelConfig
from ..reference import Reference as _Reference
from .common import Meta, TensorSpec, attention_specs, base_config, ffn_specs, model_specs, refuse_present

NAME = "llama"
ROPE_TYPE = ROPE_NORM
# tensors llama.cpp's llama graph uses when present and graphdiag's does not: refused, not ignored
UNSUPPORTED = ("rope_freqs.weight", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias",
               "attn_qkv.weight")


def config(meta: Meta) -> ModelConfig:
    refuse_present(meta, UNSUPPORTED)
    if meta.count("expert_count", 0) > 0:
        # llama.cpp's llama MoE normalises the top-k weights (norm_w): not graphdiag's MoE preset graph
        raise meta.fail(f"{NAME}.expert_count {meta.get('expert_count')}: MoE llama files are not supported")
    return base_config(meta, rope_type=ROPE_TYPE)


def layer_specs(cfg: ModelConfig, il: int):
    yield from attention_specs(cfg, il)
    yield from ffn_specs(cfg, il)


def tensors(cfg: ModelConfig) -> list[TensorSpec]:
    return model_specs(cfg, layer_specs)


def preset(cfg: ModelConfig) -> ModelConfig:
    return dataclasses.replace(cfg, arch=NAME, rope_type=ROPE_TYPE)


class Builder(_Builder):
    """llama's graph is the base builder's."""


class Reference(_Reference):
    """llama's forward is the base oracle's."""

"""qwen2, as llama.cpp 0c1e57098's src/models/qwen2.cpp builds it.

llama's layer with: a bias ADD after each of the Q, K and V mat-muls (attn_q/k/v.bias; llama.cpp names the
sum `Qcur-il` like the product), NEOX rope (elements i and i + head_dim/2 rotate together), no bias on
attn_output, the SwiGLU FFN, and the output projection tied to token_embd when output.weight is absent.
head_dim is n_embd / n_head (llama.cpp makes wq {n_embd, n_embd} for qwen2).
"""

from __future__ import annotations

import dataclasses

from ..graph_context import GraphContext
from ..presets import ROPE_NEOX, ModelConfig
from ..reference_base import ReferenceBase
from .common import Meta, TensorSpec, attention_specs, base_config, ffn_specs, model_specs, refuse_present

NAME = "qwen2"
ROPE_TYPE = ROPE_NEOX
EXPERTS = (False,)               # no experts in its graph (is_moe values it can express)
UNSUPPORTED = ("output.bias", "attn_qkv.weight")


def config(meta: Meta) -> ModelConfig:
    refuse_present(meta, UNSUPPORTED)
    cfg = base_config(meta, rope_type=ROPE_TYPE)
    if cfg.n_embd_q != cfg.n_embd:
        raise meta.fail(f"{NAME}.attention.key_length {cfg.head_dim}: llama.cpp's qwen2 needs "
                        f"head_dim = n_embd / n_head = {cfg.n_embd // cfg.n_head}")
    return cfg


def layer_specs(cfg: ModelConfig, il: int):
    yield from attention_specs(cfg, il)
    yield from ffn_specs(cfg, il)


def tensors(cfg: ModelConfig) -> list[TensorSpec]:
    return model_specs(cfg, layer_specs)


def preset(cfg: ModelConfig) -> ModelConfig:
    """A preset's shapes as qwen2: NEOX rope and the Q/K/V biases every Qwen2 checkpoint has."""
    return dataclasses.replace(cfg, arch=NAME, rope_type=ROPE_TYPE, qkv_bias=True)


class Builder(GraphContext):
    """The base builder adds a layer's biases where it has them and ropes in cfg.rope_type (NEOX); qwen2.cpp
    names no attention output (ggml's node_<index>: labelled attn_out-il as llama's)."""


class Reference(ReferenceBase):
    """The base oracle adds the biases the model has and ropes in cfg.rope_type (NEOX)."""

"""qwen3, as llama.cpp 0c1e57098's src/models/qwen3.cpp builds it.

llama's layer with QK-norm: after the Q (and K) mat-mul and per-head reshape, RMS_NORM over each head's
head_dim elements (`norm-il`) and MUL by attn_q_norm (attn_k_norm), named `Qcur_normed-il` (`Kcur_normed-il`),
then NEOX rope. head_dim is `qwen3.attention.key_length` where present (n_head * head_dim may differ from
n_embd: wq is {n_embd, n_head*head_dim}, attn_output {n_head*head_dim, n_embd}). No biases in Qwen3
checkpoints (llama.cpp still accepts optional attn_q/k/v.bias); tied output when output.weight is absent.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..graph_context import GraphContext, GraphInputs
from ..presets import ROPE_NEOX, ModelConfig
from ..reference_base import ReferenceBase, rms_norm, rope_pairs
from .common import NORM, Meta, TensorSpec, attention_specs, base_config, ffn_specs, model_specs, refuse_present

NAME = "qwen3"
ROPE_TYPE = ROPE_NEOX
EXPERTS = (False,)               # no experts in its graph (is_moe values it can express)
UNSUPPORTED = ("attn_qkv.weight",)


def config(meta: Meta) -> ModelConfig:
    refuse_present(meta, UNSUPPORTED)
    return base_config(meta, rope_type=ROPE_TYPE)


def layer_specs(cfg: ModelConfig, il: int):
    yield from attention_specs(cfg, il)
    p = f"blk.{il}."
    yield TensorSpec(p + "attn_q_norm.weight", (cfg.head_dim,), NORM, "attn_q_norm", il)
    yield TensorSpec(p + "attn_k_norm.weight", (cfg.head_dim,), NORM, "attn_k_norm", il)
    yield from ffn_specs(cfg, il)


def tensors(cfg: ModelConfig) -> list[TensorSpec]:
    return model_specs(cfg, layer_specs)


def preset(cfg: ModelConfig) -> ModelConfig:
    return dataclasses.replace(cfg, arch=NAME, rope_type=ROPE_TYPE)


class Builder(GraphContext):
    def build_rope_qk(self, lay, il: int, q, k, inp: GraphInputs):
        """QK-norm (build_norm: `norm-il`, `Qcur_normed-il`) then rope (`Qcur-il`), Q before K (llama.cpp's
        creation order; the graph order follows from the Q, V, K expansion as for llama)."""
        q = self.rope(self.build_norm(q, lay.attn_q_norm, "Qcur_normed", il), il, inp, f"Qcur-{il}")
        k = self.rope(self.build_norm(k, lay.attn_k_norm, "Kcur_normed", il), il, inp, f"Kcur-{il}")
        return q, k


class Reference(ReferenceBase):
    def _qk(self, il: int, q: np.ndarray, k: np.ndarray, pos: np.ndarray):
        """Each head's (head_dim,) row RMS-normed and scaled by its weight, then NEOX-roped."""
        p, eps, base = f"blk.{il}.", self.cfg.norm_eps, self.cfg.rope_base
        q = rms_norm(q, self.w(p + "attn_q_norm.weight"), eps)
        k = rms_norm(k, self.w(p + "attn_k_norm.weight"), eps)
        return rope_pairs(q, pos, base, neox=True), rope_pairs(k, pos, base, neox=True)

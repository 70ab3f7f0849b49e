"""qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B), as llama.cpp 0c1e57098's src/models/qwen3moe.cpp builds it.

qwen3's attention (QK-norm: each head's RMS_NORM and MUL by attn_q_norm / attn_k_norm, NEOX rope, head_dim
`qwen3moe.attention.key_length`, so n_head * head_dim may differ from n_embd as in the 30B's 32 x 128 over
2048) and, in place of the dense FFN, build_moe_ffn with qwen3moe's arguments: LLM_FFN_SILU over separate
gate and up experts (SWIGLU), norm_w true (the top-k router weights divided by their sum: SUM_ROWS, CLAMP,
DIV), w_scale = hparams.expert_weights_scale, which qwen3moe's loader never reads (0: no SCALE node), softmax
gating, no expert bias, no shared expert, no per-expert scales (refused: common.WEIGHT_SCALES). Its output is
cb'd `ffn_moe_out-il` (again, by the model) and the residual ADD is `l_out-il`: the base builder's MoE layer.
The experts' width is `qwen3moe.expert_feed_forward_length`, else feed_forward_length / expert_used_count
(load_arch_tensors' fallback); feed_forward_length itself is optional and sizes nothing else. expert_count
and expert_used_count must be positive (load_arch_tensors throws otherwise). expert_gating_func,
expert_weights_norm and expert_weights_scale are not read by qwen3moe and are ignored here as there.
"""

from __future__ import annotations

import dataclasses

from ...errors import UsageError
from ..presets import ROPE_NEOX, ModelConfig
from .common import Meta, TensorSpec, base_config, expert_counts, model_specs, refuse_present
from .qwen3 import UNSUPPORTED, layer_specs
from .qwen3 import Builder as Qwen3Builder
from .qwen3 import Reference as Qwen3Reference

NAME = "qwen3moe"
ROPE_TYPE = ROPE_NEOX
EXPERTS = (True,)                            # its graph always has experts (is_moe values it can express)
EXPERT_FF_KEY = "expert_feed_forward_length"  # the key a file gives the experts' width under


def config(meta: Meta) -> ModelConfig:
    refuse_present(meta, UNSUPPORTED)
    n_expert, n_used = expert_counts(meta)
    if not n_expert:
        raise meta.fail(f"{NAME}.expert_count is missing or 0: llama.cpp's {NAME} needs experts "
                        f"(n_expert must be > 0 for QWEN3MOE)")
    cfg = base_config(meta, ff_required=False, rope_type=ROPE_TYPE)
    n_ff_exp = meta.count(EXPERT_FF_KEY, 0) or cfg.n_ff // n_used
    if n_ff_exp <= 0:
        raise meta.fail(f"{NAME}.{EXPERT_FF_KEY} and feed_forward_length are missing or 0: the experts' width "
                        f"is unknown")
    return dataclasses.replace(cfg, n_ff=0, n_ff_exp=n_ff_exp, n_expert=n_expert, n_expert_used=n_used,
                               moe_norm_w=True)


def tensors(cfg: ModelConfig) -> list[TensorSpec]:
    """qwen3's layer (attention, q/k norms, ffn_norm) with the router and the expert stacks as its FFN."""
    return model_specs(cfg, layer_specs)


def preset(cfg: ModelConfig) -> ModelConfig:
    """A MoE preset as a qwen3moe file builds it: NEOX rope, the router's weights normalised; no dense
    preset (llama.cpp's qwen3moe has no dense FFN)."""
    if not cfg.is_moe:
        raise UsageError(f"preset {cfg.name} has no experts: llama.cpp's {NAME} needs them (use a MoE preset, "
                         f"or --arch qwen3 for a dense one)")
    return dataclasses.replace(cfg, arch=NAME, rope_type=ROPE_TYPE, moe_norm_w=True)


class Builder(Qwen3Builder):
    """qwen3's QK-norm attention; the base builder's build_moe_ffn (norm_w from cfg.moe_norm_w) as the FFN."""


class Reference(Qwen3Reference):
    """qwen3's QK-norm; the base oracle's MoE (softmax, top-k, norm_w) as the FFN."""

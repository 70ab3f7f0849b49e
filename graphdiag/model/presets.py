"""Model shapes of the reference decode workload (a LLaMA-style transformer, optionally MoE)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..ir.dtypes import GGMLType

ROPE_NORM, ROPE_NEOX = 0, 2     # GGML_ROPE_TYPE_NORM / GGML_ROPE_TYPE_NEOX

# Weight storage types a run may choose (norm weights are always F32, the KV cache always F16).
WEIGHT_TYPES = {"f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "f32": GGMLType.F32}


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters. Sizes are element counts; `n_ctx` is the number of KV-cache cells."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    n_ctx: int = 4096
    # the architecture's pieces (model/arch/): defaults are llama's, so the llama presets are unchanged
    arch: str = "llama"          # general.architecture: which model/arch module builds the graph
    n_embd_head: int = 0         # head size when it is not n_embd / n_head ({arch}.attention.key_length)
    rope_type: int = 0           # ggml rope mode: ROPE_NORM (0, adjacent pairs) or ROPE_NEOX (2, halves)
    tied_output: bool = False    # the output projection is token_embd (output.weight absent)
    qkv_bias: bool = False       # the Q/K/V mat-muls add a bias (attn_q/k/v.bias: qwen2)

    @property
    def head_dim(self) -> int:
        """Elements per attention head (llama.cpp's n_embd_head_k, equal to n_embd_head_v here)."""
        return self.n_embd_head or self.n_embd // self.n_head

    @property
    def n_embd_q(self) -> int:
        """Width of Q (and of the attention output): head_dim * n_head (n_embd unless head_dim is explicit)."""
        return self.head_dim * self.n_head

    @property
    def n_embd_kv(self) -> int:
        """Width of one K (or V) cache row: head_dim * n_head_kv."""
        return self.head_dim * self.n_head_kv

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0


PRESETS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("tiny", 4, 512, 8, 8, 1408, 4096),
        ModelConfig("small", 8, 1024, 16, 4, 2816, 8192),
        ModelConfig("1b", 16, 2048, 32, 8, 8192, 32000),
        ModelConfig("7b", 32, 4096, 32, 32, 11008, 32000),
        ModelConfig("moe-tiny", 4, 512, 8, 8, 0, 4096, n_expert=8, n_expert_used=2, n_ff_exp=512),
    )
}


def get_preset(name: str) -> ModelConfig:
    """The preset called `name`; UsageError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})") from None


def weight_type(name: str) -> GGMLType:
    """'f16' | 'q8_0' (| 'f32', for tests) -> GGMLType."""
    try:
        return WEIGHT_TYPES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown weight type {name!r} (known: {', '.join(WEIGHT_TYPES)})") from None

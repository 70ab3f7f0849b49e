"""Model shapes of the reference decode workload (a LLaMA-style transformer, optionally MoE)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from ..ir.build import Yarn
from ..ir.dtypes import GGMLType, block_size
from .kv_sizes import N_UBATCH, swa_cache_size
from .mixes import MIXES, Mix

ROPE_NORM, ROPE_NEOX = 0, 2     # GGML_ROPE_TYPE_NORM / GGML_ROPE_TYPE_NEOX
MOE_NORM_MIN = 6.103515625e-5   # build_moe_ffn's norm_w clamps the top-k weights' sum to at least F16's
                                # smallest normal ("avoid division by zero")

# Weight storage types a run may choose for every mat-mul weight and the token embedding (norm weights are
# always F32, the KV cache always F16). Q5_1 is here because Q5_K falls back to it (preset_type). A name of
# MIXES (q2_k, q3_k_m) is a llama.cpp ftype's mix of types (model/mixes.py), every other name one type: as
# `llama-quantize --pure`, every mat-mul weight, the output and the embedding in the one type (no
# llama_tensor_get_type mixture, which would store output.weight as Q6_K, for one), bar the row fallback.
# (config.WTYPES holds the same names, for checking a setting without numpy: a test keeps them equal)
WEIGHT_TYPES: dict[str, GGMLType | Mix] = {
    **{name: GGMLType[name.upper()] for name in
       ("f16", "q8_0", "f32", "bf16", "q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q3_k",
        "q4_1", "iq4_nl", "iq4_xs")}, **MIXES}
# llama-quant.cpp's tensor_type_fallback: a 256-block type whose rows (ne0) are no multiple of 256 becomes this
# type; a type whose block still does not divide the row (or a 32-block type that does not) becomes F16.
K_FALLBACK = {GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0,
              GGMLType.Q2_K: GGMLType.Q4_0, GGMLType.Q3_K: GGMLType.Q4_0, GGMLType.IQ4_XS: GGMLType.IQ4_NL}


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
    moe_norm_w: bool = False     # build_moe_ffn's norm_w: the top-k router weights divided by their sum
                                 # (llama's MoE files, Mixtral-style); moe-tiny's router does not

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


SWA_PATTERN = 6      # gemma3's load_swa_pattern(ml, 6): the default when a file gives none


def swa_pattern(n_layer: int, n_pattern: int = SWA_PATTERN) -> tuple:
    """llama_hparams::set_swa_pattern(n_pattern, dense_first=false): layer il slides unless
    il % n_pattern == n_pattern - 1 (every layer slides with n_pattern 0)."""
    return tuple(n_pattern == 0 or (il % n_pattern < n_pattern - 1) for il in range(n_layer))


@dataclass(frozen=True)
class Gemma3Config(ModelConfig):
    """ModelConfig plus Gemma 3's sliding window (model/arch/gemma3.py): `n_swa` positions (0: none, one
    cache), `swa_layers` (a bool per layer), the SWA layers' rope base, and what sizes the SWA cache
    (sequences, llama.cpp's swa_full)."""

    n_swa: int = 0
    swa_layers: tuple = ()
    rope_base_swa: float = 10000.0
    n_seq_max: int = 1
    swa_full: bool = False
    n_ubatch: int = N_UBATCH     # the run's n_ubatch (--ubatch-size): the SWA cache holds one ubatch past the window

    def is_swa(self, il: int) -> bool:
        return self.n_swa > 0 and bool(self.swa_layers[il])

    def rope_base_of(self, il: int) -> float:
        """get_rope_freq_base: rope.freq_base_swa on a sliding layer, rope.freq_base elsewhere."""
        return self.rope_base_swa if self.is_swa(il) else self.rope_base

    @property
    def f_attention_scale(self) -> float:
        """1/sqrt(head_dim); the 27B (62 layers) uses 1/sqrt(n_embd/n_head) (load_arch_hparams)."""
        d = self.n_embd // self.n_head if self.n_layer == 62 else self.head_dim
        return 1.0 / math.sqrt(float(d))

    @property
    def swa_size(self) -> int:
        """The SWA cache's cells (0 without a window): llama_kv_cache_iswa's size_swa, unified cache."""
        if self.n_swa <= 0:
            return 0
        return swa_cache_size(self.n_ctx, self.n_swa, self.n_seq_max, self.n_ubatch, True, self.swa_full)


@dataclass(frozen=True)
class GptOssConfig(Gemma3Config):
    """gpt-oss (model/arch/gpt_oss.py): Gemma3Config's sliding window (n_swa, swa_layers, the SWA cache's
    sizing; f_attention_scale is not read: gpt-oss scales KQ by 1/sqrt(head_dim) inside flash attention),
    every layer with attention sinks, Q/K/V/O biases and biased experts under a SOFTMAX_WEIGHT router; YaRN
    rope scaling when `yarn_factor` > 0 (rope.scaling.factor, over `yarn_orig_ctx` positions; every layer,
    as llama.cpp's gpt-oss gives its sliding layers the same freq_scale), `yarn_attn_factor` the file's
    rope.scaling.attn_factor (1 when absent)."""

    yarn_factor: float = 0.0
    yarn_orig_ctx: int = 0
    yarn_attn_factor: float = 1.0

    def yarn(self) -> Yarn | None:
        """The ropes' YaRN as llama_context sets it up: freq_scale 1 / factor, ext_factor 1, attn_factor
        get_mscale(factor) / (1 + 0.1 ln factor) (1 up to float32 rounding: ggml's rope multiplies by the
        latter again) times rope.scaling.attn_factor, in float32 as llama.cpp computes it."""
        if self.yarn_factor <= 0:
            return None
        f = np.float32
        fs = f(1) / f(self.yarn_factor)
        factor = f(1) / fs
        mscale = f(0.1) * np.log(factor, dtype=f) + f(1) if factor > 1 else f(1)
        attn = mscale * (f(1) / (f(1) + f(0.1) * np.log(factor, dtype=f))) * f(self.yarn_attn_factor)
        return Yarn(float(fs), self.yarn_orig_ctx, 1.0, float(attn))


PRESETS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("tiny", 4, 512, 8, 8, 1408, 4096),
        ModelConfig("small", 8, 1024, 16, 4, 2816, 8192),
        ModelConfig("1b", 16, 2048, 32, 8, 8192, 32000),
        ModelConfig("7b", 32, 4096, 32, 32, 11008, 32000),
        # softmax router, top 2 of 8 experts, weights not normalised (build_moe_ffn with norm_w false, no shared
        # experts: OLMoE's form); written as a llama file (export-gguf) it is llama's MoE, which normalises them
        ModelConfig("moe-tiny", 4, 512, 8, 8, 0, 4096, n_expert=8, n_expert_used=2, n_ff_exp=512),
        # Qwen3-30B-A3B's pieces at tiny shapes (qwen3moe): 16 experts of width 256, the top 4 per token, their
        # weights normalised (norm_w); GQA (8 heads over 2 KV heads) of head_dim 128, so Q is 1024 wide over
        # n_embd 512 (the 30B: 32 x 128 over 2048); QK-norm and NEOX rope (base 1e6), untied output
        ModelConfig("qwen3moe-tiny", 4, 512, 8, 2, 0, 4096, n_expert=16, n_expert_used=4, n_ff_exp=256,
                    rope_base=1e6, norm_eps=1e-6, arch="qwen3moe", n_embd_head=128, rope_type=ROPE_NEOX,
                    moe_norm_w=True),
        # Gemma 3's pieces at tiny shapes: one KV head, head_dim 128 (n_head * head_dim != n_embd), tied
        # output, layer 5 global and the others sliding over a 128-position window (SWA cache: 768 cells, n_ubatch 512)
        Gemma3Config("gemma3-tiny", 6, 256, 4, 1, 512, 4096, rope_base=1e6, norm_eps=1e-6, arch="gemma3",
                     n_embd_head=128, rope_type=ROPE_NEOX, tied_output=True, n_swa=128, swa_layers=swa_pattern(6)),
        # gpt-oss-20b's pieces at tiny shapes: 8 experts of width 256, the top 4 per token (SOFTMAX_WEIGHT
        # router with a bias, biased experts, clamped SwiGLU); GQA 8 over 2 KV heads of head_dim 64, so Q is
        # 512 wide over n_embd 256 (the 20b: 64 x 64 over 2880); sinks, Q/K/V/O biases; even layers slide over
        # a 128-position window (pattern 2), odd ones global; NEOX rope base 150 000 with the 20b's YaRN (factor 32
        # over 4096 positions), untied output
        GptOssConfig("gpt-oss-tiny", 4, 256, 8, 2, 0, 4096, n_expert=8, n_expert_used=4, n_ff_exp=256,
                     rope_base=150000.0, norm_eps=1e-5, arch="gpt-oss", n_embd_head=64, rope_type=ROPE_NEOX,
                     qkv_bias=True, n_swa=128, swa_layers=swa_pattern(4, 2), rope_base_swa=150000.0,
                     yarn_factor=32.0, yarn_orig_ctx=4096),
    )
}


def get_preset(name: str) -> ModelConfig:
    """The preset called `name`; UsageError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})") from None


def weight_type(name: str) -> GGMLType | Mix:
    """A --wtype name ('f16', 'q8_0', 'q4_k', ...; case-insensitive) -> its GGMLType, or its Mix (q2_k, q3_k_m)."""
    try:
        return WEIGHT_TYPES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown weight type {name!r} (known: {', '.join(WEIGHT_TYPES)})") from None


def base_type(w: GGMLType | Mix) -> GGMLType:
    """The one type of a --wtype, or its mix's default type."""
    return w.base if isinstance(w, Mix) else GGMLType(w)


def preset_type(t: GGMLType, ne0: int) -> GGMLType:
    """The type llama.cpp's quantizer stores a tensor of row length ne0 in when asked for `t`."""
    t = GGMLType(t)
    bs = block_size(t)
    if ne0 % bs == 0:
        return t
    got = K_FALLBACK.get(t, t)
    return got if ne0 % block_size(got) == 0 else GGMLType.F16

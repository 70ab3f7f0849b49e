"""What the llama-family architectures share: tensor specs, the hyper-parameters every one reads, the checks.

llama.cpp 0c1e57098 reads these keys for every architecture (llama_model_base::load_hparams) before the
architecture's own (load_arch_hparams): context_length, embedding_length, block_count (required),
feed_forward_length, attention.head_count, attention.head_count_kv (= head_count when absent),
attention.key_length / value_length (= n_embd / n_head when absent), rope.dimension_count (= key_length),
rope.freq_base (10 000), rope.scaling.* (linear, factor 1); llama, qwen2 and qwen3 then require
attention.layer_norm_rms_epsilon. Their graphs assert n_rot == key_length == value_length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ...errors import UsageError
from ..presets import ModelConfig

WEIGHT, NORM, BIAS, ROUTER = "weight", "norm", "bias", "router"   # kinds: a mat-mul weight in the run's (or
# the file's) type; a norm weight, a bias, the MoE router: always F32 in a preset, F32 only in a file
N_CTX_MAX = 4096                 # KV cells graphdiag gives a file's model (its context length if smaller)
MAX_EXPERTS = 1024               # llama-hparams.h LLAMA_MAX_EXPERTS


@dataclass(frozen=True)
class TensorSpec:
    """One persistent weight: its GGUF name, ggml ne, kind, and the Layer (or Model) field it fills."""

    name: str
    ne: tuple[int, ...]
    kind: str
    field: str
    layer: int | None = None     # None: a model-level tensor (token_embd, output_norm, output)

    @property
    def f32_only(self) -> bool:
        return self.kind != WEIGHT


class Meta:
    """A file's metadata as the architecture modules read it: `get(key, default)` with the arch prefix
    (`get("rope.freq_base")` reads `{arch}.rope.freq_base`), `raw(key)` without it, and the tensor names."""

    def __init__(self, path, arch: str, value: Callable[[str, object], object], names: set[str],
                 shape_of: Callable[[str], tuple[int, ...] | None]):
        self.path, self.arch, self._value, self.names, self.shape_of = path, arch, value, names, shape_of

    def get(self, key: str, default=None):
        return self._value(f"{self.arch}.{key}", default)

    def raw(self, key: str, default=None):
        return self._value(key, default)

    def need(self, key: str) -> int:
        """A required positive integer `{arch}.key`; UsageError naming it otherwise."""
        v = self.count(key, None)
        if v is None or v <= 0:
            raise UsageError(f"{self.path}: metadata {self.arch}.{key} is missing or not a positive integer")
        return v

    def count(self, key: str, default):
        """An integer `{arch}.key` (`default` when absent). llama.cpp also takes a per-layer array for some
        (get_key_or_arr): one with equal entries reads as that value; another is refused in one line."""
        v = self.get(key)
        if v is None:
            return default
        if isinstance(v, (list, tuple)) and v and len(set(v)) == 1:
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise self.fail(f"metadata {self.arch}.{key} = {v!r} is not an integer graphdiag can use "
                            f"(per-layer values are not supported)")
        return int(v)

    def real(self, key: str, default):
        """A number `{arch}.key` as a float (`default` when absent); UsageError naming it otherwise."""
        v = self.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise self.fail(f"metadata {self.arch}.{key} = {v!r} is not a number")
        return float(v)

    def finite(self, key: str, default, positive: bool) -> float:
        """`real`, refused unless finite and > 0 (`positive`: a rope base) or >= 0 (an RMS epsilon): llama.cpp
        takes any float, and a NaN or negative one computes NaNs; graphdiag refuses the file instead."""
        v = self.real(key, default)
        if v is not None and not (math.isfinite(v) and (v > 0 if positive else v >= 0)):
            raise self.fail(f"metadata {self.arch}.{key} = {v:g} is not a {'positive' if positive else 'non-negative'} "
                            f"finite number (the model would compute NaNs)")
        return v

    def fail(self, what: str) -> UsageError:
        return UsageError(f"{self.path}: {what}")


def base_config(meta: Meta, ff_required: bool = True, own_rope_scaling: bool = False, **arch_fields) -> ModelConfig:
    """The hyper-parameters every llama-family file gives, with llama.cpp's defaults for absent keys and its
    checks; `arch_fields` are the architecture's own ModelConfig fields (rope_type, ...). feed_forward_length
    is optional to llama.cpp's loader (0 when absent); `ff_required` refuses a file without it, for the graphs
    whose FFN it sizes (llama's, qwen2's, qwen3's), not for qwen3moe's, whose experts have their own key.
    `own_rope_scaling`: the architecture reads rope.scaling.* itself (gpt-oss's YaRN); else any scaling is refused."""
    n_embd, n_head = meta.need("embedding_length"), meta.need("attention.head_count")
    n_head_kv = meta.count("attention.head_count_kv", n_head)
    n_vocab = _n_vocab(meta)
    if n_head_kv <= 0 or n_head % n_head_kv or n_vocab <= 0:
        raise meta.fail(f"inconsistent metadata (heads {n_head}, kv heads {n_head_kv}, vocab {n_vocab})")
    k_len = meta.count("attention.key_length", n_embd // n_head)
    v_len = meta.count("attention.value_length", n_embd // n_head)
    n_rot = meta.count("rope.dimension_count", k_len)
    if k_len <= 0 or v_len != k_len or n_rot != k_len:
        # llama.cpp's llama/qwen2/qwen3 graphs assert n_embd_head_v == n_embd_head_k == n_rot
        raise meta.fail(f"{meta.arch}.attention.key_length {k_len}, value_length {v_len} and "
                        f"rope.dimension_count {n_rot} must be equal ({meta.arch}'s graph assumes it)")
    eps = meta.finite("attention.layer_norm_rms_epsilon", None, positive=False)
    if eps is None:
        raise meta.fail(f"metadata {meta.arch}.attention.layer_norm_rms_epsilon is missing (llama.cpp requires it)")
    if not own_rope_scaling:
        _check_rope_scaling(meta)
    n_ctx = min(meta.need("context_length"), N_CTX_MAX)
    names = meta.names
    fields = dict(arch=meta.arch, n_embd_head=k_len if k_len * n_head != n_embd else 0,
                  tied_output="output.weight" not in names, qkv_bias="blk.0.attn_q.bias" in names)
    fields.update(arch_fields)
    n_ff = meta.need("feed_forward_length") if ff_required else meta.count("feed_forward_length", 0)
    return ModelConfig(meta.path.stem, meta.need("block_count"), n_embd, n_head, n_head_kv, n_ff, n_vocab,
                       rope_base=meta.finite("rope.freq_base", 10000.0, positive=True), norm_eps=eps, n_ctx=n_ctx, **fields)


def expert_counts(meta: Meta) -> tuple[int, int]:
    """(expert_count, expert_used_count) with llama_model_base::load_hparams' checks (it asserts them), and
    refusing the grouped selection build_moe_ffn would add (expert_group_count > 1), which graphdiag does not
    build. (0, 0) for a dense file."""
    n_expert = meta.count("expert_count", 0)
    n_used = meta.count("expert_used_count", 0)
    groups = meta.count("expert_group_count", 0)
    if n_expert <= 0:
        if n_used or groups:
            raise meta.fail(f"{meta.arch}.expert_used_count {n_used} / expert_group_count {groups} without "
                            f"experts (expert_count {n_expert}): llama.cpp asserts they are 0")
        return 0, 0
    if n_expert > MAX_EXPERTS or not 0 < n_used <= n_expert:
        raise meta.fail(f"{meta.arch}.expert_count {n_expert}, expert_used_count {n_used}: llama.cpp needs "
                        f"0 < expert_used_count <= expert_count <= {MAX_EXPERTS}")
    if groups > 1:
        raise meta.fail(f"{meta.arch}.expert_group_count {groups}: build_moe_ffn's grouped expert selection is "
                        f"not built by graphdiag")
    return n_expert, n_used


def _n_vocab(meta: Meta) -> int:
    """llama.cpp's n_vocab: the tokenizer's token list, else token_embd's second dimension."""
    vocab = meta.raw("tokenizer.ggml.tokens")
    if vocab:
        return len(vocab)
    shape = meta.shape_of("token_embd.weight")
    return int(shape[1]) if shape is not None and len(shape) > 1 else 0


def _check_rope_scaling(meta: Meta) -> None:
    """graphdiag's rope has no frequency scaling: a file that asks for it is refused, not run wrongly."""
    kind = meta.get("rope.scaling.type", "linear")
    factor = meta.real("rope.scaling.factor", meta.real("rope.scale_linear", 0.0))
    if kind not in ("none", "linear") or factor not in (0.0, 1.0):
        raise meta.fail(f"rope scaling ({meta.arch}.rope.scaling.type {kind!r}, factor {factor}) is not "
                        f"computed by graphdiag")


# Per-weight scales llama.cpp 0c1e57098 loads for every architecture (llama_model::load_tensors' generic pass
# after load_arch_tensors: `<weight>.scale`, shape {1} or {n_expert}, and `<weight>.input_scale`, for the
# attention, FFN, expert, SSM and output weights; NVFP4 files carry them). build_lora_mm multiplies a mat-mul
# by its weight's scale where the arch's graph passes it (qwen2's and gemma3's FFN pass NULL; `.input_scale` is
# loaded but used by no graph): refused everywhere, deliberately wider than what a given graph reads.
WEIGHT_SCALES = (".scale", ".input_scale")


def refuse_present(meta: Meta, names: tuple[str, ...]) -> None:
    """Refuse a file that has a tensor llama.cpp would use and graphdiag's graph does not (naming it),
    instead of silently computing another model. `names` are suffixes (`attn_output.bias` matches each layer's);
    the per-weight scales (WEIGHT_SCALES) are refused for every architecture."""
    names = tuple(names) + WEIGHT_SCALES
    for n in sorted(meta.names):
        if n.endswith(names):
            why = (" (its generic pass loads it with NVFP4 weights; graphdiag refuses such files whole)"
                   if n.endswith(".input_scale") else
                   " (its generic pass loads it; build_lora_mm multiplies the mat-mul by it where the graph passes "
                   "it, and graphdiag refuses it everywhere rather than follow which)" if n.endswith(".scale") else "")
            raise meta.fail(f"tensor {n} changes {meta.arch}'s graph in llama.cpp{why}; graphdiag does not "
                            f"compute it")


def attention_specs(cfg: ModelConfig, il: int, wo: bool = True) -> Iterator[TensorSpec]:
    """attn_norm, Q/K/V (with their biases when cfg.qkv_bias: llama.cpp's create_tensor_qkv) and attn_output."""
    p, d, dkv = f"blk.{il}.", cfg.n_embd, cfg.n_embd_kv
    yield TensorSpec(p + "attn_norm.weight", (d,), NORM, "attn_norm", il)
    for n, f, ne in (("attn_q", "wq", (d, cfg.n_embd_q)), ("attn_k", "wk", (d, dkv)), ("attn_v", "wv", (d, dkv))):
        yield TensorSpec(p + n + ".weight", ne, WEIGHT, f, il)
    if cfg.qkv_bias:
        for n, f, m in (("attn_q", "bq", cfg.n_embd_q), ("attn_k", "bk", dkv), ("attn_v", "bv", dkv)):
            yield TensorSpec(p + n + ".bias", (m,), BIAS, f, il)
    if wo:
        yield TensorSpec(p + "attn_output.weight", (cfg.n_embd_q, d), WEIGHT, "wo", il)


def ffn_specs(cfg: ModelConfig, il: int) -> Iterator[TensorSpec]:
    """ffn_norm, then the dense SwiGLU FFN (gate, up, down) or the MoE router and expert stacks."""
    p, d = f"blk.{il}.", cfg.n_embd
    yield TensorSpec(p + "ffn_norm.weight", (d,), NORM, "ffn_norm", il)
    if cfg.is_moe:
        e, f = cfg.n_expert, cfg.n_ff_exp
        yield TensorSpec(p + "ffn_gate_inp.weight", (d, e), ROUTER, "ffn_gate_inp", il)
        yield TensorSpec(p + "ffn_gate_exps.weight", (d, f, e), WEIGHT, "ffn_gate_exps", il)
        yield TensorSpec(p + "ffn_up_exps.weight", (d, f, e), WEIGHT, "ffn_up_exps", il)
        yield TensorSpec(p + "ffn_down_exps.weight", (f, d, e), WEIGHT, "ffn_down_exps", il)
        return
    f = cfg.n_ff
    yield TensorSpec(p + "ffn_gate.weight", (d, f), WEIGHT, "ffn_gate", il)
    yield TensorSpec(p + "ffn_up.weight", (d, f), WEIGHT, "ffn_up", il)
    yield TensorSpec(p + "ffn_down.weight", (f, d), WEIGHT, "ffn_down", il)


def model_specs(cfg: ModelConfig, layer_specs: Callable[[ModelConfig, int], Iterator[TensorSpec]]) -> list[TensorSpec]:
    """token_embd, each layer's tensors, output_norm and (unless tied) output: the creation order."""
    d = cfg.n_embd
    out = [TensorSpec("token_embd.weight", (d, cfg.n_vocab), WEIGHT, "tok_embd")]
    for il in range(cfg.n_layer):
        out += layer_specs(cfg, il)
    out.append(TensorSpec("output_norm.weight", (d,), NORM, "output_norm"))
    if not cfg.tied_output:
        out.append(TensorSpec("output.weight", (d, cfg.n_vocab), WEIGHT, "output"))
    return out


def sliding_window_layers(meta: Meta, name: str, n_layer: int, default: int) -> tuple[bool, ...]:
    """Which layers slide their window: {arch}.attention.sliding_window_pattern as a per-layer list, or as a
    period (every n-th layer global: presets.swa_pattern), else `default` as that period."""
    from ..presets import swa_pattern
    pat = meta.get("attention.sliding_window_pattern", default)
    if isinstance(pat, (list, tuple)):
        layers = tuple(bool(x) for x in pat)
        if len(layers) != n_layer:
            raise meta.fail(f"{name}.attention.sliding_window_pattern has {len(layers)} entries for {n_layer} layers")
        return layers
    return swa_pattern(n_layer, int(pat))

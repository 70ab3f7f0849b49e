"""Gemma 3 (llama.cpp 0c1e57098 `src/models/gemma3.cpp`): hyper-parameters, weight structs, decode graph.

What differs from llama: the embedding is scaled by sqrt(n_embd); Q and K are RMS-normed over head_dim
(QK-norm) before a NEOX rope whose base is per layer (rope.freq_base on global layers, rope.freq_base_swa,
default 10 000, on sliding ones); Q is scaled by f_attention_scale (1/sqrt(head_dim)) and flash attention
runs at scale 1; the attention and FFN outputs are RMS-normed again (post norms) before their residual adds;
the FFN is GEGLU (tanh GELU); head_dim is key_length, not n_embd/n_head; the output is tied to token_embd
when output.weight is absent. With a sliding window, layer il is sliding unless (il + 1) % pattern == 0
(llama_hparams::set_swa_pattern, pattern 6 by default) and reads llama.cpp's iSWA cache: its own K/V cache,
cell indices and mask.

The graph is llama.cpp's node for node, views included (12 per layer: the Q/K/V reshapes, the cache-write
views of K and V, the cache views, Q's 4-d view, the three permutes and the attention's reshape), so its node
count and op census equal upstream's. Names are llama.cpp's (its `cb` names, ggml's "(view)"/"(permuted)"
suffixes); the few nodes llama.cpp leaves unnamed get a label in the same style (said where). The KQ masks are
F16 inputs read by flash attention directly (0c1e57098 builds no cast); the SWA layers' inputs carry a
"_swa" suffix (upstream names both "attn_inp_kq_mask"), so a report tells the two masks apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...errors import UsageError
from ...ir.arena import Arena
from ...ir.build import Ctx
from ...ir.dtypes import GGMLType
from ...ir.tensor import Tensor
from ..kv_sizes import N_UBATCH, swa_cache_size


@dataclass(frozen=True)
class Gemma3Config:
    """Gemma 3 hyper-parameters. Sizes are element counts; `n_ctx`: the global cache's cells; `n_swa`: the
    window in positions (0: no sliding window, one cache); `swa_layers`: which layers slide."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    norm_eps: float = 1e-6
    rope_base: float = 10000.0
    rope_base_swa: float = 10000.0
    n_swa: int = 0
    swa_layers: tuple = ()
    n_ctx: int = 4096
    n_seq_max: int = 1
    swa_full: bool = False
    tied: bool = True                # output.weight absent: the lm_head is token_embd
    arch: str = "gemma3"
    n_expert: int = 0                # what the llama-shaped code asks of every config
    n_expert_used: int = 0
    is_moe: bool = False

    @property
    def n_embd_kv(self) -> int:
        return self.head_dim * self.n_head_kv

    @property
    def n_embd_q(self) -> int:
        return self.head_dim * self.n_head

    @property
    def f_attention_scale(self) -> float:
        """1/sqrt(head_dim); the 27B (62 layers) uses 1/sqrt(n_embd/n_head) (load_arch_hparams)."""
        d = self.n_embd // self.n_head if self.n_layer == 62 else self.head_dim
        return 1.0 / math.sqrt(float(d))

    def is_swa(self, il: int) -> bool:
        return self.n_swa > 0 and bool(self.swa_layers[il])

    def rope_base_of(self, il: int) -> float:
        return self.rope_base_swa if self.is_swa(il) else self.rope_base

    @property
    def swa_size(self) -> int:
        """The SWA cache's cells (0 without a window)."""
        if self.n_swa <= 0:
            return 0
        return swa_cache_size(self.n_ctx, self.n_swa, self.n_seq_max, N_UBATCH, True, self.swa_full)


def swa_pattern(n_layer: int, n_pattern: int = 6) -> tuple:
    """set_swa_pattern(n_pattern, dense_first=false): layer il slides unless il % n_pattern == n_pattern - 1
    (every layer slides with n_pattern 0)."""
    return tuple(n_pattern == 0 or (il % n_pattern < n_pattern - 1) for il in range(n_layer))


def config_from_metadata(kv: Mapping[str, object], n_vocab: int, name: str, n_ctx: int, n_seq_max: int = 1,
                         swa_full: bool = False, tied: bool = True) -> Gemma3Config:
    """The config from a file's `gemma3.*` keys with llama.cpp's defaults for absent ones: head_count_kv =
    head_count, key_length = n_embd/n_head, rms eps (required), rope.freq_base 10 000, freq_base_swa 10 000,
    sliding_window_pattern 6 (an integer or one bool per layer), no window when sliding_window is absent."""
    def get(key, default=None):
        v = kv.get(f"gemma3.{key}", default)
        if v is None:
            raise UsageError(f"gemma3 file: metadata key gemma3.{key} is missing")
        return v
    n_layer, n_embd, n_head = int(get("block_count")), int(get("embedding_length")), int(get("attention.head_count"))
    n_swa = int(get("attention.sliding_window", 0))
    pat = kv.get("gemma3.attention.sliding_window_pattern", 6)
    layers = tuple(bool(x) for x in pat) if isinstance(pat, (list, tuple)) else swa_pattern(n_layer, int(pat))
    if len(layers) != n_layer:
        raise UsageError(f"gemma3 file: sliding_window_pattern has {len(layers)} entries for {n_layer} layers")
    return Gemma3Config(
        name=name, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
        n_head_kv=int(get("attention.head_count_kv", n_head)),
        head_dim=int(get("attention.key_length", n_embd // n_head)),
        n_ff=int(get("feed_forward_length")), n_vocab=n_vocab,
        norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_base=float(get("rope.freq_base", 10000.0)),
        rope_base_swa=float(get("rope.freq_base_swa", 10000.0)),
        n_swa=n_swa, swa_layers=layers if n_swa > 0 else (False,) * n_layer,
        n_ctx=n_ctx, n_seq_max=n_seq_max, swa_full=swa_full, tied=tied)


# -- weights --------------------------------------------------------------------------------------------------
@dataclass
class Gemma3Layer:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    attn_post_norm: Tensor
    attn_k_norm: Tensor
    attn_q_norm: Tensor
    ffn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor
    ffn_post_norm: Tensor
    k_cache: Tensor = None
    v_cache: Tensor = None


@dataclass
class Gemma3Structs:
    tok_embd: Tensor
    output_norm: Tensor
    output: Tensor
    layers: list = field(default_factory=list)


def weight_shapes(cfg: Gemma3Config) -> dict[str, tuple]:
    """Every weight's name -> ggml ne, in llama.cpp's load order (load_arch_tensors)."""
    d, f, q, kv, hd = cfg.n_embd, cfg.n_ff, cfg.n_embd_q, cfg.n_embd_kv, cfg.head_dim
    out = {"token_embd.weight": (d, cfg.n_vocab), "output_norm.weight": (d,)}
    if not cfg.tied:
        out["output.weight"] = (d, cfg.n_vocab)
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        out.update({p + "attn_norm.weight": (d,), p + "attn_q.weight": (d, q), p + "attn_k.weight": (d, kv),
                    p + "attn_v.weight": (d, kv), p + "attn_output.weight": (q, d),
                    p + "post_attention_norm.weight": (d,), p + "attn_k_norm.weight": (hd,),
                    p + "attn_q_norm.weight": (hd,), p + "ffn_norm.weight": (d,), p + "ffn_gate.weight": (d, f),
                    p + "ffn_up.weight": (d, f), p + "ffn_down.weight": (f, d), p + "post_ffw_norm.weight": (d,)})
    return out


_LAYER_FIELDS = (("attn_norm", "attn_norm"), ("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"),
                 ("wo", "attn_output"), ("attn_post_norm", "post_attention_norm"), ("attn_k_norm", "attn_k_norm"),
                 ("attn_q_norm", "attn_q_norm"), ("ffn_norm", "ffn_norm"), ("ffn_gate", "ffn_gate"),
                 ("ffn_up", "ffn_up"), ("ffn_down", "ffn_down"), ("ffn_post_norm", "post_ffw_norm"))


def create_structs(cfg: Gemma3Config, arena: Arena, types: Mapping[str, GGMLType], wtype: GGMLType) -> Gemma3Structs:
    """The weight structs (llama.cpp's load order) then the caches: the global cache's layers first, then the
    SWA cache's (llama_kv_cache_iswa makes kv_base before kv_swa), F16, (n_embd_kv, cells) each. Norms are F32;
    a weight takes its type from `types` (a file's) or `wtype`."""
    ctx = Ctx(arena)
    made = {}
    for name, ne in weight_shapes(cfg).items():
        t = types.get(name) or (GGMLType.F32 if name.endswith("norm.weight") else wtype)
        made[name] = ctx.new_tensor(t, ne, name)
    layers = [Gemma3Layer(**{f: made[f"blk.{il}.{n}.weight"] for f, n in _LAYER_FIELDS}) for il in range(cfg.n_layer)]
    for swa in (False, True):
        for il, lay in enumerate(layers):
            if cfg.is_swa(il) == swa:
                cells = cfg.swa_size if swa else cfg.n_ctx
                lay.k_cache = ctx.new_tensor(GGMLType.F16, (cfg.n_embd_kv, cells), f"cache_k_l{il}")
                lay.v_cache = ctx.new_tensor(GGMLType.F16, (cfg.n_embd_kv, cells), f"cache_v_l{il}")
    tok = made["token_embd.weight"]
    return Gemma3Structs(tok, made["output_norm.weight"], made.get("output.weight", tok), layers)


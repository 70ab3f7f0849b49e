"""llama.cpp's quantization mixes for the --wtype names that are llama_ftypes: the type llama-quantize gives
each of a preset's weights in a Q2_K, a Q3_K_M or an MXFP4_MOE file (llama-quant.cpp llama_tensor_get_type_impl).

A mix starts every quantizable weight at the ftype's default type and moves a few by their role, read from
the tensor's name as upstream's tensor_get_category reads it: the output projection (and a tied embedding)
to Q6_K (Q8_0 where its rows are no multiple of 256), attn_v / ffn_down / attn_output to more bits, and the
8-expert rules (attn_v and attn_k to Q8_0, attn_output to Q5_K). The counters upstream keeps (i_attention_wv,
i_ffn_down over n_layer) count the layers of these presets in order, so they are the layer index here.
What upstream decides from arch or size alone is left out, as none of graphdiag's presets has it: FALCON's
rules, and the 70B bump of attn_v. The row-length fallback (presets.preset_type) applies afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.dtypes import QK_K, GGMLType

G = GGMLType


@dataclass(frozen=True)
class Mix:
    """An ftype's mix: its --wtype name, llama.cpp's name for it, its default type and its llama_ftype."""

    name: str
    label: str
    base: GGMLType
    ftype: int

    def tensor_type(self, cfg, name: str, ne0: int) -> GGMLType:
        """The type upstream picks for weight `name` (row length ne0) of a model of config `cfg`, before the
        row-length fallback."""
        rule = _RULES[self.label]
        if rule is _mxfp4_moe:
            return rule(cfg, _category(name, cfg), _layer(name), ne0, name)
        return rule(cfg, _category(name, cfg), _layer(name), ne0)


def _category(name: str, cfg) -> str:
    """tensor_get_category, with a tied embedding counted as the output (has_tied_embeddings)."""
    if name == "output.weight" or (name == "token_embd.weight" and cfg.tied_output):
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for key in ("attn_v.weight", "attn_k.weight", "attn_q.weight", "attn_output.weight", "ffn_up", "ffn_gate",
                "ffn_down"):
        if key in name:
            return key.removesuffix(".weight")
    return "other"


def _layer(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def _output(ne0: int) -> GGMLType:
    """The output projection of any K-quant mix: Q6_K, or Q8_0 where its rows do not fit 256-blocks."""
    return G.Q8_0 if ne0 % QK_K else G.Q6_K


def _q2_k(cfg, cat: str, il: int, ne0: int) -> GGMLType:
    """LLAMA_FTYPE_MOSTLY_Q2_K."""
    experts8 = cfg.n_expert == 8
    if cat == "output":
        return _output(ne0)
    if cat == "attn_v":
        return G.Q8_0 if experts8 else G.Q4_K if cfg.n_head // cfg.n_head_kv >= 4 else G.Q3_K
    if cat == "attn_k" and experts8:
        return G.Q8_0
    if cat == "ffn_down":
        return G.Q3_K
    if cat == "attn_output":
        return G.Q5_K if experts8 else G.Q3_K
    return G.Q2_K


def _q3_k_m(cfg, cat: str, il: int, ne0: int) -> GGMLType:
    """LLAMA_FTYPE_MOSTLY_Q3_K_M (not FALCON: its ffn_down keeps Q3_K on layers use_more_bits skips)."""
    experts8 = cfg.n_expert == 8
    if cat == "output":
        return _output(ne0)
    if cat == "attn_v":
        return G.Q8_0 if experts8 else G.Q5_K if il < 2 else G.Q4_K
    if cat == "attn_k" and experts8:
        return G.Q8_0
    if cat == "ffn_down":
        return G.Q5_K if il < cfg.n_layer // 16 else G.Q4_K
    if cat == "attn_output":
        return G.Q5_K if experts8 else G.Q4_K
    return G.Q3_K


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth of n layers, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _k_quant(label: str):
    """LLAMA_FTYPE_MOSTLY_Q4_K_S / Q4_K_M / Q5_K_S / Q5_K_M: the base K type, the output Q6_K, and by role
    (not FALCON): attn_v Q6_K on use_more_bits's layers (the _M mixes) or Q5_K on the first four (Q4_K_S),
    ffn_down likewise (Q6_K on use_more_bits's layers for the _M mixes, Q5_K on the first eighth for Q4_K_S);
    with 8 experts attn_v and attn_k Q8_0, and attn_output Q5_K for the Q4_K mixes."""
    base = G.Q4_K if label.startswith("Q4") else G.Q5_K
    medium = label.endswith("_M")

    def rule(cfg, cat: str, il: int, ne0: int) -> GGMLType:
        experts8, n = cfg.n_expert == 8, cfg.n_layer
        if cat == "output":
            return _output(ne0)
        if cat == "attn_v":
            if experts8:
                return G.Q8_0
            if medium and use_more_bits(il, n):
                return G.Q6_K
            return G.Q5_K if label == "Q4_K_S" and il < 4 else base
        if cat == "attn_k" and experts8:
            return G.Q8_0
        if cat == "ffn_down":
            if medium and use_more_bits(il, n):
                return G.Q6_K
            return G.Q5_K if label == "Q4_K_S" and il < n // 8 else base
        if cat == "attn_output" and experts8 and base == G.Q4_K:
            return G.Q5_K
        return base
    rule.__doc__ = f"LLAMA_FTYPE_MOSTLY_{label}."
    return rule


def _mxfp4_moe(cfg, cat: str, il: int, ne0: int, name: str = "") -> GGMLType:
    """LLAMA_FTYPE_MOSTLY_MXFP4_MOE: the expert stacks (3-d: ne[2] > 1) MXFP4, every other weight Q8_0 (the
    output projection and the embedding too; 1-d tensors stay F32 as in any mix)."""
    return G.MXFP4 if name.endswith("_exps.weight") else G.Q8_0


_RULES = {"Q2_K": _q2_k, "Q3_K_M": _q3_k_m, "MXFP4_MOE": _mxfp4_moe,
          **{label: _k_quant(label) for label in ("Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M")}}
# --wtype name -> its mix (llama_ftype: LLAMA_FTYPE_MOSTLY_Q2_K = 10, Q3_K_M = 12, Q4_K_S = 14, Q4_K_M = 15,
# Q5_K_S = 16, Q5_K_M = 17, MXFP4_MOE = 38)
MIXES = {"q2_k": Mix("q2_k", "Q2_K", G.Q2_K, 10), "q3_k_m": Mix("q3_k_m", "Q3_K_M", G.Q3_K, 12),
         "q4_k_s": Mix("q4_k_s", "Q4_K_S", G.Q4_K, 14), "q4_k_m": Mix("q4_k_m", "Q4_K_M", G.Q4_K, 15),
         "q5_k_s": Mix("q5_k_s", "Q5_K_S", G.Q5_K, 16), "q5_k_m": Mix("q5_k_m", "Q5_K_M", G.Q5_K, 17),
         "mxfp4_moe": Mix("mxfp4_moe", "MXFP4_MOE", G.MXFP4, 38)}

"""A tiny random-weight Gemma 3 GGUF, written with the gguf package's writer (not graphdiag's exporter), with
the keys and tensor names of the real gemma-3-270m file (real-models.md) and small shapes.

Like the real file: arch gemma3, an SPM ("llama") vocabulary with bos 2 / eos 1, head_dim (key_length) set
apart from n_embd / n_head, one KV head, a sliding window and no sliding_window_pattern (llama.cpp's default
6), no rope.freq_base_swa (10 000), no final_logit_softcapping, no output.weight (tied), F32 norms.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TinyGemma:
    n_layer: int = 7          # two global layers (5 and, with pattern 6, none more below 11): 5 only, 6 sliding
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 1
    head_dim: int = 32        # n_head * head_dim = 128 != n_embd, as the real 4 x 256 vs 640
    n_ff: int = 128
    n_vocab: int = 320        # the 259 special and byte pieces + placeholders
    n_ctx: int = 1024
    window: int = 16          # sliding_window: small, so a short run leaves it
    rope_base: float = 1e6
    eps: float = 1e-6
    wtype: str = "f16"        # the mat-mul weights' type: f16 | q8_0 | f32


def write_tiny_gemma3(path: Path, shape: TinyGemma = TinyGemma(), seed: int = 0) -> Path:
    """Write the file at `path`; returns it."""
    import gguf
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "gemma3")
    s = shape
    w.add_name("tiny gemma3 (graphdiag test)")
    w.add_uint32("gemma3.context_length", s.n_ctx)
    w.add_uint32("gemma3.embedding_length", s.n_embd)
    w.add_uint32("gemma3.block_count", s.n_layer)
    w.add_uint32("gemma3.feed_forward_length", s.n_ff)
    w.add_uint32("gemma3.attention.head_count", s.n_head)
    w.add_uint32("gemma3.attention.head_count_kv", s.n_head_kv)
    w.add_uint32("gemma3.attention.key_length", s.head_dim)
    w.add_uint32("gemma3.attention.value_length", s.head_dim)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", s.eps)
    w.add_float32("gemma3.rope.freq_base", s.rope_base)
    w.add_uint32("gemma3.attention.sliding_window", s.window)
    _vocab(w, s.n_vocab)
    for name, ne in _tensors(s):
        _add(w, name, ne, rng, s.wtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _tensors(s: TinyGemma):
    """(name, ggml ne) in the real file's names; no output.weight."""
    d, q, kv, f = s.n_embd, s.n_head * s.head_dim, s.n_head_kv * s.head_dim, s.n_ff
    yield "token_embd.weight", (d, s.n_vocab)
    yield "output_norm.weight", (d,)
    for il in range(s.n_layer):
        p = f"blk.{il}."
        yield from ((p + "attn_norm.weight", (d,)), (p + "attn_q.weight", (d, q)), (p + "attn_k.weight", (d, kv)),
                    (p + "attn_v.weight", (d, kv)), (p + "attn_output.weight", (q, d)),
                    (p + "post_attention_norm.weight", (d,)), (p + "attn_k_norm.weight", (s.head_dim,)),
                    (p + "attn_q_norm.weight", (s.head_dim,)), (p + "ffn_norm.weight", (d,)),
                    (p + "ffn_gate.weight", (d, f)), (p + "ffn_up.weight", (d, f)), (p + "ffn_down.weight", (f, d)),
                    (p + "post_ffw_norm.weight", (d,)))


def _add(w, name: str, ne, rng, wtype: str) -> None:
    """Norms: 1 + 0.1 noise, F32; weights (the embedding too): N(0, 1/sqrt(ne[0])) in `wtype`."""
    import gguf
    shape = tuple(reversed(ne))
    if name.endswith("norm.weight"):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
        return
    # the embedding at 1/sqrt(n_embd), as trained ones: x sqrt(n_embd) gives rows of RMS ~1, so the residual is
    # not one token's row (with the tied lm_head, that would predict the input token again every step)
    scale = 1.0 / np.sqrt(ne[0])
    x = (scale * rng.standard_normal(shape)).astype(np.float32)
    if wtype == "q8_0":
        q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        w.add_tensor(name, x.astype(np.float16) if wtype == "f16" else x)


def _vocab(w, n_vocab: int) -> None:
    """SPM pieces as the real file's tokenizer fields: <pad> 0, <eos> 1, <bos> 2, <unk> 3, bytes, placeholders."""
    import gguf
    T = gguf.TokenType
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [T.CONTROL, T.CONTROL, T.CONTROL, T.UNKNOWN, *([T.BYTE] * 256)]
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    types += [T.NORMAL] * (n_vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([int(t) for t in types])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)

"""A byte-level BPE ("gpt2") vocabulary of placeholder pieces that llama.cpp 0c1e57098 loads, for exported
qwen2/qwen3 files.

llama.cpp's BPE loader (llama-vocab.cpp, tokenizer model "gpt2") needs `tokenizer.ggml.merges` (refuses the
file without it), a token for every byte's GPT-2 character (byte_to_token looks each one up: the linefeed
"Ċ" at load), and a pre-tokenizer it knows (`qwen2`). The vocabulary: the 256 byte characters in byte order,
then tokens made by merging two byte characters (the merge "a b" gives the token "ab", ranked in token
order), then `<|endoftext|>` (CONTROL) as bos and eos, as Qwen's files have it; add_bos_token false.
"""

from __future__ import annotations

from itertools import product

from ..errors import UsageError

ENDOFTEXT = "<|endoftext|>"
N_BYTES = 256


def byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: the character each byte 0..255 is written as (printable bytes stand for
    themselves, the others for chr(256 + n) in byte order)."""
    keep = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    out, extra = [], 256
    for b in range(N_BYTES):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(extra))
            extra += 1
    return out


def bpe_vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of n_vocab pieces: bytes, merged pairs, then <|endoftext|>."""
    from gguf import TokenType
    n_merged = n_vocab - N_BYTES - 1
    if n_merged < 0 or n_merged > N_BYTES * N_BYTES:
        raise UsageError(f"a byte-level BPE vocabulary of {n_vocab} tokens needs {N_BYTES + 1}.."
                         f"{N_BYTES * N_BYTES + N_BYTES + 1} tokens")
    chars = byte_chars()
    pairs = [(a, b) for a, b in product(chars, chars)][:n_merged]
    tokens = [*chars, *(a + b for a, b in pairs), ENDOFTEXT]
    types = [int(TokenType.NORMAL)] * (N_BYTES + n_merged) + [int(TokenType.CONTROL)]
    return tokens, types, [f"{a} {b}" for a, b in pairs]


def write_bpe_vocab(w, n_vocab: int) -> None:
    """The tokenizer fields of bpe_vocab(n_vocab) on GGUFWriter `w`."""
    tokens, types, merges = bpe_vocab(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eot = len(tokens) - 1
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(False)

"""Vocabulary GGUF files for the tokenizer sweep (tools/record_tokenize_sweep.py): byte-level BPE vocabularies
from tiktoken-style rank tables, and a vocabulary cut down to what a set of texts can reach.

- `from_ranks`: a vocab-only GGUF (tokenizer.ggml.model gpt2) from {token bytes: rank} plus special tokens, as
  llama.cpp's converter writes tiktoken vocabularies: each token written in GPT-2's byte alphabet, and the merge
  of each multi-byte token recovered by running BPE over its bytes with the tokens ranked before it (the two
  pieces left are its merge). Used for Mistral's tekken (mistral-common's tekken_240911.json) and OpenAI's
  o200k (the gpt-4o pre-tokenizer), for which llama.cpp ships no vocab file.
- `compact`: a copy of a vocab-only GGUF with only the tokens a set of texts can produce (every token that is
  a substring of a text's byte-encoded form, the 256 byte tokens, the special tokens and those the metadata
  names) and only the merges that can apply to them (those whose joined pieces are such a substring), merge
  order kept. Any split of these texts tokenizes alike with both files, ids mapped through the kept list:
  the recorder checks that with llama.cpp itself.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import gguf

from graphdiag.model.pretokenize import BYTE_CHARS
from graphdiag.model.tokenize import SPECIAL_BY_TEXT

NORMAL, CONTROL = 1, 3
ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "seperator_token_id", "padding_token_id",
           "eot_token_id", "eom_token_id")
LLAMA_HPARAMS = {"llama.context_length": 4096, "llama.embedding_length": 64, "llama.block_count": 1,
                 "llama.feed_forward_length": 128, "llama.attention.head_count": 1,
                 "llama.attention.head_count_kv": 1, "llama.attention.layer_norm_rms_epsilon": 1e-5}


def encode(raw: bytes) -> str:
    return "".join(BYTE_CHARS[b] for b in raw)


def _merge_of(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two pieces BPE leaves of `token` with only the tokens ranked before it."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {rank}) has no merge")
    return parts[0], parts[1]


def from_ranks(path: Path, ranks: dict[bytes, int], specials: list[tuple[int, str]], offset: int, pre: str,
               bos: int, eos: int) -> None:
    """Write a vocab-only GGUF: the ranked tokens at id rank + offset, `specials` (id, text) as CONTROL, and
    any id left between them as an unused CONTROL filler."""
    size = max(max(ranks.values()) + offset, max(i for i, _ in specials)) + 1
    tokens = [f"<unused_{i}>" for i in range(size)]
    types = [CONTROL] * size
    for raw, r in ranks.items():
        tokens[r + offset], types[r + offset] = encode(raw), NORMAL
    for i, text in specials:
        tokens[i], types[i] = text, CONTROL
    merges = [(r, _merge_of(raw, r, ranks)) for raw, r in ranks.items() if len(raw) > 1]
    merges.sort()
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in LLAMA_HPARAMS.items():
        (w.add_float32 if isinstance(v, float) else w.add_uint32)(k, v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{encode(a)} {encode(b)}" for _, (a, b) in merges])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    _close(w)


def tekken_ranks(path: Path) -> tuple[dict[bytes, int], list[tuple[int, str]]]:
    """mistral-common's tekken JSON: (ranks of the live vocabulary, the special tokens at ids 0..n-1)."""
    j = json.loads(path.read_text())
    cfg = j["config"]
    n_special = cfg["default_num_special_tokens"]
    live = cfg["default_vocab_size"] - n_special
    ranks = {base64.b64decode(e["token_bytes"]): e["rank"] for e in j["vocab"] if e["rank"] < live}
    named = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
             "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
             "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]
    specials = [(i, named[i] if i < len(named) else f"<SPECIAL_{i}>") for i in range(n_special)]
    return ranks, specials


def quicktok_ranks(path: Path) -> dict[bytes, int]:
    """A quicktok .vocab table (u32 count, then u16 length, bytes, u32 rank per token)."""
    data = path.read_bytes()
    (count,), at, ranks = struct.unpack_from("<I", data), 4, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<H", data, at)
        raw = data[at + 2:at + 2 + n]
        (r,) = struct.unpack_from("<I", data, at + 2 + n)
        ranks[raw] = r
        at += 6 + n
    return ranks


def _field(r: gguf.GGUFReader, key: str):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def compact(src: Path, dst: Path, texts: list[str] | None, pre: str | None = None) -> list[int]:
    """Write the cut-down copy of `src` for `texts` to `dst` (texts None: a whole copy, to give it another
    pre-tokenizer); returns the kept ids (new id -> old id)."""
    r = gguf.GGUFReader(str(src))
    tokens = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in r.fields["tokenizer.ggml.tokens"].data]
    types = list(_field(r, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    merges = _field(r, "tokenizer.ggml.merges")
    if texts is None:
        hay, merges_kept = None, merges
    else:
        hay = "\n".join(encode(t.encode("utf-8")) for t in texts)    # "\n" is no byte character: a boundary
        merges_kept = [m for m in merges if m.replace(" ", "", 1) in hay]
    named = {int(_field(r, f"tokenizer.ggml.{k}")) for k in ID_KEYS if _field(r, f"tokenizer.ggml.{k}") is not None}
    keep = [i for i, t in enumerate(tokens)
            if hay is None or t in hay or t in BYTE_CHARS or types[i] != NORMAL or t in SPECIAL_BY_TEXT or i in named]
    new_id = {old: new for new, old in enumerate(keep)}
    w = gguf.GGUFWriter(str(dst), _field(r, "general.architecture"))
    for key, f in r.fields.items():
        if key.startswith(("GGUF.", "general.architecture", "tokenizer.")) or key.endswith(".vocab_size"):
            continue
        _copy(w, key, f)
    w.add_tokenizer_model(_field(r, "tokenizer.ggml.model"))
    w.add_tokenizer_pre(pre or _field(r, "tokenizer.ggml.pre"))
    w.add_token_list([tokens[i] for i in keep])
    w.add_token_types([types[i] for i in keep])
    w.add_token_merges(merges_kept)
    for k in ID_KEYS:
        v = _field(r, f"tokenizer.ggml.{k}")
        if v is not None and int(v) in new_id:
            w.add_uint32(f"tokenizer.ggml.{k}", new_id[int(v)])
    for k in ("add_bos_token", "add_eos_token", "add_space_prefix"):
        v = _field(r, f"tokenizer.ggml.{k}")
        if v is not None:
            w.add_bool(f"tokenizer.ggml.{k}", bool(v))
    _close(w)
    return keep


def _copy(w: gguf.GGUFWriter, key: str, f) -> None:
    """One scalar metadata field, copied with its type (arrays other than the tokenizer's are left out)."""
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        return
    v = f.contents()
    adders = {gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.INT32: w.add_int32,
              gguf.GGUFValueType.FLOAT32: w.add_float32, gguf.GGUFValueType.BOOL: w.add_bool,
              gguf.GGUFValueType.STRING: w.add_string, gguf.GGUFValueType.UINT64: w.add_uint64,
              gguf.GGUFValueType.UINT8: w.add_uint8}
    if t in adders:
        adders[t](key, v)


def _close(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def crafted(path: Path, pre: str) -> None:
    """A small vocabulary for what real ones seldom show: whole-word tokens BPE cannot reach ("abc", "Ġabc"
    with only the merge "a b": taken whole where the pre-tokenizer ignores merges), and end-of-generation
    pieces typed NORMAL ("<|endoftext|>", "<|im_end|>": special all the same) beside a NORMAL "<|im_start|>"
    (plain text)."""
    words = ["ab", "abc", "\u0120abc", "12", "123", "<|endoftext|>", "<|im_end|>", "<|im_start|>"]
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in LLAMA_HPARAMS.items():
        (w.add_float32 if isinstance(v, float) else w.add_uint32)(k, v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list([*BYTE_CHARS, *words])
    w.add_token_types([NORMAL] * (256 + len(words)))
    w.add_token_merges(["a b", "1 2"])
    w.add_bos_token_id(256 + words.index("<|endoftext|>"))
    w.add_eos_token_id(256 + words.index("<|endoftext|>"))
    _close(w)


def main() -> None:
    """tokenize_vocabs.py tekken TEKKEN_JSON OUT.gguf | o200k QUICKTOK_VOCAB OUT.gguf"""
    import sys
    kind, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if kind == "tekken":
        ranks, specials = tekken_ranks(src)
        from_ranks(dst, ranks, specials, len(specials), "tekken", bos=1, eos=2)
    elif kind == "o200k":
        ranks = quicktok_ranks(src)
        n = max(ranks.values()) + 1
        from_ranks(dst, ranks, [(n, "<|endoftext|>"), (n + 1, "<|endofprompt|>")], 0, "gpt-4o", bos=n, eos=n)
    else:
        raise SystemExit(main.__doc__)


if __name__ == "__main__":
    main()

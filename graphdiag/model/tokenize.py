"""Text -> token ids through a GGUF file's vocabulary, as llama.cpp 0c1e57098's llama_tokenize does
(src/llama-vocab.cpp) with add_special and parse_special both true (what llama-server and llama-simple pass
for a prompt): special tokens in the text are cut out first (control and user-defined pieces, longest first),
BOS / EOS added as the metadata says (tokenizer.ggml.add_bos_token / add_eos_token, else llama.cpp's
defaults: SPM adds BOS, BPE neither), and each stretch of text between them tokenized by the file's model:

- SPM ("llama": Gemma 3, Llama 2, graphdiag's exports): a space put first where add_space_prefix says (default
  true; Gemma 3's files say false), spaces written as "▁", then llama.cpp's bigram merges — the adjacent pair
  whose joined text is a piece with the highest score first (ties: the leftmost), over UTF-8 characters —
  and pieces that are no token written as their bytes' <0xNN> tokens.
- byte-level BPE ("gpt2": Llama 3, Qwen2/3, SmolLM2, DeepSeek, Mistral's tekken, ...): words split by the
  pre-tokenizer tokenizer.ggml.pre names (model/pretokenize.py), each word merged by merge rank (lowest first,
  ties: leftmost) — or, where the pre-tokenizer ignores merges (llama3, tekken), taken whole when it is a
  token — and a piece that is no token written as its single-byte tokens.

Hand-written, not sentencepiece or tokenizers: neither reproduces these rules exactly (sentencepiece
normalises text and treats user-defined pieces and byte fallback its own way; llama.cpp's SPM is a bigram
merge by score of its own, and its BPE splits words with its own code, not a regex engine). Exact for these
rules; what is not reproduced: per-model strip attributes (Phi-3's rstrip, jina's <mask> lstrip), other
tokenizer models (WPM, UGM, RWKV) and the pre-tokenizers pretokenize.PRE_TOKENIZERS does not name (refused by
name).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..errors import UsageError
from .pretokenize import PRE_TOKENIZERS, split_words

# GGUF token types (gguf.TokenType), llama.cpp's LLAMA_TOKEN_TYPE_*
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"
# pieces that are special tokens whatever their type: llama.cpp's loader makes its end-of-generation pieces
# CONTROL and gpt-oss's four USER_DEFINED (its FIM detection, which makes one piece of each kind CONTROL where
# the metadata names none, picks in hash order: not reproduced)
SPECIAL_BY_TEXT = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
    "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"])


@dataclass
class Vocab:
    """A file's vocabulary as llama.cpp loads it: pieces (their UTF-8 bytes), scores, types, merges, flags."""

    model: str                               # "llama" (SPM) or "gpt2" (byte-level BPE)
    pre: str                                 # tokenizer.ggml.pre ("default" where absent)
    pieces: list[bytes]
    scores: list[float]
    types: list[int]
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    ranks: dict[tuple[bytes, bytes], int] = field(default_factory=dict)
    ignore_merges: bool = False              # a BPE word that is a token is taken whole (llama3, tekken)
    ids: dict[bytes, int] = field(default_factory=dict)
    special: list[int] = field(default_factory=list)     # control/user-defined/unknown ids, longest text first

    def __post_init__(self):
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        keep = (CONTROL, USER_DEFINED, UNKNOWN)
        by_text = {p.encode("utf-8") for p in SPECIAL_BY_TEXT}
        self.special = sorted((i for i, t in enumerate(self.types) if t in keep or self.pieces[i] in by_text),
                              key=lambda i: -len(self.pieces[i]))      # stable: ids in order within a length


def _join_pairs(syms: list, heap: list, bigram, current) -> None:
    """The symbol-merge loop llama.cpp's SPM and BPE sessions share: each symbol is [start, length, prev, next];
    every adjacent pair is offered (bigram), then the best pair on the heap is joined while `current(left,
    right, what the pair was when offered)` says it is not stale, and its new neighbours are offered."""
    for i in range(1, len(syms)):
        bigram(i - 1, i)
    while heap:
        _, left, right, offered = heapq.heappop(heap)
        ls, rs = syms[left], syms[right]
        if ls[1] == 0 or rs[1] == 0 or not current(ls, rs, offered):
            continue
        ls[1] += rs[1]
        rs[1] = 0
        ls[3] = rs[3]
        if rs[3] >= 0:
            syms[rs[3]][2] = left
        bigram(ls[2], left)
        bigram(left, ls[3])


def vocab_from_fields(get, path: str = "model") -> Vocab:
    """A Vocab from metadata: `get(key, default)` reads a GGUF key. UsageError for a vocabulary graphdiag
    cannot tokenize with (no tokens, another model, an unknown pre-tokenizer, no merges)."""
    model, tokens = get("tokenizer.ggml.model", None), get("tokenizer.ggml.tokens", None)
    if not tokens:
        raise UsageError(f"{path}: the file has no vocabulary (tokenizer.ggml.tokens): give --prompt-ids")
    if model not in ("llama", "gpt2"):
        raise UsageError(f"{path}: tokenizer {model!r} is not supported for --prompt (supported: llama (SPM), "
                         f"gpt2 (byte-level BPE)): give --prompt-ids")
    pieces = [(t if isinstance(t, bytes) else t.encode("utf-8")) or f"[EMPTY_{i}]".encode()
              for i, t in enumerate(tokens)]                # an empty piece: llama.cpp's name for it
    n = len(pieces)
    scores = [float(x) for x in get("tokenizer.ggml.scores", None) or [0.0] * n]
    types = [int(x) for x in get("tokenizer.ggml.token_type", None) or [NORMAL] * n]
    spm = model == "llama"
    pre = get("tokenizer.ggml.pre", None) or "default"
    ranks = {}
    add_bos_default, ignore_merges = spm, False
    if not spm:
        if pre not in PRE_TOKENIZERS:
            kinds = ", ".join(sorted({p.split for p in PRE_TOKENIZERS.values()}))
            raise UsageError(f"{path}: pre-tokenizer {pre!r} is not supported for --prompt (supported: {kinds} "
                             f"and the names llama.cpp maps onto them): give --prompt-ids")
        add_bos_default, ignore_merges = PRE_TOKENIZERS[pre].add_bos, PRE_TOKENIZERS[pre].ignore_merges
        merges = get("tokenizer.ggml.merges", None)
        if merges is None:                      # llama.cpp refuses the file; an empty list loads
            raise UsageError(f"{path}: a BPE vocabulary without tokenizer.ggml.merges")
        for i, m in enumerate(merges):
            cut = m.find(" ", 1)                # as llama.cpp: the first space after the first character
            a, b = (m[:cut], m[cut + 1:]) if cut > 0 else ("", "")
            ranks.setdefault((a.encode("utf-8"), b.encode("utf-8")), i)
    bos, eos = (1, 2) if spm else (11, 11)          # llama.cpp's defaults before the metadata's
    bos = _id(get("tokenizer.ggml.bos_token_id", None), bos, n)
    eos = _id(get("tokenizer.ggml.eos_token_id", None), eos, n)
    add_bos = get("tokenizer.ggml.add_bos_token", None)
    add_eos = get("tokenizer.ggml.add_eos_token", None)
    prefix = get("tokenizer.ggml.add_space_prefix", None)
    return Vocab(model, pre, pieces, scores, types, bos, eos, add_bos_default if add_bos is None else bool(add_bos),
                 False if add_eos is None else bool(add_eos), spm and (True if prefix is None else bool(prefix)),
                 ranks, ignore_merges=ignore_merges)


def _id(value, default: int, n: int) -> int | None:
    """A special token id: the metadata's where it is in range, else the default where that is."""
    if value is not None and 0 <= int(value) < n:
        return int(value)
    return default if default < n else None


@lru_cache(maxsize=4)
def file_vocab(path_str: str, version=None) -> Vocab:
    """The vocabulary of the GGUF file at `path_str` (read once per file version)."""
    from .gguf_io import _value, read_gguf
    r = read_gguf(Path(path_str))

    def get(key: str, default):
        f = r.fields.get(key) if key == "tokenizer.ggml.tokens" else None
        if f is not None:           # the pieces as bytes: llama.cpp takes them so, valid UTF-8 or not
            return [bytes(f.parts[i]) for i in f.data]
        return _value(r, key, default)
    return vocab_from_fields(get, Path(path_str).name)


def tokenize(v: Vocab, text: str) -> list[int]:
    """llama_tokenize(text, add_special=true, parse_special=true) over `v`."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"--prompt {text!r} is not valid UTF-8 text") from None
    out: list[int] = []
    if v.add_bos:
        _need(v.bos, "BOS", v)
        out.append(v.bos)
    prev_special = True
    for frag in partition(v, raw):
        if isinstance(frag, int):
            out.append(frag)
            prev_special = True
            continue
        if v.model == "llama":
            if v.add_space_prefix and prev_special:
                frag = b" " + frag
            out += spm(v, frag.replace(b" ", SPACE.encode("utf-8")))
        else:
            out += bpe(v, frag.decode("utf-8"))
        prev_special = False
    if v.add_eos:
        _need(v.eos, "EOS", v)
        out.append(v.eos)
    return out


def _need(token, what: str, v: Vocab) -> None:
    if token is None:
        raise UsageError(f"the vocabulary adds a {what} token but has none in range")


def partition(v: Vocab, raw: bytes) -> list[bytes | int]:
    """The text cut at every special token's text (longest tokens first), as tokenizer_st_partition does:
    byte strings for the text between, ids for the tokens."""
    frags: list[bytes | int] = [raw] if raw else []
    for tid in v.special:
        piece = v.pieces[tid]
        nxt: list[bytes | int] = []
        for f in frags:
            if isinstance(f, int) or piece not in f:
                nxt.append(f)
                continue
            parts = f.split(piece)
            for k, p in enumerate(parts):
                if p:
                    nxt.append(p)
                if k < len(parts) - 1:
                    nxt.append(tid)
        frags = nxt
    return frags


def spm(v: Vocab, text: bytes) -> list[int]:
    """llama.cpp's SPM session over escaped text: bigram merges by score, then resegment."""
    syms = []                                       # [start, length, prev, next] over UTF-8 characters
    off = 0
    while off < len(text):
        n = min(_utf8_len(text[off]), len(text) - off)
        syms.append([off, n, len(syms) - 1, -1 if off + n == len(text) else len(syms) + 1])
        off += n
    heap: list = []
    rev: dict[bytes, tuple[int, int]] = {}

    def bigram(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        s = text[syms[left][0]:syms[left][0] + syms[left][1] + syms[right][1]]
        tid = v.ids.get(s)
        if tid is None:
            return
        heapq.heappush(heap, (-v.scores[tid], left, right, len(s)))    # highest score, then leftmost
        rev[s] = (left, right)

    _join_pairs(syms, heap, bigram, lambda ls, rs, size: ls[1] + rs[1] == size)
    out: list[int] = []
    i = 0 if syms else -1
    while i != -1:
        _resegment(v, text, syms, rev, syms[i][0], syms[i][1], out)
        i = syms[i][3]
    return out


def _resegment(v: Vocab, text: bytes, syms, rev, start: int, n: int, out: list[int]) -> None:
    s = text[start:start + n]
    tid = v.ids.get(s)
    if tid is not None:
        out.append(tid)
        return
    pair = rev.get(s)
    if pair is None:
        out.extend(_byte_token(v, b) for b in s)
        return
    for k in pair:
        _resegment(v, text, syms, rev, syms[k][0], syms[k][1], out)


def _byte_token(v: Vocab, b: int) -> int:
    """<0xNN>, else the byte itself as a piece (llama_vocab::byte_to_token for SPM)."""
    tid = v.ids.get(f"<0x{b:02X}>".encode())
    if tid is None:
        tid = v.ids.get(bytes([b]))
    if tid is None:
        raise UsageError(f"the vocabulary has no token for byte 0x{b:02X} (no <0x{b:02X}> piece)")
    return tid


def _utf8_len(lead: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


def bpe(v: Vocab, text: str) -> list[int]:
    """llama.cpp's BPE session: pre-tokenized words, each merged by rank; unknown pieces as byte tokens."""
    out: list[int] = []
    for word in split_words(text, v.pre):
        raw = word.encode("utf-8")
        for piece in [raw] if v.ignore_merges and raw in v.ids else _merge(v, raw):
            tid = v.ids.get(piece)
            if tid is not None:
                out.append(tid)
                continue
            for b in piece:                     # each byte's own piece, where the vocabulary has it
                t = v.ids.get(bytes([b]))
                if t is not None:
                    out.append(t)
    return out


def _merge(v: Vocab, word: bytes) -> list[bytes]:
    """The word's pieces after merging adjacent pairs, the lowest-ranked first (ties: the leftmost)."""
    syms, off = [], 0                               # [start, length, prev, next]
    while off < len(word):
        n = min(_utf8_len(word[off]), len(word) - off)
        syms.append([off, n, len(syms) - 1, -1 if off + n == len(word) else len(syms) + 1])
        off += n
    heap: list = []

    def bigram(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        a = word[syms[left][0]:syms[left][0] + syms[left][1]]
        b = word[syms[right][0]:syms[right][0] + syms[right][1]]
        rank = v.ranks.get((a, b))
        if rank is not None:
            heapq.heappush(heap, (rank, left, right, a + b))

    _join_pairs(syms, heap, bigram,
           lambda ls, rs, joined: word[ls[0]:ls[0] + ls[1]] + word[rs[0]:rs[0] + rs[1]] == joined)
    return [word[s[0]:s[0] + s[1]] for s in syms if s[1] > 0]

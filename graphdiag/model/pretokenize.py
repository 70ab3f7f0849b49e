"""Byte-level BPE pre-tokenization as llama.cpp 0c1e57098 splits text (src/unicode.cpp): the words BPE merges
run inside, for the pre-tokenizers graphdiag knows ("default", "gpt2", "qwen2"), then each word's UTF-8 bytes
written in GPT-2's byte alphabet.

Hand-written rather than a regex library: llama.cpp does not run these patterns through a regex engine — it has
its own splitters (one per pattern) over its own Unicode category table, and a "collapsed" std::regex path for
the rest, and a regex engine differs from them at the edges (what `\\s` is, a lone space before a newline,
codepoints outside the category table). This module follows those splitters step by step. Categories come
from Python's `unicodedata` (llama.cpp ships its own table of the same Unicode data: codepoints assigned in a
newer Unicode version than this Python's may be classed differently).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

# llama.cpp's unicode_cpt_flags categories (the bits its splitters test)
UNDEFINED, NUMBER, LETTER, SEPARATOR, ACCENT_MARK, PUNCTUATION, SYMBOL, CONTROL = (1, 2, 4, 8, 16, 32, 64, 128)
WHITESPACE = 256
_CATEGORY = {"N": NUMBER, "L": LETTER, "Z": SEPARATOR, "M": ACCENT_MARK, "P": PUNCTUATION, "S": SYMBOL,
             "C": CONTROL}
# llama.cpp's unicode_set_whitespace (narrower than str.isspace: no U+001C..U+001F)
_WHITESPACE = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028,
                         0x2029, 0x202F, 0x205F, 0x3000])
OUT = 0          # the flags of a position outside the word (llama.cpp: unicode_cpt_flags{}, all bits clear)


@lru_cache(maxsize=65536)
def flags(ch: str) -> int:
    """llama.cpp's category bits of one codepoint (Cn, unassigned: UNDEFINED), plus WHITESPACE."""
    cat = unicodedata.category(ch)
    f = UNDEFINED if cat == "Cn" else _CATEGORY[cat[0]]
    return f | (WHITESPACE if ord(ch) in _WHITESPACE else 0)


class _Word:
    """One offset range of the text being split: codepoint access with llama.cpp's out-of-range rules."""

    def __init__(self, text: str, lo: int, hi: int, out: list[int]):
        self.t, self.lo, self.hi, self.out, self.prev = text, lo, hi, out, lo

    def cpt(self, pos: int) -> str:
        return self.t[pos] if self.lo <= pos < self.hi else ""

    def fl(self, pos: int) -> int:
        return flags(self.t[pos]) if self.lo <= pos < self.hi else OUT

    def add(self, end: int) -> int:
        n = end - self.prev
        if n > 0:
            self.out.append(n)
        self.prev = end
        return n

    def contraction(self, pos: int, fold) -> int:
        """'s 't 'm 'd (2) or 're 've 'll (3) at pos, compared through `fold`; 0 if none."""
        if self.cpt(pos) != "'" or pos + 1 >= self.hi:
            return 0
        a = fold(self.cpt(pos + 1))
        if a in ("s", "t", "m", "d"):
            return 2
        if pos + 2 < self.hi and a + fold(self.cpt(pos + 2)) in ("re", "ve", "ll"):
            return 3
        return 0

    def spaces(self, pos: int) -> tuple[int, int]:
        """(number of whitespace codepoints from pos, end of the last \\r or \\n among them, 0 if none)."""
        n, last_rn = 0, 0
        while self.fl(pos + n) & WHITESPACE:
            if self.cpt(pos + n) in ("\r", "\n"):
                last_rn = pos + n + 1
            n += 1
        return n, last_rn


def _other(f: int) -> bool:
    """[^\\s\\p{L}\\p{N}] of a position inside the word (outside: false)."""
    return not (f & (WHITESPACE | LETTER | NUMBER)) and f != OUT


def _split_gpt2(w: _Word) -> None:
    """'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    pos = w.lo
    while pos < w.hi:
        c = w.cpt(pos)
        n = w.contraction(pos, lambda x: x)
        if n:
            pos += w.add(pos + n)
            continue
        f2 = w.fl(pos + 1) if c == " " else w.fl(pos)
        for test in (lambda f: f & LETTER, lambda f: f & NUMBER, _other):
            if test(f2):
                pos += c == " "
                while test(f2):
                    pos += 1
                    f2 = w.fl(pos)
                w.add(pos)
                break
        else:
            pos = _whitespace(w, pos, w.spaces(pos)[0])


def _whitespace(w: _Word, pos: int, n: int) -> int:
    """\\s+(?!\\S) then \\s+, then one codepoint that matched nothing; returns the new position."""
    if n > 1 and w.cpt(pos + n) != "":
        pos += n - 1
    elif n > 0:
        pos += n
    else:
        pos += 1
    w.add(pos)
    return pos


def _split_qwen2(w: _Word) -> None:
    """(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|
    \\s+(?!\\S)|\\s+ (llama.cpp's unicode_regex_split_custom_qwen2)"""
    pos = w.lo
    while pos < w.hi:
        c, f = w.cpt(pos), w.fl(pos)
        n = w.contraction(pos, str.lower)
        if n:
            pos += w.add(pos + n)
            continue
        if c not in ("\r", "\n") and not f & NUMBER and (f & LETTER or w.fl(pos + 1) & LETTER):
            pos += 1
            while w.fl(pos) & LETTER:
                pos += 1
            w.add(pos)
            continue
        if f & NUMBER:
            pos += 1
            w.add(pos)
            continue
        f2 = w.fl(pos + 1) if c == " " else f
        if not (f2 & (WHITESPACE | LETTER | NUMBER)) and f != OUT:   # upstream tests the first flags here
            pos += c == " "
            while _other(f2):
                pos += 1
                f2 = w.fl(pos)
            while w.cpt(pos) in ("\r", "\n"):
                pos += 1
            w.add(pos)
            continue
        n, last_rn = w.spaces(pos)
        if last_rn:
            pos = last_rn
            w.add(pos)
            continue
        pos = _whitespace(w, pos, n)


def _custom(splitter):
    def split(text: str, offsets: list[int]) -> list[int]:
        out, start = [], 0
        for n in offsets:
            splitter(_Word(text, start, start + n, out))
            start += n
        return out
    return split


# llama.cpp's collapsed-text std::regex path: each non-ASCII codepoint stands as one character for its
# category (whitespace as \v); the patterns below are the collapsed forms of upstream's default pre-tokenizer
_COLLAPSED = {NUMBER: "\xd1", LETTER: "\xd2", PUNCTUATION: "\xd3", ACCENT_MARK: "\xd4", SYMBOL: "\xd5"}
_P_ASCII = r"!-#%-*,-/:-;?-@\[-\]_\{\}"


def _collapse(text: str) -> str:
    def one(ch: str) -> str:
        if ord(ch) < 128:
            return ch
        f = flags(ch)
        if f & WHITESPACE:
            return "\v"
        return _COLLAPSED.get(f & ~WHITESPACE, "\xd0")
    return "".join(one(ch) for ch in text)


def _stl(pattern: str, collapsed: bool):
    rx = re.compile(pattern)

    def split(text: str, offsets: list[int]) -> list[int]:
        t = _collapse(text) if collapsed else "".join("\v" if ord(c) > 0x7F and flags(c) & WHITESPACE else c
                                                      for c in text)
        out, start = [], 0
        for n in offsets:       # matches and the gaps between them are words (unicode_regex_split_stl)
            at = 0
            for m in rx.finditer(t, start, start + n):
                if m.start() - start > at:
                    out.append(m.start() - start - at)
                out.append(m.end() - m.start())
                at = m.end() - start
            if at < n:
                out.append(n - at)
            start += n
        return out
    return split


_GPT2 = _custom(_split_gpt2)
PRE_SPLITTERS = {
    # "default": upstream's four patterns, applied one after the other to the previous words
    "default": (_stl(f"[\xd3{_P_ASCII}\\$\\+<=>\\^~\\|]+", True), _GPT2, _stl("[\xd10-9]+", True),
                _stl("[0-9][0-9][0-9]", False)),
    "gpt2": (_GPT2,),
    "qwen2": (_custom(_split_qwen2),),
}
# GGUF tokenizer.ggml.pre names llama.cpp maps onto these splitters (llama-vocab.cpp's load)
PRE_NAMES = {"default": "default", "gpt2": "gpt2", "gpt-2": "gpt2", "phi-2": "gpt2", "mpt": "gpt2",
             "olmo": "gpt2", "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2", "stablelm2": "qwen2"}


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> character map (llama.cpp's unicode_byte_to_utf8_map)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


BYTE_CHARS = _byte_alphabet()


def split_words(text: str, pre: str) -> list[str]:
    """The words of `text` (byte-encoded in GPT-2's alphabet) as llama.cpp's pre-tokenizer `pre` splits it."""
    offsets = [len(text)]
    for split in PRE_SPLITTERS[PRE_NAMES[pre]]:
        offsets = split(text, offsets)
    words, start = [], 0
    for n in offsets:
        words.append("".join(BYTE_CHARS[b] for b in text[start:start + n].encode("utf-8")))
        start += n
    return words

"""llama.cpp 0c1e57098's hand-written splitters (src/unicode.cpp, unicode_regex_split_custom_*): the patterns it
does not run through a regex engine, followed step by step, over the category bits of model/unicode_flags.py.

Each splitter takes the text and the word lengths so far (in codepoints) and returns the new word lengths: it
splits inside each word, never across two.
"""

from __future__ import annotations

from .unicode_flags import LETTER, NUMBER, OUT, WHITESPACE, flags


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


def _ascii_lower(ch: str) -> str:
    """unicode_tolower as far as the contractions look: no codepoint outside ASCII lowers to s t m d r e v l."""
    return ch.lower() if ch.isascii() else ch


def split_gpt2(w: _Word) -> None:
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


def split_llama3(w: _Word, digits: int) -> None:
    """(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,digits}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|
    \\s*[\\r\\n]+|\\s+(?!\\S)|\\s+ (llama.cpp's custom llama3 splitter with digits 3, its qwen2 one with 1)"""
    pos = w.lo
    while pos < w.hi:
        c, f = w.cpt(pos), w.fl(pos)
        n = w.contraction(pos, _ascii_lower)
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
            start = pos
            while w.fl(pos) & NUMBER:
                pos += 1
                if pos - start >= digits:
                    w.add(pos)
                    start = pos
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


def custom(splitter, *args):
    """A splitter over word lengths from a function over one _Word (extra arguments passed on)."""
    def split(text: str, offsets: list[int]) -> list[int]:
        out, start = [], 0
        for n in offsets:
            splitter(_Word(text, start, start + n, out), *args)
            start += n
        return out
    return split

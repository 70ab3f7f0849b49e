"""The patterns llama.cpp 0c1e57098 runs through std::regex (src/unicode.cpp, unicode_regex_split and
unicode_regex_split_stl), run through Python's `re` on the same text llama.cpp's engine sees.

A pattern with a Unicode category (\\p{N}, \\p{L}, \\p{P}, \\p{M}, \\p{S}; \\p{Lu} and the other letter kinds
count as \\p{L}) runs on "collapsed" text: every codepoint outside ASCII stands as one character for its
category (0xD1 number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 anything else, \\v for
whitespace), and each category in the pattern becomes a class of that character plus its ASCII members. A
pattern without one runs on the codepoints themselves, whitespace outside ASCII written as \\v. Either way
std::regex's \\s is ASCII whitespace (the "C" locale) and `$` is the end of the word (no multiline): `re.ASCII`
and `\\Z` here. The matches and the gaps between them are the new words.
"""

from __future__ import annotations

import re

from .unicode_flags import ACCENT_MARK, CATEGORIES, LETTER, NUMBER, PUNCTUATION, SYMBOL, WHITESPACE, flags

_STAND_IN = {NUMBER: "\xd1", LETTER: "\xd2", PUNCTUATION: "\xd3", ACCENT_MARK: "\xd4", SYMBOL: "\xd5"}
# the ASCII members llama.cpp gives each category in a collapsed pattern ($+<=>^`|~ are symbols, not punctuation)
_ASCII = {NUMBER: "0-9", LETTER: "A-Za-z", PUNCTUATION: r"!-#%-*,-/:-;?-@\[-\]_\{\}", ACCENT_MARK: "",
          SYMBOL: r"\$\+<->\^`\|~"}
_PROPERTY = {"N": NUMBER, "L": LETTER, "P": PUNCTUATION, "M": ACCENT_MARK, "S": SYMBOL,
             "Lu": LETTER, "Ll": LETTER, "Lt": LETTER, "Lm": LETTER, "Lo": LETTER}
_CATEGORY_RE = re.compile(r"\\p\{(N|L|P|M|S|Lu|Ll|Lt|Lm|Lo)\}")


def _translate(pattern: str) -> tuple[str, bool]:
    """(the pattern as Python's re reads it, whether it runs on collapsed text)."""
    collapsed = bool(_CATEGORY_RE.search(pattern))
    out, inside, i = [], False, 0
    while i < len(pattern):
        m = _CATEGORY_RE.match(pattern, i)
        if m and collapsed:
            cat = _PROPERTY[m.group(1)]
            body = _STAND_IN[cat] + _ASCII[cat]
            out.append(body if inside else f"[{body}]")
            i = m.end()
            continue
        c = pattern[i]
        if c == "\\":                      # an escape stays whole
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[":
            inside = True
        elif c == "]" and inside:
            inside = False
        out.append("\\Z" if c == "$" and not inside else c)
        i += 1
    return "".join(out), collapsed


def _collapse(text: str) -> str:
    def one(ch: str) -> str:
        if ord(ch) < 128:
            return ch
        f = flags(ch)
        if f & WHITESPACE:
            return "\v"
        return _STAND_IN.get(f & CATEGORIES, "\xd0")
    return "".join(one(ch) for ch in text)


def _wide(text: str) -> str:
    return "".join("\v" if ord(c) > 0x7F and flags(c) & WHITESPACE else c for c in text)


def regex(pattern: str):
    """A splitter over word lengths for one of llama.cpp's std::regex patterns (written as upstream writes it)."""
    translated, collapsed = _translate(pattern)
    rx = re.compile(translated, re.ASCII)
    seen = _collapse if collapsed else _wide

    def split(text: str, offsets: list[int]) -> list[int]:
        t = seen(text)
        out, start = [], 0
        for n in offsets:
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

"""The Unicode category bits llama.cpp 0c1e57098's pre-tokenizers test (src/unicode.h's unicode_cpt_flags), per
codepoint.

llama.cpp ships its own table of Unicode 15.1 data; this module takes Python's `unicodedata` and fills in the
codepoints a Python with older Unicode data (3.11: 14.0) leaves unassigned, so both class every codepoint alike.
A Python whose data is newer than 15.1 classes the codepoints assigned since then, which llama.cpp leaves
UNDEFINED: those are the one known difference.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

UNDEFINED, NUMBER, LETTER, SEPARATOR, ACCENT_MARK, PUNCTUATION, SYMBOL, CONTROL = (1, 2, 4, 8, 16, 32, 64, 128)
WHITESPACE = 256
CATEGORIES = UNDEFINED | NUMBER | LETTER | SEPARATOR | ACCENT_MARK | PUNCTUATION | SYMBOL | CONTROL
OUT = 0          # the flags of a position outside the word (llama.cpp: unicode_cpt_flags{}, all bits clear)
_CATEGORY = {"N": NUMBER, "L": LETTER, "Z": SEPARATOR, "M": ACCENT_MARK, "P": PUNCTUATION, "S": SYMBOL,
             "C": CONTROL}
# llama.cpp's unicode_set_whitespace (narrower than str.isspace: no U+001C..U+001F)
_WHITESPACE = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028,
                         0x2029, 0x202F, 0x205F, 0x3000])
# Codepoints assigned in Unicode 15.0 and 15.1 (first, last, category), for a Python whose unicodedata is older
_NEWER = (
    (0x0CF3, 0x0CF3, ACCENT_MARK), (0x0ECE, 0x0ECE, ACCENT_MARK), (0x2FFC, 0x2FFF, SYMBOL), (0x31EF, 0x31EF, SYMBOL),
    (0x10EFD, 0x10EFF, ACCENT_MARK), (0x1123F, 0x11240, LETTER), (0x11241, 0x11241, ACCENT_MARK),
    (0x11B00, 0x11B09, PUNCTUATION), (0x11F00, 0x11F01, ACCENT_MARK), (0x11F02, 0x11F02, LETTER),
    (0x11F03, 0x11F03, ACCENT_MARK), (0x11F04, 0x11F10, LETTER), (0x11F12, 0x11F33, LETTER),
    (0x11F34, 0x11F3A, ACCENT_MARK), (0x11F3E, 0x11F42, ACCENT_MARK), (0x11F43, 0x11F4F, PUNCTUATION),
    (0x11F50, 0x11F59, NUMBER), (0x1342F, 0x1342F, LETTER), (0x13439, 0x1343F, CONTROL),
    (0x13440, 0x13440, ACCENT_MARK), (0x13441, 0x13446, LETTER), (0x13447, 0x13455, ACCENT_MARK),
    (0x1B132, 0x1B132, LETTER), (0x1B155, 0x1B155, LETTER), (0x1D2C0, 0x1D2D3, NUMBER), (0x1DF25, 0x1DF2A, LETTER),
    (0x1E030, 0x1E06D, LETTER), (0x1E08F, 0x1E08F, ACCENT_MARK), (0x1E4D0, 0x1E4EB, LETTER),
    (0x1E4EC, 0x1E4EF, ACCENT_MARK), (0x1E4F0, 0x1E4F9, NUMBER), (0x1F6DC, 0x1F6DC, SYMBOL),
    (0x1F774, 0x1F776, SYMBOL), (0x1F77B, 0x1F77F, SYMBOL), (0x1F7D9, 0x1F7D9, SYMBOL), (0x1FA75, 0x1FA77, SYMBOL),
    (0x1FA87, 0x1FA88, SYMBOL), (0x1FAAD, 0x1FAAF, SYMBOL), (0x1FABB, 0x1FABD, SYMBOL), (0x1FABF, 0x1FABF, SYMBOL),
    (0x1FACE, 0x1FACF, SYMBOL), (0x1FADA, 0x1FADB, SYMBOL), (0x1FAE8, 0x1FAE8, SYMBOL), (0x1FAF7, 0x1FAF8, SYMBOL),
    (0x2B739, 0x2B739, LETTER), (0x2EBF0, 0x2EE5D, LETTER), (0x31350, 0x323AF, LETTER),
)


@lru_cache(maxsize=65536)
def flags(ch: str) -> int:
    """llama.cpp's category bit of one codepoint (unassigned: UNDEFINED), plus WHITESPACE."""
    cat = unicodedata.category(ch)
    if cat == "Cn":
        cp = ord(ch)
        f = next((c for lo, hi, c in _NEWER if lo <= cp <= hi), UNDEFINED)
    else:
        f = _CATEGORY[cat[0]]
    return f | (WHITESPACE if ord(ch) in _WHITESPACE else 0)

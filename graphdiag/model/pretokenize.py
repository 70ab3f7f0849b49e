"""Byte-level BPE pre-tokenization as llama.cpp 0c1e57098 does it (src/llama-vocab.cpp's llm_tokenizer_bpe,
src/unicode.cpp's unicode_regex_split): the words BPE merges run inside, then each word's UTF-8 bytes written in
GPT-2's byte alphabet.

A pre-tokenizer is a list of patterns applied one after the other, each splitting the previous words further.
llama.cpp runs a few patterns with hand-written splitters (model/split_custom.py: GPT-2's, llama3's, qwen2's)
and the rest through std::regex (model/split_regex.py), over its own Unicode category table
(model/unicode_flags.py): a textbook regex engine differs from both at the edges (what \\s is, a lone space
before a newline, non-ASCII letters in the gpt-4o and tekken patterns, digits outside ASCII).

`PRE_TOKENIZERS` maps every tokenizer.ggml.pre name llama.cpp maps onto a supported kind to that kind, with the
flags llama.cpp's loader sets with it: ignore_merges (a word that is a token is taken whole) and add_bos (the
default where the file has no tokenizer.ggml.add_bos_token).
"""

from __future__ import annotations

from dataclasses import dataclass

from .split_custom import custom, split_gpt2, split_llama3
from .split_regex import regex

_GPT2 = custom(split_gpt2)
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# gpt-4o's and tekken's upper/lower-case letter runs as llama.cpp adapts them for std::regex: a letter that is
# not a-z (an upper-case run) and one that is not A-Z (a lower-case run); a letter outside ASCII is both
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
# deepseek-llm's letters and CJK ranges as upstream lists them (escaped: several are look-alikes of others)
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943")
_DEEPSEEK_PUNCT = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

SPLITS = {
    "default": (regex(r"[\p{P}\$\+<=>\^~\|]+"), _GPT2, regex(r"\p{N}+"), regex("[0-9][0-9][0-9]")),
    "gpt2": (_GPT2,),
    "llama3": (custom(split_llama3, 3),),
    "qwen2": (custom(split_llama3, 1),),
    "starcoder": (regex(r"\p{N}"), _GPT2),
    "falcon": (regex(r"[\p{P}\$\+<=>\^~\|`]+"), _GPT2, regex("[0-9][0-9][0-9]")),
    "deepseek-llm": (regex("[\r\n]"), regex(rf"\s?[{_DEEPSEEK_LETTERS}]+"), regex(rf"\s?[{_DEEPSEEK_PUNCT}]+"),
                     regex(r"\s+$"), regex(_CJK), regex(r"\p{N}+")),
    "deepseek-coder": (regex("[\r\n]"), regex(r"\s?\p{L}+"), regex(r"\s?\p{P}+"), regex(_CJK), regex(r"\p{N}")),
    "gpt-4o": (regex(rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|"
                     rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?|"
                     r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),),
    "tekken": (regex(rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|"
                     r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),),
}


@dataclass(frozen=True)
class PreTokenizer:
    """One tokenizer.ggml.pre name as llama.cpp loads it."""

    split: str                  # the key of its patterns in SPLITS
    ignore_merges: bool = False
    add_bos: bool = False


def _names(split: str, names: str, **flags) -> dict[str, PreTokenizer]:
    return {n: PreTokenizer(split, **flags) for n in names.split()}


# llama-vocab.cpp's load: the names whose whole behaviour graphdiag reproduces (jina's and roberta's, which
# also set token attributes or a separator, and chatglm's, which drops BOS, are left out)
PRE_TOKENIZERS = {
    **_names("default", "default"),
    **_names("gpt2", "gpt2 gpt-2 phi-2 gigachat a.x-4.0 mellum modern-bert mpt olmo jais trillion "
                     "granite-docling exaone4"),
    **_names("llama3", "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
             ignore_merges=True, add_bos=True),
    **_names("llama3", "dbrx smaug-bpe"),
    **_names("qwen2", "qwen2 deepseek-r1-qwen kormo f2llmv2 stablelm2 hunyuan solar-open megrez"),
    **_names("starcoder", "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2"),
    **_names("falcon", "falcon"),
    **_names("deepseek-llm", "deepseek-llm"),
    **_names("deepseek-coder", "deepseek-coder"),
    **_names("gpt-4o", "gpt-4o llama4 kanana2 talkie minimax-m2"),
    **_names("tekken", "tekken", ignore_merges=True, add_bos=True),
}


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> character map (llama.cpp's unicode_byte_to_utf8_map)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


BYTE_CHARS = _byte_alphabet()


def split_words(text: str, pre: str) -> list[str]:
    """The words of `text` (byte-encoded in GPT-2's alphabet) as llama.cpp's pre-tokenizer `pre` splits it."""
    offsets = [len(text)]
    for split in SPLITS[PRE_TOKENIZERS[pre].split]:
        offsets = split(text, offsets)
    words, start = [], 0
    for n in offsets:
        words.append("".join(BYTE_CHARS[b] for b in text[start:start + n].encode("utf-8")))
        start += n
    return words

"""Text prompts tokenized as llama.cpp's llama_tokenize (add_special, parse_special): small SPM and BPE
vocabularies whose tokenizations follow by hand from upstream's rules (model/tokenize.py)."""

import pytest

from graphdiag.errors import UsageError
from graphdiag.model.pretokenize import BYTE_CHARS, split_words
from graphdiag.model.tokenize import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, tokenize, vocab_from_fields

BYTES0 = 3          # the SPM test vocabulary: <unk> <s> </s>, then <0x00>..<0xFF> at 3..258


def spm_vocab(pieces: dict[str, float], extra=None, **meta):
    """<unk> <s> </s>, the 256 byte tokens, then `pieces` (text -> score) as NORMAL tokens."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * len(pieces)]
    for text, t in (extra or {}).items():
        tokens.append(text)
        types.append(t)
    scores = [0.0] * (3 + 256) + list(pieces.values()) + [0.0] * len(extra or {})
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
          "tokenizer.ggml.token_type": types, **meta}
    return vocab_from_fields(lambda k, d: md.get(k, d)), tokens


def ids_of(tokens, *texts):
    return [tokens.index(t) for t in texts]


def test_spm_merges_the_highest_scoring_pair_first():
    v, toks = spm_vocab({"ab": -1.0, "bc": -0.5, "\u2581": -2.0, "\u2581a": -3.0})
    # "▁abc": pairs ▁a (-3), ab (-1), bc (-0.5): bc merges first, then ▁a; ▁a + bc is no piece
    assert tokenize(v, "abc") == [1, *ids_of(toks, "\u2581a", "bc")]
    v, toks = spm_vocab({"ab": -0.5, "bc": -1.0, "\u2581": -2.0, "\u2581a": -3.0})
    assert tokenize(v, "abc") == [1, *ids_of(toks, "\u2581", "ab"), BYTES0 + ord("c")]


def test_spm_ties_go_to_the_leftmost_pair_and_space_prefix_follows_the_metadata():
    v, toks = spm_vocab({"aa": -1.0})
    no_prefix = {"tokenizer.ggml.add_space_prefix": False}
    v, toks = spm_vocab({"aa": -1.0}, **no_prefix)
    assert tokenize(v, "aaa") == [1, toks.index("aa"), BYTES0 + ord("a")]
    v, toks = spm_vocab({"aa": -1.0, "\u2581a": -0.5})
    # default add_space_prefix: "▁aaa" -> ▁a (-0.5) first, then aa
    assert tokenize(v, "aaa") == [1, *ids_of(toks, "\u2581a", "aa")]


def test_spm_byte_fallback_writes_each_utf8_byte():
    v, toks = spm_vocab({"\u2581": -1.0}, **{"tokenizer.ggml.add_space_prefix": False})
    assert tokenize(v, "é") == [1, BYTES0 + 0xC3, BYTES0 + 0xA9]
    assert tokenize(v, "a b") == [1, BYTES0 + ord("a"), toks.index("\u2581"), BYTES0 + ord("b")]


def test_bos_eos_follow_the_metadata():
    v, toks = spm_vocab({}, **{"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True,
                               "tokenizer.ggml.add_space_prefix": False})
    assert tokenize(v, "a") == [BYTES0 + ord("a"), 2]


def test_special_tokens_are_cut_out_first_and_a_space_prefix_follows_them():
    v, toks = spm_vocab({"\u2581a": -1.0, "\u2581": -2.0}, extra={"<turn>": CONTROL, "xx": USER_DEFINED})
    turn, xx = toks.index("<turn>"), toks.index("xx")
    # "a<turn>a xx a": fragments "a", <turn>, "a ", xx, " a"; after a special token the text gets a space
    # first: "▁a" | <turn> | "▁a▁" | xx | "▁▁a" (▁a merges, the first ▁ stays)
    got = tokenize(v, "a<turn>a xx a")
    sp, a = toks.index("\u2581"), toks.index("\u2581a")
    assert got == [1, a, turn, a, sp, xx, sp, a]
    assert tokenize(v, "</s>") == [1, 2]          # parse_special: a control token's text is the token


def bpe_vocab(words: list[str], merges: list[str], pre: str = "gpt2", **meta):
    """The 256 byte characters, then `words` (pieces in GPT-2's byte alphabet), then <|end|> (control)."""
    tokens = [*BYTE_CHARS, *words, "<|end|>"]
    types = [NORMAL] * (256 + len(words)) + [CONTROL]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges, **meta}
    return vocab_from_fields(lambda k, d: md.get(k, d)), tokens


def test_bpe_merges_by_rank_inside_each_word():
    v, toks = bpe_vocab(["th", "he", "the", "Ġt", "Ġthe"], ["t h", "h e", "th e", "Ġ t", "Ġ the"])
    # words "the", "Ġthe": t h (rank 0) then th e (2); in "Ġthe" t h (0) beats Ġ t (3), then th e, then Ġ the
    assert tokenize(v, "the the") == ids_of(toks, "the", "Ġthe")
    v, toks = bpe_vocab(["th", "he", "the", "Ġt", "Ġthe"], ["t h", "h e", "th e", "Ġ t", "Ġt he"])
    # no "Ġ the" merge: Ġt never forms (t h came first), and Ġ stays a piece of its own
    assert tokenize(v, "the the") == [*ids_of(toks, "the"), BYTE_CHARS.index("Ġ"), toks.index("the")]
    # with h e ranked first, "the" ends as t + he: th e never applies
    v, toks = bpe_vocab(["th", "he", "the"], ["h e", "t h", "th e"])
    assert tokenize(v, "the") == [BYTE_CHARS.index("t"), toks.index("he")]
    assert tokenize(v, "the<|end|>") == [BYTE_CHARS.index("t"), toks.index("he"), toks.index("<|end|>")]


def test_bpe_adds_bos_only_where_the_metadata_says():
    v, toks = bpe_vocab([], [], **{"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.add_bos_token": True})
    assert tokenize(v, "a") == [1, BYTE_CHARS.index("a")]
    v, toks = bpe_vocab([], [])
    assert tokenize(v, "é") == [BYTE_CHARS.index(c) for c in "Ã©"]


@pytest.mark.parametrize("pre, text, words", [
    ("gpt2", "Hello world's  123!!", ["Hello", "Ġworld", "'s", "Ġ", "Ġ123", "!!"]),
    ("gpt2", "x\n\n  y", ["x", "ĊĊĠ", "Ġy"]),
    ("qwen2", "don'T 12345", ["don", "'T", "Ġ", "1", "2", "3", "4", "5"]),          # case-insensitive 'T
    ("qwen2", "x\n\n  y", ["x", "ĊĊ", "Ġ", "Ġy"]),                                 # \s*[\r\n]+ first
    ("qwen2", "a...b", ["a", "...", "b"]),
    ("default", "world's 12345", ["world", "'", "s", "Ġ", "123", "45"]),          # punctuation, then 3 digits
    ("default", "b $5+6", ["b", "Ġ", "$", "5", "+", "6"]),
    ("gpt2", "héllo 日本", ["hÃ©llo", "ĠæĹ¥æľ¬"]),
])
def test_pre_tokenizers_split_as_llama_cpp(pre, text, words):
    assert split_words(text, pre) == words


def test_unsupported_vocabularies_are_refused_in_one_line():
    with pytest.raises(UsageError, match="pre-tokenizer 'viking' is not supported"):
        bpe_vocab([], ["a b"], pre="viking")
    with pytest.raises(UsageError, match="tokenizer 'bert' is not supported"):
        vocab_from_fields(lambda k, d: {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]}.get(k, d))
    with pytest.raises(UsageError, match="no vocabulary"):
        vocab_from_fields(lambda k, d: d)

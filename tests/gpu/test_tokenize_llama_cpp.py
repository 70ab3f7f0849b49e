"""graphdiag's tokenizer against real llama.cpp's llama_tokenize (llama-cpp-python 0.3.36 built on the GPU
machine: shared/notes/real-models.md; import it with the system libstdc++ preloaded). Skips without it.

Checks: the Gemma 3 ids in tests/data/tokenize/gemma3-270m.json; a seeded sweep of mixed strings (words,
digits, punctuation, runs of spaces/tabs/newlines, accents, CJK, emoji, special-token texts) on the Gemma 3
file and on an exported preset; and, where $GRAPHDIAG_BPE_GGUF names a Qwen2/Qwen3 GGUF, the same sweep
through byte-level BPE. Per pre-tokenizer (llama-bpe, smollm, deepseek-llm, qwen2, gpt-4o, tekken, ...): the
recorded ids of tests/data/tokenize/<name>.json are this llama.cpp's too, and a fresh sweep on each stored
vocabulary agrees; where $GRAPHDIAG_VOCAB_DIR names a folder of vocab GGUFs (llama.cpp's models/ggml-vocab-*.gguf
or whole model files), the fresh sweep runs on each BPE one graphdiag supports."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.errors import UsageError
from graphdiag.llama.driver import preload_libstdcxx
from graphdiag.model.tokenize import file_vocab, tokenize

pytestmark = pytest.mark.gpu
# the system libstdc++ first (graphdiag/llama/driver.py): without it llama-cpp-python's CUDA build binds
# libllama's iostream calls to libggml-cuda's private copy, and the vocab_only load of 10 of the 15 recorded
# vocabularies crashed the process (H100 2026-12-07: a segfault in llama_model_load_from_file, every xdist
# worker that imported this module at collection)
preload_libstdcxx()
llama_cpp = pytest.importorskip("llama_cpp")
DATA = Path(__file__).resolve().parents[1] / "data" / "tokenize" / "gemma3-270m.json"
SWEEPS = sorted(p.stem for p in DATA.parent.glob("*.json") if p.with_suffix(".gguf").exists())
ATOMS = ["Hello", " world", "the", " The", "CUDA", "graph", "'s", "'T", "don't", "123", "4567", " 89", "!", "...",
         "?!", " (x)", "**", "$5", "+", "=", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "é", "ß", "Ü",
         "日本語", "中文", "🙂", "👍🏽", "<start_of_turn>", "<end_of_turn>", "<bos>", "<|im_start|>", "</s>", "a", "z",
         "HELLOworld", "camelCase", "'RE", "we’re", "1234567", "٣٤٥", "²", "１２３", "<=>", "`", "~", "—", "。", "！",
         "\u00a0", "\u3000", "\x0b", "\x85", "\u2028", "\x1c", "\u200b", "e\u0301", "ǅ", "ʰ", "Привет", "العربية",
         "हिन्दी", "한국어", "カタカナ", "👨\u200d👩\u200d👧", "🇫🇷", "\U0001fae8", "<|endoftext|>", "<|eot_id|>",
         "<|begin_of_text|>", "[INST]", "<s>", "/", "\r"]


def _strings(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


class LlamaVocab:
    """A vocabulary loaded by llama.cpp itself (vocab_only)."""

    def __init__(self, path: Path):
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, f"llama.cpp could not load {path}"
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (llama_cpp.llama_token * (len(raw) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        if n < 0:       # more tokens than bytes (a space is U+2581, three byte-fallback tokens): -n is the need
            buf = (llama_cpp.llama_token * -n)()
            n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        assert n >= 0, n
        return list(buf[:n])

    def close(self) -> None:
        llama_cpp.llama_model_free(self.model)


def _compare(path: Path, texts) -> None:
    ours, real = file_vocab(str(path)), LlamaVocab(path)
    try:
        wrong = [(t, tokenize(ours, t), real.tokenize(t)) for t in texts]
        wrong = [w for w in wrong if w[1] != w[2]]
    finally:
        real.close()
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, e.g. {wrong[:3]}"


def test_gemma3_data_ids_are_llama_cpps(gemma3_file):
    cases = json.loads(DATA.read_text())["cases"]
    real = LlamaVocab(gemma3_file)
    try:
        got = {c["text"]: real.tokenize(c["text"]) for c in cases}
    finally:
        real.close()
    assert {c["text"]: c["ids"] for c in cases} == got


def test_gemma3_sweep_matches_llama_cpp(gemma3_file):
    _compare(gemma3_file, _strings(300))


def test_exported_preset_sweep_matches_llama_cpp(tmp_path):
    p = tmp_path / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    _compare(p, _strings(100))


def test_bpe_file_sweep_matches_llama_cpp():
    path = os.environ.get("GRAPHDIAG_BPE_GGUF")
    if not path:
        pytest.skip("GRAPHDIAG_BPE_GGUF names no Qwen2/Qwen3 GGUF")
    _compare(Path(path), _strings(300))


@pytest.mark.parametrize("name", SWEEPS)
def test_recorded_sweep_is_this_llama_cpps(name):
    cases = json.loads((DATA.parent / f"{name}.json").read_text())["cases"]
    real = LlamaVocab(DATA.parent / f"{name}.gguf")
    try:
        wrong = [(c["text"], c["ids"], real.tokenize(c["text"])) for c in cases]
    finally:
        real.close()
    wrong = [w for w in wrong if w[1] != w[2]]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ (text, recorded, llama.cpp): {wrong[:3]}"


@pytest.mark.parametrize("name", SWEEPS)
def test_fresh_sweep_matches_llama_cpp_on_stored_vocabulary(name):
    _compare(DATA.parent / f"{name}.gguf", _strings(300, seed=11))


def test_vocab_dir_sweep_matches_llama_cpp():
    folder = os.environ.get("GRAPHDIAG_VOCAB_DIR")
    if not folder:
        pytest.skip("GRAPHDIAG_VOCAB_DIR names no folder of vocab GGUFs")
    ran = []
    for path in sorted(Path(folder).glob("*.gguf")):
        try:
            v = file_vocab(str(path))
        except UsageError:          # SPM-only, WPM, or a pre-tokenizer graphdiag refuses
            continue
        if v.model == "gpt2":
            _compare(path, _strings(300))
            ran.append(path.name)
    assert ran, f"no byte-level BPE vocabulary graphdiag supports in {folder}"

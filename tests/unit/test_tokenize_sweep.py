"""graphdiag's tokenizer against ids recorded from llama.cpp 0c1e57098's llama_tokenize, one vocabulary per
pre-tokenizer (tests/data/tokenize/<name>.gguf and .json, written by tools/record_tokenize_sweep.py: a sweep of
special tokens, digits, CJK, emoji, whitespace runs, newlines, contractions and mixed scripts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.model.tokenize import file_vocab, tokenize
from support.cli import QUICK, one_line

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenize"
NAMES = sorted(p.stem for p in DATA.glob("*.json") if p.with_suffix(".gguf").exists())


def test_every_pre_tokenizer_the_issue_names_has_a_recorded_sweep():
    assert {"llama-bpe", "smollm", "deepseek-llm", "qwen2", "gpt-4o", "tekken"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_sweep_matches_llama_cpp(name):
    doc = json.loads((DATA / f"{name}.json").read_text())
    v = file_vocab(str(DATA / f"{name}.gguf"))
    wrong = [(c["text"], tokenize(v, c["text"]), c["ids"]) for c in doc["cases"]]
    wrong = [w for w in wrong if w[1] != w[2]]
    assert not wrong, f"{len(wrong)} of {len(doc['cases'])} differ (text, ours, llama.cpp): {wrong[:3]}"


def test_smollm2_file_reads_its_own_vocabulary():
    """The SmolLM2-135M-Instruct vocabulary (pre-tokenizer smollm, no BOS added): digits one by one."""
    v = file_vocab(str(DATA / "smollm.gguf"))
    assert (v.pre, v.add_bos, v.ignore_merges) == ("smollm", False, False)
    ids = tokenize(v, "<|im_start|>12")
    assert [v.pieces[i] for i in ids] == [b"<|im_start|>", b"1", b"2"]


def test_an_unknown_pre_tokenizer_is_refused_in_one_line(tmp_path, capsys):
    """A qwen2 export whose tokenizer.ggml.pre is rewritten to "bloom" (a name llama.cpp knows, graphdiag not)."""
    p = tmp_path / "q.gguf"
    assert main(["export-gguf", "--model", "tiny", "--arch", "qwen2", str(p)]) == 0
    data = p.read_bytes()
    at = data.index(b"tokenizer.ggml.pre")
    at = data.index(b"qwen2", at)
    p.write_bytes(data[:at] + b"bloom" + data[at + 5:])
    line = one_line(capsys, ["run", *QUICK[:2], "--model", str(p), "--prompt", "ab", "--steps", "1"])
    assert "pre-tokenizer 'bloom' is not supported" in line

"""`--prompt TEXT` through a model file's vocabulary (run and scenarios), the fast GGUF metadata reader, and
the real Gemma 3 file's tokenizations (tests/data/tokenize: the ids the lead checks against llama.cpp)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.model.gguf_reader import FastGGUFReader
from graphdiag.model.tokenize import file_vocab, tokenize
from support.cli import QUICK, one_line

gguf = pytest.importorskip("gguf")
DATA = Path(__file__).resolve().parents[1] / "data" / "tokenize" / "gemma3-270m.json"
BYTES0 = 3          # the exported vocabulary: <unk> <s> </s>, then the byte tokens


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("prompt") / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    return p


def _spm_bytes(text: str) -> list[int]:
    """The exported vocabulary has no merges worth taking: BOS, then "▁" + text as byte tokens."""
    return [1, *(BYTES0 + b for b in (" " + text).replace(" ", "\u2581").encode())]


def test_prompt_text_is_the_prompt_of_a_file_model(tiny_file, capsys):
    argv = ["run", *QUICK[:2], "--model", str(tiny_file), "--steps", "3"]
    generated = lambda out: [l for l in out.splitlines() if l.startswith("generated (seq 0)")]
    assert main([*argv, "--prompt", "hi there"]) == 0
    text = generated(capsys.readouterr().out)
    assert main([*argv, "--prompt-ids", ",".join(map(str, _spm_bytes("hi there")))]) == 0
    assert text and text == generated(capsys.readouterr().out)      # the same prompt, so the same tokens
    assert main([*argv, "--prompt", "hi where"]) == 0
    assert text != generated(capsys.readouterr().out)               # another prompt, other tokens


def test_prompt_text_reaches_the_record(tiny_file, tmp_path, capsys):
    rec = tmp_path / "r.jsonl"
    assert main(["run", *QUICK[:2], "--model", str(tiny_file), "--steps", "2", "--prompt", "ab",
                 "--events", str(rec)]) == 0
    header = json.loads(rec.read_text().splitlines()[0])
    assert header["settings"]["prompt"] == "ab"
    assert header["settings"]["prompt_ids"] == _spm_bytes("ab")
    assert header["settings"]["prompt_tokens"] == len(_spm_bytes("ab"))


def test_prompt_text_bad_combinations_are_refused_up_front(tiny_file, capsys):
    assert "needs a model file's vocabulary" in one_line(capsys, ["run", "--prompt", "hello"])
    assert "give one" in one_line(capsys, ["run", "--model", str(tiny_file), "--prompt", "a", "--prompt-ids", "1"])
    assert "disagree" in one_line(capsys, ["run", "--model", str(tiny_file), "--prompt", "a",
                                           "--prompt-tokens", "2"])
    assert "empty" in one_line(capsys, ["run", "--model", str(tiny_file), "--prompt", ""])


def test_a_scenario_gives_a_prompt_and_a_model_path_beside_it(tiny_file, tmp_path, capsys):
    d = tmp_path / "sc"
    d.mkdir()
    (d / "tiny.gguf").symlink_to(tiny_file)
    (d / "p.toml").write_text('name = "p"\ndescription = "a text prompt"\n[run]\nmodel = "tiny.gguf"\n'
                              'prompt = "ab"\nsteps = 2\n')
    rec = tmp_path / "r.jsonl"
    assert main(["run", "--backend", "sim", "--scenario", str(d / "p.toml"), "--events", str(rec)]) == 0
    header = json.loads(rec.read_text().splitlines()[0])
    assert header["settings"]["prompt_ids"] == _spm_bytes("ab")
    assert header["model_file"]["path"] == str((d / "tiny.gguf").resolve())


def test_the_fast_reader_reads_what_the_gguf_package_reads(tiny_file):
    fast, lib = FastGGUFReader(tiny_file, "r"), gguf.GGUFReader(tiny_file, "r")
    assert list(fast.fields) == list(lib.fields)
    for k in lib.fields:
        assert fast.fields[k].contents() == lib.fields[k].contents(), k
    assert [(t.name, t.data_offset, t.n_bytes) for t in fast.tensors] == \
           [(t.name, t.data_offset, t.n_bytes) for t in lib.tensors]


def test_gemma3_tokenizations(gemma3_file):
    """The ids in tests/data/tokenize/gemma3-270m.json (checked against llama.cpp on the GPU machine)."""
    doc = json.loads(DATA.read_text())
    t0 = time.perf_counter()
    v = file_vocab(str(gemma3_file))
    load_s = time.perf_counter() - t0
    assert (v.model, v.add_bos, v.add_space_prefix, v.bos) == ("llama", True, False, 2)
    for case in doc["cases"]:
        assert tokenize(v, case["text"]) == case["ids"], case["text"]
    assert load_s < 10, f"reading Gemma 3's vocabulary took {load_s:.1f} s"


def test_gemma3_metadata_reads_fast(gemma3_file):
    """The library reader took ~9 s on this file (one numpy view per vocabulary element); ours < 1 s
    (asserted at 5 s: a loaded 2-core machine)."""
    t0 = time.perf_counter()
    r = FastGGUFReader(gemma3_file, "r")
    took = time.perf_counter() - t0
    assert len(r.fields["tokenizer.ggml.tokens"].contents()) == 262144
    assert took < 5, f"{took:.2f} s"


def test_a_library_run_tokenizes_the_prompt_too(tiny_file):
    """runner.run without the CLI's validate_run still runs the text prompt, not a seeded random one."""
    from graphdiag.config import resolve
    from graphdiag.runner import run
    r = run(resolve({"backend": "sim", "model": str(tiny_file), "steps": 1, "prompt": "ab"}, environ={}))
    assert list(r.header["settings"]["prompt_ids"]) == _spm_bytes("ab")


def test_a_bpe_vocabulary_reads_from_a_file(tmp_path):
    """tokenizer.ggml.model gpt2 with merges and a pre-tokenizer, written by the gguf package, read back."""
    from graphdiag.model.pretokenize import BYTE_CHARS
    p = tmp_path / "bpe.gguf"
    w = gguf.GGUFWriter(str(p), "qwen2")
    tokens = [*BYTE_CHARS, "he", "Ġhe", "<|im_start|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 258 + [3])
    w.add_token_merges(["h e", "Ġ he"])
    w.add_bos_token_id(258)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    v = file_vocab(str(p))
    assert (v.model, v.pre, v.add_bos) == ("gpt2", "qwen2", False)
    assert tokenize(v, "he he<|im_start|>1") == [256, 257, 258, BYTE_CHARS.index("1")]

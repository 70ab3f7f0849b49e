"""GGUF model files (issue 27, the llama part): a preset exported with `export-gguf` reads back with the gguf
package, runs through `--model FILE.gguf` with the file's weights, decides and generates as the preset does,
and a file graphdiag cannot run is refused up front in one line naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.model.gguf_io import open_gguf, write_shape
from graphdiag.model.presets import ModelConfig
from graphdiag.model.weights import create_model
from graphdiag.runner import run
from support.cli import export_files, one_line
from support.decisions import decision_stream

gguf = pytest.importorskip("gguf")

SMALL = ModelConfig("mini", 2, 128, 4, 2, 256, 512, n_ctx=512)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_files(tmp_path_factory.mktemp("gguf"), "tiny", "wtype", ("f16", "q8_0"))


def test_an_exported_preset_reads_back_with_the_gguf_package(exported):
    r = gguf.GGUFReader(exported["q8_0"])
    f = lambda k: r.fields[k].contents()
    assert f("general.architecture") == "llama" and f("llama.block_count") == 4
    assert f("llama.embedding_length") == 512 and f("llama.attention.head_count_kv") == 8
    assert f("tokenizer.ggml.model") == "llama" and len(f("tokenizer.ggml.tokens")) == 4096
    assert f("tokenizer.ggml.tokens")[:3] == ["<unk>", "<s>", "</s>"] and f("tokenizer.ggml.bos_token_id") == 1
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    assert len(kinds) == 3 + 9 * 4 and kinds["blk.0.attn_q.weight"] == "Q8_0" and kinds["output_norm.weight"] == "F32"
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert list(emb.shape) == [512, 4096]


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_the_exported_file_runs_decides_and_generates_as_the_preset(exported, wtype):
    base = {"backend": "sim", "steps": 10, "prompt_tokens": 6, "batch": 2, "oracle": True, "verify": True}
    preset = run(resolve({**base, "model": "tiny", "wtype": wtype}, environ={}))
    filed = run(resolve({**base, "model": str(exported[wtype])}, environ={}))
    assert filed.header["model_file"]["types"] == {"F32": 9, wtype.upper(): 30}
    assert filed.header["settings"]["wtype"] == f"file: {wtype.upper()} ×30"   # not --wtype's default
    assert preset.header["settings"]["wtype"] == wtype
    assert decision_stream(filed.events) == decision_stream(preset.events)
    assert filed.tokens == preset.tokens and not filed.failures and not preset.failures


def test_the_file_model_on_the_cpu_backend_matches_the_oracle(exported, capsys):
    assert main(["run", "--backend", "cpu", "--model", str(exported["q8_0"]), "--steps", "4",
                 "--prompt-tokens", "4", "--oracle"]) == 0
    out = capsys.readouterr().out
    assert "model file:" in out and "0 over the bound" in out


def test_the_file_weights_are_the_files_bytes_not_a_copy(exported):
    from graphdiag.model.weights import create_file_model
    g = open_gguf(str(exported["f16"].resolve()))
    m = create_file_model(g)
    a = m.host["blk.1.ffn_down.weight"]
    base = a
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap) and str(base.filename) == str(exported["f16"].resolve())
    preset = create_model(g.cfg.__class__(**{**g.cfg.__dict__, "name": "tiny"}), m.wtype, seed=0)
    assert np.array_equal(a, preset.host["blk.1.ffn_down.weight"])


def _write(path, cfg=SMALL, arch="llama", drop=(), reshape=None, retype=None):
    """A small GGUF like export_gguf's, with one thing wrong."""
    m = create_model(cfg, seed=3)
    w = gguf.GGUFWriter(str(path), arch)
    write_shape(w, cfg)
    w.add_token_list([f"t{i}" for i in range(cfg.n_vocab)])
    for t in m.tensors():
        if t.name.startswith("cache_") or t.name in drop:
            continue
        a = np.ascontiguousarray(m.host[t.name])
        if reshape == t.name:
            a = a[..., :-32]
        if retype == t.name:
            a = a.astype(np.float16)
        w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_good_small_file_loads(tmp_path, capsys):
    p = _write(tmp_path / "ok.gguf")
    assert main(["run", "--backend", "sim", "--model", str(p), "--steps", "3", "--prompt-tokens", "2", "--oracle"]) == 0
    assert "0 over the bound" in capsys.readouterr().out


@pytest.mark.parametrize("kind,needle", [
    ("arch", "architecture 'phi3' is not supported (supported: llama, qwen2, qwen3"),
    ("missing", "tensor blk.1.ffn_up.weight is missing"),
    ("shape", "tensor blk.0.attn_q.weight has shape [96, 128], expected [128, 128]"),
    ("norm-type", "tensor blk.0.attn_norm.weight is F16, which graphdiag does not compute (supported: F32)"),
    ("truncated", "not a readable GGUF file"),
    ("absent", "no such model file"),
])
def test_a_file_graphdiag_cannot_run_is_refused_in_one_line(tmp_path, capsys, kind, needle):
    p = tmp_path / f"{kind}.gguf"
    if kind == "arch":
        _write(p, arch="phi3")
    elif kind == "missing":
        _write(p, drop=("blk.1.ffn_up.weight",))
    elif kind == "shape":
        _write(p, reshape="blk.0.attn_q.weight")
    elif kind == "norm-type":
        _write(p, retype="blk.0.attn_norm.weight")
    elif kind == "truncated":
        full = _write(tmp_path / "full.gguf")
        p.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    line = one_line(capsys, ["run", "--backend", "sim", "--model", str(p), "--steps", "2"])
    assert needle in line, line


def test_wtype_with_a_file_and_a_bad_export_name_are_refused(tmp_path, capsys, exported):
    assert "has its own types" in one_line(capsys, ["run", "--model", str(exported["f16"]), "--wtype", "q8_0"])
    assert "must end in .gguf" in one_line(capsys, ["export-gguf", str(tmp_path / "x.bin")])
    # a MoE preset is written as llama's MoE only (tests/unit/test_moe_llama_gguf.py)
    assert "MoE preset" in one_line(capsys, ["export-gguf", "--model", "moe-tiny", "--arch", "qwen2",
                                             str(tmp_path / "m.gguf")])


def test_prompt_ids_are_the_prompt_and_the_tokens_print_as_text(exported, capsys):
    argv = ["run", "--backend", "sim", "--model", str(exported["f16"]), "--steps", "3", "--oracle"]
    assert main([*argv, "--prompt-ids", "1,300,301,302"]) == 0
    out = capsys.readouterr().out
    assert "prompt_ids=" in out and "0 over the bound" in out
    ids = [int(x) for x in out.split("generated (seq 0): ")[1].splitlines()[0].split()]
    text = out.split("generated (seq 0) as text: ")[1].splitlines()[0]
    assert text == repr("".join(f" t{i - 259}" for i in ids))          # the exported vocabulary's pieces
    assert main([*argv, "--prompt-ids", "1,300,301,303"]) == 0          # another prompt, other tokens
    assert capsys.readouterr().out.split("generated (seq 0): ")[1].splitlines()[0] != " ".join(map(str, ids))


def test_prompt_ids_bad_values_are_refused(capsys, exported):
    assert "outside model" in one_line(capsys, ["run", "--model", str(exported["f16"]), "--prompt-ids", "1,4096"])
    assert "not a list of token ids" in one_line(capsys, ["run", "--prompt-ids", "1,-2"])
    assert "disagree" in one_line(capsys, ["run", "--prompt-ids", "1,2", "--prompt-tokens", "3"])


def test_the_detokenizer_joins_pieces_as_llama_cpp(tmp_path):
    from graphdiag.model.gguf_io import _bpe_bytes, _spm_bytes
    assert _spm_bytes("\u2581hello") == b" hello" and _spm_bytes("<0x0A>") == b"\n" and _spm_bytes("<0xZZ>") == b"<0xZZ>"
    assert _bpe_bytes("\u0120world") == b" world" and _bpe_bytes("\u010a") == b"\n"

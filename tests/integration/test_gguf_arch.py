"""qwen2 and qwen3 GGUF files (issue 27, point 1): exported and generated files read back with the metadata
llama.cpp reads, run on the CPU backend and the simulator against the oracle, decide as the preset of that
architecture does, and a file graphdiag's graph of its architecture cannot compute is refused up front in one
line naming what is wrong."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.model.arch import get_arch
from graphdiag.model.gguf_io import detokenizer, open_gguf
from graphdiag.model.presets import PRESETS, ROPE_NEOX
from graphdiag.model.weights import create_file_model
from graphdiag.runner import run
from support.arch_gguf import MINI, MINI_QWEN3_WIDE, arch_config, write_arch_gguf
from support.cli import export_files, one_line
from support.decisions import decision_stream

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_files(tmp_path_factory.mktemp("gguf-arch"), "tiny", "arch", ("qwen2", "qwen3"))


def test_an_exported_qwen_file_has_the_keys_and_vocabulary_llama_cpp_reads(exported):
    for arch, per_layer in (("qwen2", 12), ("qwen3", 11)):
        r = gguf.GGUFReader(exported[arch])
        f = lambda k: r.fields[k].contents()
        assert f("general.architecture") == arch and f(f"{arch}.block_count") == 4
        assert f(f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
        assert f(f"{arch}.context_length") == 4096 and f(f"{arch}.rope.freq_base") == 10000.0
        assert f("tokenizer.ggml.model") == "gpt2" and f("tokenizer.ggml.pre") == "qwen2"
        tokens, merges = f("tokenizer.ggml.tokens"), f("tokenizer.ggml.merges")
        assert len(tokens) == 4096 and tokens[-1] == "<|endoftext|>" and f("tokenizer.ggml.eos_token_id") == 4095
        assert "\u010a" in tokens[:256]                      # the linefeed llama.cpp's BPE loader looks up
        a, b = merges[0].split(" ")
        assert a + b == tokens[256] and len(merges) == 4096 - 257
        names = {t.name for t in r.tensors}
        assert len(names) == 3 + per_layer * 4
    names = {t.name for t in gguf.GGUFReader(exported["qwen2"]).tensors}
    assert {"blk.0.attn_q.bias", "blk.3.attn_v.bias"} <= names
    names = {t.name for t in gguf.GGUFReader(exported["qwen3"]).tensors}
    assert {"blk.0.attn_q_norm.weight", "blk.3.attn_k_norm.weight"} <= names


def test_the_bpe_vocabulary_prints_through_the_detokenizer(exported):
    text = detokenizer(exported["qwen3"])
    assert text([ord("h"), ord("i")]) == "hi"                  # the byte tokens 0..255 are in byte order
    assert text([4095]) == "<|endoftext|>"


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_an_exported_file_reads_back_as_the_preset_of_its_architecture(exported, arch):
    g = open_gguf(str(exported[arch].resolve()))
    want = get_arch(arch).preset(PRESETS["tiny"])
    assert g.cfg.norm_eps == np.float32(want.norm_eps)          # the file holds a float32
    assert dataclasses.replace(g.cfg, name="tiny", norm_eps=want.norm_eps) == want
    assert g.cfg.rope_type == ROPE_NEOX and g.cfg.qkv_bias == (arch == "qwen2")
    m = create_file_model(g)
    assert np.array_equal(m.host["blk.1.attn_k.weight"], create_model_host(want, "blk.1.attn_k.weight"))


def create_model_host(cfg, name):
    from graphdiag.model.weights import create_model
    return create_model(cfg, seed=0).host[name]


def test_a_per_layer_array_of_equal_values_reads_as_that_value(tmp_path):
    p = write_arch_gguf(tmp_path / "arr.gguf", "qwen3", extra={"qwen3.attention.key_length": [32, 32]})
    assert open_gguf(str(p)).cfg.head_dim == 32


def test_a_wide_head_qwen3_file_takes_head_dim_from_key_length(tmp_path):
    p = write_arch_gguf(tmp_path / "wide.gguf", "qwen3", MINI_QWEN3_WIDE)
    r = gguf.GGUFReader(p)
    assert r.fields["qwen3.attention.key_length"].contents() == 64
    cfg = open_gguf(str(p)).cfg
    assert cfg.head_dim == 64 and cfg.n_embd_q == 256 and cfg.n_embd == 128


def test_a_file_without_output_weight_ties_it_to_the_embedding(tmp_path):
    g = open_gguf(str(write_arch_gguf(tmp_path / "tied.gguf", "qwen2", tied=True)))
    assert g.cfg.tied_output and "output.weight" not in g.types
    m = create_file_model(g)
    assert m.output is m.tok_embd


def _refusal(capsys, path) -> str:
    return one_line(capsys, ["run", "--backend", "sim", "--model", str(path), "--steps", "2"])


@pytest.mark.parametrize("arch,kw,needle", [
    ("qwen2", dict(drop=("blk.1.attn_k.bias",)), "tensor blk.1.attn_k.bias is missing (a qwen2 model of 2 layers"),
    ("qwen3", dict(drop=("blk.0.attn_k_norm.weight",)), "tensor blk.0.attn_k_norm.weight is missing"),
    ("qwen2", dict(cfg=dataclasses.replace(MINI, n_embd_head=64)), "llama.cpp's qwen2 needs head_dim = n_embd / n_head = 32"),
    ("qwen3", dict(extra={"qwen3.rope.dimension_count": 16}), "rope.dimension_count 16 must be equal"),
    ("qwen3", dict(extra={"qwen3.attention.key_length": [32, 16]}),
     "metadata qwen3.attention.key_length = [32, 16] is not an integer graphdiag can use (per-layer values"),
    ("qwen3", dict(extra={"qwen3.rope.scaling.factor": "x"}), "metadata qwen3.rope.scaling.factor = 'x' is not a number"),
    ("qwen2", dict(extra={"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0}),
     "rope scaling (qwen2.rope.scaling.type 'yarn', factor 4.0) is not computed by graphdiag"),
    ("llama", dict(extra_tensors={"rope_freqs.weight": np.ones(16)}),
     "tensor rope_freqs.weight changes llama's graph in llama.cpp; graphdiag does not compute it"),
    ("qwen2", dict(extra_tensors={"output.bias": np.zeros(512)}), "tensor output.bias changes qwen2's graph"),
    # the per-weight scales llama.cpp loads for every architecture (build_lora_mm multiplies by them)
    ("llama", dict(extra_tensors={"blk.1.attn_q.scale": np.ones(1)}),
     "tensor blk.1.attn_q.scale changes llama's graph in llama.cpp (its generic pass loads it; build_lora_mm"),
    ("qwen3", dict(extra_tensors={"blk.0.ffn_down.input_scale": np.ones(1)}),
     "tensor blk.0.ffn_down.input_scale changes qwen3's graph in llama.cpp"),
    ("qwen2", dict(extra_tensors={"output.scale": np.ones(1)}), "tensor output.scale changes qwen2's graph"),
    ("gemma3", dict(extra_tensors={"blk.0.ffn_up.scale": np.ones(1)}), "tensor blk.0.ffn_up.scale changes gemma3's"),
])
def test_a_file_the_architectures_graph_cannot_compute_is_refused_in_one_line(tmp_path, capsys, arch, kw, needle):
    line = _refusal(capsys, write_arch_gguf(tmp_path / "bad.gguf", arch, **kw))
    assert needle in line, line


def test_a_file_without_the_rms_epsilon_is_refused_as_llama_cpp_refuses_it(tmp_path, capsys):
    p = tmp_path / "noeps.gguf"
    w = gguf.GGUFWriter(str(p), "qwen3")
    for k, v in (("context_length", 512), ("embedding_length", 128), ("block_count", 1),
                 ("feed_forward_length", 256), ("attention.head_count", 4)):
        w.add_uint32(f"qwen3.{k}", v)
    w.add_token_list([f"t{i}" for i in range(300)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert "qwen3.attention.layer_norm_rms_epsilon is missing (llama.cpp requires it)" in _refusal(capsys, p)


@pytest.mark.parametrize("arch,cfg", [("qwen2", MINI), ("qwen3", MINI), ("qwen3", MINI_QWEN3_WIDE)],
                         ids=["qwen2", "qwen3", "qwen3-wide-head"])
@pytest.mark.parametrize("backend", ["cpu", "sim"])
def test_a_generated_file_runs_within_the_oracle_bound(tmp_path, capsys, arch, cfg, backend):
    """The CPU backend against the oracle; the simulator also with --verify (replays recomputed eagerly)."""
    p = write_arch_gguf(tmp_path / f"{arch}.gguf", arch, cfg, tied=arch == "qwen2")
    verify = ["--verify"] if backend == "sim" else []
    assert main(["run", "--backend", backend, "--model", str(p), "--steps", "4", "--prompt-tokens", "5",
                 "--batch", "2", "--oracle", *verify]) == 0
    out = capsys.readouterr().out
    assert "model file:" in out and "0 over the bound" in out


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_the_exported_file_runs_decides_and_generates_as_the_preset_of_its_arch(exported, arch, monkeypatch):
    monkeypatch.setitem(PRESETS, f"tiny-{arch}", dataclasses.replace(get_arch(arch).preset(PRESETS["tiny"]),
                                                                      name=f"tiny-{arch}"))
    base = {"backend": "sim", "steps": 8, "prompt_tokens": 5, "batch": 2, "oracle": True, "verify": True}
    preset = run(resolve({**base, "model": f"tiny-{arch}"}, environ={}))
    filed = run(resolve({**base, "model": str(exported[arch])}, environ={}))
    assert decision_stream(filed.events) == decision_stream(preset.events)
    assert filed.tokens == preset.tokens and not filed.failures and not preset.failures


def test_export_of_an_unknown_architecture_is_refused_in_one_line(tmp_path, capsys):
    line = one_line(capsys, ["export-gguf", "--arch", "phi3", str(tmp_path / "x.gguf")])
    assert "architecture 'phi3' is not supported (supported: llama, qwen2, qwen3" in line


def test_a_head_size_without_flash_attention_kernels_is_refused_on_graph_backends_only(tmp_path, capsys):
    p = write_arch_gguf(tmp_path / "hd48.gguf", "qwen3", dataclasses.replace(MINI, n_embd_head=48))
    assert "head_dim 48 has no flash-attention kernel on the graph backends" in _refusal(capsys, p)
    assert main(["run", "--backend", "cpu", "--model", str(p), "--steps", "2", "--prompt-tokens", "3", "--oracle"]) == 0
    assert "0 over the bound" in capsys.readouterr().out


def test_export_writes_a_preset_as_its_own_architecture_unless_told(tmp_path, capsys):
    """gemma3-tiny is a Gemma 3 preset: without --arch it is written as gemma3 (it was written as llama)."""
    assert main(["export-gguf", "--model", "gemma3-tiny", str(tmp_path / "g.gguf")]) == 0
    assert "gemma3-tiny as gemma3" in capsys.readouterr().out
    assert open_gguf(tmp_path / "g.gguf").arch == "gemma3"
    assert main(["export-gguf", "--model", "tiny", str(tmp_path / "t.gguf")]) == 0
    assert "tiny as llama" in capsys.readouterr().out


def test_run_help_names_every_preset():
    from click.testing import CliRunner
    from graphdiag.cli.run import run as run_cmd
    text = " ".join(CliRunner().invoke(run_cmd, ["--help"]).output.split())
    assert all(p in text for p in PRESETS), [p for p in PRESETS if p not in text]

"""llama.cpp's ftype mixes (issue 50): q2_k (LLAMA_FTYPE_MOSTLY_Q2_K), q3_k_m, q4_k_s, q4_k_m, q5_k_s, q5_k_m
and mxfp4_moe, each weight in the type llama.cpp's own quantizer gives it (every preset, every mix, against
tests/data/quant_mixes.json, recorded by tools/record_quant_mixes.py with llama_model_quantize of llama.cpp
0c1e57098); --wtype q3_k (every weight Q3_K); the CPU backend and the simulated GPU against the oracle, and
export-gguf files gguf reads back and runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.model.fallbacks import fallback_note, mix_summary
from graphdiag.model.presets import PRESETS, ModelConfig, weight_type
from graphdiag.model.weights import create_file_model, create_model

gguf = pytest.importorskip("gguf")


def _types(preset, wtype: str) -> dict[str, G]:
    c = PRESETS[preset] if isinstance(preset, str) else preset
    m = create_model(c, weight_type(wtype), with_data=False)
    return {t.name: t.type for t in m.tensors() if not t.name.startswith("cache_")}


RECORDED = json.loads((Path(__file__).resolve().parents[1] / "data" / "quant_mixes.json").read_text())["types"]


@pytest.mark.parametrize("preset", sorted(RECORDED))
def test_every_mix_gives_each_weight_the_type_llama_cpps_quantizer_gave_it(preset):
    """llama_model_quantize on the preset's F16 export (tied embeddings, 8 and 16 experts, rows no multiple of
    256 falling back, gemma3's and gpt-oss's extra norms), tensor for tensor."""
    for mix, want in RECORDED[preset].items():
        got = {k: v.name for k, v in _types(preset, mix).items()}
        assert got == {k: v.upper() for k, v in want.items()}, (preset, mix)


def test_the_k_quant_s_and_m_mixes_give_more_bits_where_upstream_does():
    t = _types("small", "q4_k_m")                          # 8 layers: use_more_bits picks 0, 3, 6, 7
    assert [t[f"blk.{i}.attn_v.weight"] for i in range(8)] == [G.Q6_K, G.Q4_K, G.Q4_K, G.Q6_K, G.Q4_K, G.Q4_K,
                                                             G.Q6_K, G.Q6_K]
    assert t["blk.3.ffn_down.weight"] == G.Q6_K and t["blk.3.ffn_up.weight"] == G.Q4_K
    s = _types("small", "q4_k_s")                          # the first 4 attn_v, the first eighth of ffn_down
    assert [s[f"blk.{i}.attn_v.weight"] for i in (0, 3, 4)] == [G.Q5_K, G.Q5_K, G.Q4_K]
    assert [s[f"blk.{i}.ffn_down.weight"] for i in (0, 1)] == [G.Q5_K, G.Q4_K]
    assert _types("moe-tiny", "q4_k_m")["blk.1.attn_output.weight"] == G.Q5_K     # 8 experts
    assert _types("moe-tiny", "q5_k_m")["blk.1.attn_output.weight"] == G.Q5_K
    assert _types("small", "q5_k_s")["output.weight"] == G.Q6_K


def test_q2_k_gives_attn_v_ffn_down_attn_output_and_the_output_more_bits():
    t = _types("small", "q2_k")                       # n_head 16 over 4 KV heads: n_gqa 4
    assert t["blk.3.attn_q.weight"] == t["blk.3.ffn_up.weight"] == t["token_embd.weight"] == G.Q2_K
    assert t["blk.3.attn_v.weight"] == G.Q4_K                 # n_gqa >= 4
    assert t["blk.3.ffn_down.weight"] == t["blk.3.attn_output.weight"] == G.Q3_K
    assert t["output.weight"] == G.Q6_K and t["blk.3.attn_norm.weight"] == G.F32
    assert _types("tiny", "q2_k")["blk.0.attn_v.weight"] == G.Q3_K      # 8 heads, 8 KV heads


def test_q3_k_m_gives_the_first_two_attn_v_q5_k_and_ffn_down_q4_k_or_q5_k():
    t = _types("small", "q3_k_m")
    assert [t[f"blk.{i}.attn_v.weight"] for i in range(4)] == [G.Q5_K, G.Q5_K, G.Q4_K, G.Q4_K]
    assert {t[f"blk.{i}.ffn_down.weight"] for i in range(8)} == {G.Q4_K}      # 8 layers: n_layer / 16 = 0
    assert t["blk.5.attn_output.weight"] == G.Q4_K and t["blk.5.ffn_gate.weight"] == G.Q3_K
    assert t["output.weight"] == G.Q6_K and t["token_embd.weight"] == G.Q3_K
    deep = _types(ModelConfig("deep", 32, 256, 4, 4, 512, 512, n_ctx=64), "q3_k_m")
    assert [deep[f"blk.{i}.ffn_down.weight"] for i in (0, 1, 2, 31)] == [G.Q5_K, G.Q5_K, G.Q4_K, G.Q4_K]


def test_eight_experts_and_a_tied_embedding_follow_upstreams_special_cases():
    for w in ("q2_k", "q3_k_m"):
        t = _types("moe-tiny", w)                     # n_expert 8: attn_v, attn_k Q8_0; attn_output Q5_K
        assert t["blk.1.attn_v.weight"] == t["blk.1.attn_k.weight"] == G.Q8_0
        assert t["blk.1.attn_output.weight"] == G.Q5_K
        assert t["blk.1.ffn_down_exps.weight"] == (G.Q3_K if w == "q2_k" else G.Q4_K)
        assert _types("gemma3-tiny", w)["token_embd.weight"] == G.Q6_K    # tied: quantised as the output
    ragged = _types(ModelConfig("ragged", 2, 256, 4, 4, 512, 640, n_ctx=64), "q2_k")   # n_vocab 640 rows of 256
    assert ragged["output.weight"] == G.Q6_K
    narrow = _types(ModelConfig("narrow", 2, 320, 4, 4, 512, 512, n_ctx=64), "q3_k_m")  # rows of 320
    assert narrow["output.weight"] == G.Q8_0 and narrow["blk.0.attn_q.weight"] == G.Q4_0    # Q3_K's fallback


def test_a_mix_says_its_types_and_where_rows_fell_back():
    m = create_model(PRESETS["tiny"], weight_type("q3_k_m"), with_data=False)
    assert mix_summary(m) == "q3_k_m: Q3_K ×17, Q4_K ×6, Q5_0 ×4, Q5_K ×2, Q6_K ×1"
    assert fallback_note(m) == ("Q3_K_M weights with rows no multiple of 256 fell back as llama.cpp's quantizer "
                                "does: blk.0-3.ffn_down (1408 wide) -> Q5_0")
    assert mix_summary(create_model(PRESETS["tiny"], weight_type("q3_k"), with_data=False)) == ""


@pytest.mark.parametrize("wtype", ["q2_k", "q3_k", "q3_k_m", "q4_k_m", "q5_k_s"])
def test_the_cpu_backend_runs_them_within_the_oracle_bound(capsys, wtype):
    assert main(["run", "--backend", "cpu", "--model", "tiny", "--wtype", wtype, "--oracle", "--steps", "6"]) == 0
    assert "0 over the bound" in capsys.readouterr().out


@pytest.mark.parametrize("wtype", ["q2_k", "q3_k_m"])
def test_the_simulated_gpu_runs_them_against_the_oracle_and_the_header_counts_the_types(capsys, tmp_path, wtype):
    ev = tmp_path / "ev.jsonl"
    assert main(["run", "--backend", "sim", "--model", "tiny", "--wtype", wtype, "--oracle", "--verify",
                 "--steps", "3", "--prompt-tokens", "16", "--events", str(ev)]) == 0
    out = capsys.readouterr().out
    assert "0 over the bound" in out and "0 mismatches" in out
    header = json.loads(ev.read_text().splitlines()[0])
    want = {"q2_k": "q2_k: Q2_K ×17, Q3_K ×8, Q4_0 ×4, Q6_K ×1",
            "q3_k_m": "q3_k_m: Q3_K ×17, Q4_K ×6, Q5_0 ×4, Q5_K ×2, Q6_K ×1"}[wtype]
    assert header["settings"]["wtype"] == want


@pytest.mark.parametrize("wtype, ftype", [("q2_k", 10), ("q3_k_m", 12), ("q3_k", 11), ("q4_k_m", 15)])
def test_an_exported_file_holds_the_mix_and_runs_on_the_cpu(tmp_path, capsys, wtype, ftype):
    from graphdiag.model.gguf_io import open_gguf
    p = tmp_path / f"tiny-{wtype}.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", wtype, str(p)]) == 0
    r = gguf.GGUFReader(p)
    assert int(r.fields["general.file_type"].parts[-1][0]) == ftype
    kinds = {t.name: G(int(t.tensor_type)) for t in r.tensors}
    assert kinds == _types("tiny", wtype)
    fm, pm = create_file_model(open_gguf(str(p.resolve()))), create_model(PRESETS["tiny"], weight_type(wtype))
    for name in ("blk.1.attn_v.weight", "blk.1.ffn_down.weight", "output.weight", "token_embd.weight"):
        assert fm.host[name].tobytes() == pm.host[name].tobytes(), name
    capsys.readouterr()
    assert main(["run", "--backend", "cpu", "--model", str(p), "--steps", "3", "--oracle"]) == 0
    assert "0 over the bound" in capsys.readouterr().out

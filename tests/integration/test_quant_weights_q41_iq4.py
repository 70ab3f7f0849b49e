"""Q4_1, IQ4_NL and IQ4_XS end to end: --wtype for the presets (llama-quant.cpp's fallback IQ4_XS -> IQ4_NL),
the simulated GPU and the CPU backend against the oracle, export-gguf files gguf-py reads back and graphdiag
runs, their general.file_type and the header naming the types."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag.cli.main import main
from graphdiag.errors import UsageError
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.model.fallbacks import fallback_note
from graphdiag.model.gguf_io import open_gguf
from graphdiag.model.presets import PRESETS, preset_type, weight_type
from graphdiag.model.weights import create_file_model, create_model

gguf = pytest.importorskip("gguf")
WTYPES = ("q4_1", "iq4_nl", "iq4_xs")
FTYPE = {"q4_1": 3, "iq4_nl": 25, "iq4_xs": 30}     # llama.h LLAMA_FTYPE_MOSTLY_*


def test_the_weight_types_are_known_by_name():
    assert [weight_type(w) for w in ("Q4_1", "iq4_nl", "IQ4_XS")] == [G.Q4_1, G.IQ4_NL, G.IQ4_XS]
    with pytest.raises(UsageError, match="unknown weight type 'iq4_ks'"):
        weight_type("iq4_ks")


def test_rows_fall_back_as_llama_quant_cpp_does():
    """tensor_type_fallback: IQ4_XS (256) -> IQ4_NL where a row is no multiple of 256; a 32-block type, or a
    fallback that still does not fit, -> F16."""
    assert preset_type(G.IQ4_XS, 1408) == G.IQ4_NL and preset_type(G.IQ4_XS, 2048) == G.IQ4_XS
    assert preset_type(G.IQ4_XS, 48) == G.F16
    assert preset_type(G.Q4_1, 1408) == G.Q4_1 and preset_type(G.IQ4_NL, 1408) == G.IQ4_NL
    assert preset_type(G.Q4_1, 48) == G.F16 and preset_type(G.IQ4_NL, 48) == G.F16


def test_an_iq4_xs_preset_names_its_fallbacks_and_q4_1_has_none():
    m = create_model(PRESETS["tiny"], G.IQ4_XS, with_data=False)
    assert m.fallbacks == {f"blk.{i}.ffn_down.weight": G.IQ4_NL for i in range(4)}
    assert {t.type for t in m.tensors() if t.name in ("token_embd.weight", "output.weight")} == {G.IQ4_XS}
    assert fallback_note(m).endswith("blk.0-3.ffn_down (1408 wide) -> IQ4_NL")
    assert create_model(PRESETS["tiny"], G.Q4_1, with_data=False).fallbacks == {}


@pytest.mark.parametrize("wtype", WTYPES)
def test_the_simulated_gpu_runs_the_preset_against_the_oracle(capsys, wtype):
    """The MMVQ kernels' twins on Q8_1 x (decode) and the prefill's dequantisation (16 tokens: MMQ-sized)."""
    assert main(["run", "--backend", "sim", "--model", "tiny", "--wtype", wtype, "--oracle", "--verify",
                 "--steps", "3", "--prompt-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "0 over the bound" in out and "0 mismatches" in out
    assert f"mul_mat_vec_{wtype}" in out and f"dequantize_f16_{wtype}" in out
    assert ("-> IQ4_NL" in out) == (wtype == "iq4_xs")


def test_the_cpu_backend_runs_a_q4_1_preset_within_the_oracle_bound(capsys):
    assert main(["run", "--backend", "cpu", "--model", "tiny", "--wtype", "q4_1", "--oracle", "--steps", "4"]) == 0
    assert "0 over the bound" in capsys.readouterr().out


@pytest.mark.parametrize("wtype", WTYPES)
def test_an_exported_file_reads_back_in_gguf_py_and_runs(tmp_path, capsys, wtype):
    p = tmp_path / f"tiny-{wtype}.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", wtype, str(p)]) == 0
    r = gguf.GGUFReader(p)
    f = r.fields["general.file_type"]
    assert int(f.parts[f.data[0]][0]) == FTYPE[wtype]
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    assert kinds["blk.2.ffn_down.weight"] == preset_type(G[wtype.upper()], 1408).name
    assert kinds["blk.2.ffn_up.weight"] == kinds["token_embd.weight"] == wtype.upper()
    pm = create_model(PRESETS["tiny"], G[wtype.upper()], seed=0)
    fm = create_file_model(open_gguf(str(p.resolve())))
    by_name = {t.name: t for t in r.tensors}
    for name in ("blk.2.ffn_down.weight", "blk.0.attn_q.weight", "token_embd.weight"):
        assert fm.host[name].tobytes() == pm.host[name].tobytes(), name
        t = by_name[name]     # gguf-py's own dequantisation of the file's bytes: the preset's values
        vals = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        assert np.array_equal(vals.reshape(pm.dense(name).shape), pm.dense(name)), name
    capsys.readouterr()
    assert main(["run", "--backend", "sim", "--model", str(p), "--steps", "2", "--oracle"]) == 0
    out = capsys.readouterr().out
    assert "0 over the bound" in out and f"{wtype.upper()} ×" in out

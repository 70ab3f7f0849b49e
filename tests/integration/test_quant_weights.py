"""The weight types of issue 27 on the host: presets in any --wtype (with llama.cpp's fallback), the CPU
backend and the oracle computing with them, GGUF files holding them, the GPU backends refusing them for now."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag import runner
from graphdiag.backends import rng
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.cli.main import main
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.memory import quantize_q8_0
from graphdiag.model.gguf_io import open_gguf
from graphdiag.model.presets import PRESETS, ModelConfig, preset_type
from graphdiag.model.reference import Reference
from graphdiag.model.fallbacks import fallback_note
from graphdiag.model.weights import create_model, load_model, value_spec
from graphdiag.quants import dequantize, quantize
from support.cli import one_line

gguf = pytest.importorskip("gguf")
MINI = ModelConfig("mini", 2, 256, 4, 2, 640, 512, n_ctx=256)       # n_ff 640: no multiple of 256
NEW = ("bf16", "q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q3_k")


def test_the_settings_know_the_same_weight_types_as_the_presets():
    from graphdiag.config import WTYPES
    from graphdiag.model.presets import WEIGHT_TYPES
    assert tuple(WEIGHT_TYPES) == WTYPES


def test_k_quants_fall_back_as_llama_cpps_quantizer_does():
    assert preset_type(G.Q4_K, 1408) == G.Q5_0 and preset_type(G.Q5_K, 1408) == G.Q5_1
    assert preset_type(G.Q6_K, 1408) == G.Q8_0 and preset_type(G.Q4_K, 2048) == G.Q4_K
    assert preset_type(G.Q4_K, 48) == G.F16 and preset_type(G.Q4_0, 48) == G.F16   # nor its fallback fits
    assert preset_type(G.F16, 48) == G.F16 and preset_type(G.Q5_0, 1408) == G.Q5_0
    assert preset_type(G.Q2_K, 1408) == G.Q4_0 and preset_type(G.Q3_K, 1408) == G.Q4_0
    assert preset_type(G.Q3_K, 48) == G.F16 and preset_type(G.Q2_K, 2816) == G.Q2_K


def test_a_preset_names_the_tensors_that_fell_back():
    m = create_model(PRESETS["tiny"], G.Q4_K, with_data=False)
    assert m.fallbacks == {f"blk.{i}.ffn_down.weight": G.Q5_0 for i in range(4)}
    assert {t.type for t in m.tensors() if t.name.endswith("ffn_up.weight")} == {G.Q4_K}
    assert fallback_note(m).endswith("blk.0-3.ffn_down (1408 wide) -> Q5_0")
    assert create_model(PRESETS["small"], G.Q4_K, with_data=False).fallbacks == {}


@pytest.mark.parametrize("wtype", NEW)
def test_dense_weights_are_the_quantised_draw(wtype):
    m = create_model(MINI, G[wtype.upper()], seed=4)
    t = next(t for t in m.tensors() if t.name == "blk.1.ffn_down.weight")
    mul, add = value_spec(t)
    x = rng.draw_f32(4, t.idx, 640 * 256, mul, add).reshape(256, 640)
    assert t.type == preset_type(G[wtype.upper()], 640)
    # Q8_0 (Q6_K's fallback) is drawn as rng_fill_q8_0 rounds (halves to even), every other type as ggml's
    stored = quantize_q8_0(x) if t.type == G.Q8_0 else quantize(x, t.type)
    assert np.array_equal(m.dense(t.name), dequantize(stored))


def test_a_simulated_device_holds_the_bytes_the_host_quantised():
    m = create_model(MINI, G.Q4_K, seed=2)
    drv = SimDriver(memory_bytes=1 << 30)
    gpu = GpuBackend(drv, E.EventBus(), RuntimeOptions())
    try:
        load_model(m, gpu)
        for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "output.weight", "output_norm.weight"):
            t = next(t for t in m.tensors() if t.name == name)
            got = gpu.tensor_get(t.data, t.nbytes())
            assert np.array_equal(got, np.frombuffer(m.host[name].tobytes(), np.uint8)), name
    finally:
        gpu.close()
        drv.close()


def test_the_oracle_rounds_activations_to_q8_1_for_every_integer_dot_type():
    m = create_model(MINI, G.Q4_K, seed=1)
    ref = Reference(m, q8_1_activations=True)
    ref.w("blk.0.attn_q.weight"), ref.w("blk.1.ffn_down.weight"), ref.w("blk.0.attn_norm.weight")
    assert ref._q8 == {"blk.0.attn_q.weight", "blk.1.ffn_down.weight"}
    bf = Reference(create_model(MINI, G.BF16, seed=1), q8_1_activations=True)
    bf.w("blk.0.attn_q.weight")
    assert not bf._q8


@pytest.mark.parametrize("wtype", ["q4_k", "q5_0"])
def test_the_cpu_backend_runs_a_quantised_preset_within_the_oracle_bound(capsys, wtype):
    assert main(["run", "--backend", "cpu", "--model", "tiny", "--wtype", wtype, "--oracle", "--steps", "8"]) == 0
    out = capsys.readouterr().out
    assert "0 over the bound" in out
    assert ("fell back" in out) == (wtype == "q4_k")


@pytest.mark.parametrize("wtype", ["q4_k", "bf16"])
def test_the_simulated_gpu_runs_a_host_quantised_preset_against_the_oracle(capsys, wtype):
    # the quant kernels' numpy twins on the bytes graphdiag.quants wrote, prompt (MMQ-sized) and decode
    assert main(["run", "--backend", "sim", "--model", "tiny", "--wtype", wtype, "--oracle", "--verify",
                 "--steps", "3", "--prompt-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "0 over the bound" in out and "0 mismatches" in out


def test_an_unknown_weight_type_is_refused_before_building_anything(capsys, monkeypatch):
    monkeypatch.setattr(runner, "build_model", lambda *a, **kw: pytest.fail("a model was built"))
    assert "unknown weight type 'q1_k'" in one_line(capsys, ["run", "--backend", "cpu", "--wtype", "q1_k"])


@pytest.mark.parametrize("wtype", ["q4_k", "q6_k", "bf16", "q4_0"])
def test_an_exported_file_holds_the_types_and_bytes_and_runs_on_the_cpu(tmp_path, capsys, wtype):
    p = tmp_path / f"tiny-{wtype}.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", wtype, str(p)]) == 0
    r = gguf.GGUFReader(p)
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    want = preset_type(G[wtype.upper()], 1408).name
    assert kinds["blk.2.ffn_down.weight"] == want and kinds["blk.2.ffn_up.weight"] == wtype.upper()
    g = open_gguf(str(p.resolve()))
    from graphdiag.model.weights import create_file_model
    fm, pm = create_file_model(g), create_model(PRESETS["tiny"], G[wtype.upper()], seed=0)
    for name in ("blk.2.ffn_down.weight", "token_embd.weight"):
        assert fm.host[name].dtype == pm.host[name].dtype
        assert fm.host[name].tobytes() == pm.host[name].tobytes()
    capsys.readouterr()
    assert main(["run", "--backend", "cpu", "--model", str(p), "--steps", "3", "--oracle"]) == 0
    assert "0 over the bound" in capsys.readouterr().out


def test_a_tensor_of_partial_blocks_or_the_wrong_bytes_is_refused_naming_it():
    # gguf's writer cannot write such a file (it checks the same): the reader's check, called as open_gguf does
    from graphdiag.errors import UsageError
    from graphdiag.model.gguf_io import _check_bytes
    with pytest.raises(UsageError, match="blk.0.ffn_down.weight is Q4_K with rows of 640 elements, no multiple"):
        _check_bytes("f.gguf", "blk.0.ffn_down.weight", G.Q4_K, (640, 256), 256 * 640 // 256 * 144)
    with pytest.raises(UsageError, match="holds 100 bytes; Q6_K of shape \\[512, 2\\] is 840"):
        _check_bytes("f.gguf", "w", G.Q6_K, (512, 2), 100)
    _check_bytes("f.gguf", "w", G.Q5_1, (64, 3), 3 * 2 * 24)

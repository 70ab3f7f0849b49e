"""Weights rng_fill cannot draw (BF16, Q4_0 ... Q6_K, IQ4_NL, IQ4_XS): drawn and quantised on the host,
uploaded to the GPU byte for byte — the bytes the simulated driver holds for the same model (tests/integration/test_quant_weights)."""

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.ir.dtypes import GGMLType
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model, load_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("wt", [GGMLType.Q4_K, GGMLType.BF16, GGMLType.Q2_K, GGMLType.Q3_K])
def test_a_host_quantised_model_uploads_its_bytes(driver, wt):
    m = create_model(PRESETS["tiny"], wt, seed=4)
    gpu = GpuBackend(driver, E.EventBus(), RuntimeOptions())
    try:
        load_model(m, gpu)
        for t in m.tensors():
            got = gpu.tensor_get(t.data, t.nbytes())
            if t.name.startswith("cache_"):
                assert not got.any()
            elif t.name in ("blk.2.ffn_up.weight", "blk.2.ffn_down.weight", "output_norm.weight", "token_embd.weight"):
                assert np.array_equal(got, np.frombuffer(m.host[t.name].tobytes(), np.uint8)), t.name
        assert m.host.n_drawn > 0                        # the new types were drawn on the host
    finally:
        gpu.close()


@pytest.mark.parametrize("wtype", ["q4_k", "q4_0", "bf16", "q2_k", "q3_k_m", "q4_1", "iq4_nl", "iq4_xs"])
def test_a_host_quantised_preset_runs_on_the_gpu_as_on_the_simulator(driver, tmp_path, wtype):
    """tiny in wtype (Q4_K: its ffn_down falls back to Q5_0, IQ4_XS's to IQ4_NL) on CUDA: oracle within its
    bound, replays equal to eager, the decisions of the simulated run; an exported file of it decides as the preset."""
    from graphdiag.cli.main import main
    from graphdiag.config import resolve
    from graphdiag.runner import run
    from support.decisions import decision_stream, first_difference
    base = {"model": "tiny", "wtype": wtype, "steps": 8, "prompt_tokens": 16, "oracle": True, "verify": True}
    run(resolve({**base, "backend": "cuda", "steps": 1, "oracle": False, "verify": False}, environ={}))  # warm
    gpu = run(resolve({**base, "backend": "cuda"}, environ={}))
    sim = run(resolve({**base, "backend": "sim"}, environ={}))
    checks = [c for c in gpu.events if isinstance(c, E.OracleCheck)]
    assert checks and all(c.ok for c in checks), [(c.step, c.rel_err) for c in checks if not c.ok]
    assert all(v.ok for v in gpu.events if isinstance(v, E.VerifyResult))
    print(f"tiny {wtype} on CUDA: oracle max rel err {max(c.rel_err for c in checks):.3g}")
    a, b = decision_stream(sim.events), decision_stream(gpu.events)
    assert a == b, first_difference(a, b)
    path = tmp_path / f"tiny-{wtype}.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", wtype, str(path)]) == 0
    as_file = {k: v for k, v in base.items() if k != "wtype"}        # a file has its own types
    filed = run(resolve({**as_file, "backend": "cuda", "model": str(path)}, environ={}))
    assert decision_stream(filed.events) == a and filed.tokens == gpu.tokens

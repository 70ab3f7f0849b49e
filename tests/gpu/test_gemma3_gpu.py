"""Gemma 3 on the H200: the gemma3-tiny preset and a tiny generated gemma3 GGUF (head_dim 32/128, one KV head,
the iSWA cache) run on CUDA with --verify and --oracle, and decide as the simulated driver does."""

import pytest

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.runner import run
from support.decisions import decision_stream, first_difference
from support.gemma3_gguf import TinyGemma, write_tiny_gemma3

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]
pytest.importorskip("gguf")


def _checked(result):
    checks = [c for c in result.events if isinstance(c, E.OracleCheck)]
    assert checks and all(c.ok for c in checks), [(c.step, c.rel_err) for c in checks if not c.ok]
    verify = [v for v in result.events if isinstance(v, E.VerifyResult)]
    assert verify and all(v.ok for v in verify)


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_a_tiny_gemma3_file_runs_on_cuda_and_decides_as_the_sim(tmp_path, wtype):
    path = write_tiny_gemma3(tmp_path / f"g-{wtype}.gguf", TinyGemma(wtype=wtype))
    base = {"model": str(path), "steps": 12, "prompt_tokens": 30, "oracle": True, "verify": True}
    cuda = run(resolve({**base, "backend": "cuda"}, environ={}))
    _checked(cuda)
    sim = run(resolve({**base, "backend": "sim"}, environ={}))
    a, b = decision_stream(sim.events), decision_stream(cuda.events)
    assert a == b, first_difference(a, b)


def test_the_gemma3_preset_past_its_window_on_cuda():
    """gemma3-tiny: head_dim 128, 140 + 10 positions over a 128-position window."""
    _checked(run(resolve({"backend": "cuda", "model": "gemma3-tiny", "steps": 10, "prompt_tokens": 140,
                          "oracle": True, "verify": True}, environ={})))


@pytest.mark.parametrize("name", ["swa-mask-stops-growing", "swa-full"])
def test_the_swa_scenarios_hold_on_cuda(name):
    from graphdiag.report.analysis.summary import summarize
    from graphdiag.report.record import RunHeader
    from graphdiag.scenario import check_expectations, load_scenario
    sc = load_scenario(name)
    r = run(resolve({"backend": "cuda"}, scenario=sc.run, environ={}), scenario=sc)
    assert check_expectations(sc, summarize(RunHeader.from_dict(r.header), r.events)) == []

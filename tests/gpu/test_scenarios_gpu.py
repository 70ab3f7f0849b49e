"""Every shipped scenario on the H200: the same expectations as on the simulated driver, plus the oracle."""

import pytest

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.report.analysis.summary import summarize
from graphdiag.runner import run
from graphdiag.scenario import check_expectations, list_scenarios

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]


@pytest.mark.parametrize("scenario", list_scenarios(), ids=lambda s: s.name)
def test_scenario_on_gpu(scenario):
    verify = scenario.name.startswith("fault-")      # the fault scenarios with --verify --oracle (issue 25)
    cfg = resolve({"backend": "cuda", "oracle": True, "verify": verify}, scenario.run, environ=scenario.environ({}))
    r = run(cfg, scenario)
    assert r.header["backend"] == "cuda"
    assert check_expectations(scenario, summarize(r.header, r.events)) == []
    if any(isinstance(e, E.ConcurrentRace) for e in r.events):
        # regions whose streams share bytes, as llama.cpp's do with GGML_CUDA_GRAPH_OPT=1 (ggml-alloc hands Q's
        # freed mat-mul to K's rope): the race is named, and the logits come out wrong as llama.cpp's tokens
        # did (commit 7fcb707; tests/integration/test_concurrent_regions.py)
        assert "race" in scenario.description
    else:
        assert all(c.ok for c in r.events if isinstance(c, E.OracleCheck)), r.failures
    assert all(v.ok for v in r.events if isinstance(v, E.VerifyResult)), r.failures

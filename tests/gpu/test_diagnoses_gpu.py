"""Issue 12 on the GPU: the thread scenarios with --verify and --oracle, graph memory measured per key."""

import pytest

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.report.graph_memory import CUDA_MEASURED
from graphdiag.report.summary import summarize
from graphdiag.runner import run
from graphdiag.scenario import check_expectations, load_scenario

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]

THREADS = ["speculative-decoding", "speculative-draft-arena", "graph-growth-changing-pointers",
           "pool-flush-stale-pointer", "moe-graphs-silently-disabled", "update-refusal-flood"]


@pytest.mark.parametrize("name", THREADS)
def test_thread_scenario_on_cuda_with_graph_memory_measured(name):
    sc = load_scenario(name)
    cfg = resolve({"backend": "cuda", "verify": True, "oracle": True}, sc.run, environ=sc.environ({}))
    r = run(cfg, sc)
    s = summarize(r.header, r.events)
    assert r.header["backend"] == "cuda" and r.failures == []
    assert check_expectations(sc, s) == []
    assert all(c.ok for c in r.events if isinstance(c, (E.OracleCheck, E.VerifyResult)))
    gm = s.graph_memory
    assert gm.source == CUDA_MEASURED
    for k in gm.keys:                       # every key that instantiated holds measured device memory
        assert k.executables == 0 or k.peak_bytes > 0, (name, k)
    print(f"{name}: graph memory peak {gm.peak_bytes} B, end {gm.end_bytes} B, "
          + ", ".join(f"{k.key}: {k.executables} exec peak {k.peak_bytes} B" for k in gm.keys))

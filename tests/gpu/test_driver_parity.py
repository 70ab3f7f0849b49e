"""The simulated driver is the CUDA driver's twin: the same run takes the same decisions on both.

Every shipped scenario, plus chunk sizes 1 and 8, concurrent streams, graph reuse off and MoE expert
offload, is run on the simulated driver and on the H200 with identical settings, and the decision streams
(every decision event without times or driver wording; see tests/support/decisions.py) must be equal."""

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphdiag.config import resolve
from graphdiag.runner import run
from graphdiag.scenario import list_scenarios
from support.decisions import decision_stream, first_difference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]

EXTRA = {
    "chunk-1": {"chunk_size": 1, "steps": 6},
    "chunk-8": {"chunk_size": 8, "steps": 8, "batch": 2},
    "concurrent-streams": {"concurrent_streams": True, "steps": 8, "chunk_size": 16},
    "reuse-off": {"reuse_disabled": True, "steps": 8},
    "moe-offload": {"model": "moe-tiny", "n_cpu_moe": 2, "steps": 8},
    "batch-1-2-8-9": {"steps": 24, "prompt_tokens": 1},
}
TIMELINES = {"batch-1-2-8-9": [{"at_step": 6, "batch": 2}, {"at_step": 12, "batch": 8},
                               {"at_step": 30, "batch": 9}]}


def _report(name: str, sim, cuda) -> str:
    """The first difference; with $GRAPHDIAG_PARITY_DIR set, both streams are written there too."""
    msg = first_difference(sim, cuda)
    out = os.environ.get("GRAPHDIAG_PARITY_DIR")
    if out and msg:
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(Path(out) / "parity.txt", "a") as f:
            f.write(f"== {name}: {msg}\n")
            i = next((k for k, (x, y) in enumerate(zip(sim, cuda)) if x != y), min(len(sim), len(cuda)))
            for k in range(max(0, i - 3), min(i + 4, max(len(sim), len(cuda)))):
                f.write(f"  sim  {k}: {dict(sim[k]) if k < len(sim) else '-'}\n")
                f.write(f"  cuda {k}: {dict(cuda[k]) if k < len(cuda) else '-'}\n")
    return msg


def _both(settings, scenario):
    out = []
    for backend in ("sim", "cuda"):
        cfg = resolve({**settings, "backend": backend}, scenario.run if hasattr(scenario, "run") else None,
                      environ=scenario.environ({}) if hasattr(scenario, "environ") else {})
        r = run(cfg, scenario)
        assert r.header["backend"] == backend
        out.append(decision_stream(r.events))
    return out


@pytest.mark.parametrize("scenario", list_scenarios(), ids=lambda s: s.name)
def test_scenario_decides_identically_on_both_drivers(scenario):
    sim, cuda = _both({}, scenario)
    assert sim == cuda, _report(scenario.name, sim, cuda)


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_configuration_decides_identically_on_both_drivers(name):
    sc = SimpleNamespace(name=name, timeline=TIMELINES.get(name, []))
    sim, cuda = _both({"prompt_tokens": 8, **EXTRA[name]}, sc)
    assert sim == cuda, _report(name, sim, cuda)


def test_a_refused_update_names_the_same_node_on_both_drivers():
    """tiny F16, fusion off, 1 -> 2 sequences: the mat-muls leave mmvf (PDL) for MMF (plain), the update is
    refused (TOPOLOGY_CHANGED) and both drivers name the same node: the last, "node 85 of 86" (H100,
    2026-12-06), met first walking back from the exit node (backends/drivers/sim_update.py)."""
    from graphdiag import events as E
    named = []
    for backend in ("sim", "cuda"):
        cfg = resolve({"backend": backend, "model": "tiny", "wtype": "f16", "prompt_tokens": 1, "steps": 14,
                       "batch": 1, "chunk_size": 0}, environ={"GGML_CUDA_DISABLE_FUSION": "1"})
        r = run(cfg, SimpleNamespace(name="pdl-refusal", timeline=[{"at_step": 7, "batch": 2}]))
        refused = [e for e in r.events if isinstance(e, E.UpdateRefused)]
        assert [(e.step, e.reason) for e in refused] == [(8, "TOPOLOGY_CHANGED")], backend
        named.append(re.match(r"node \d+ of \d+: kernel", refused[0].error_node)[0])
    assert named == ["node 85 of 86: kernel"] * 2

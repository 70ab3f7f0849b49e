"""Upstream parity on the H200 (issue 28): every shipped scenario real llama.cpp can express decides the same
in graphdiag and in llama.cpp 0c1e57098 (llama-cpp-python 0.3.36) on the same GGUF — per step and graph
entry: uid hits, eager / capture / replay, new / updated / refused+re-instantiated executables, warmup
transitions, evictions of captured entries, graph nodes per captured graph (report/analysis/observed_diff.py).

graphdiag runs in this process on CUDA with one graph per split (--chunk-size 0: upstream has no chunks);
llama.cpp runs in a `graphdiag llama` child per scenario (tests/support/llama_parity.py). The known
differences are exact predicates (report/analysis/known.py), each excusing one pair of decisions and hiding
nothing after it; the test fails on any other difference, and on a known one that no longer occurs in a
session where every case ran (the list stays honest). The iSWA scenarios run on the exported gemma3-tiny,
their `sim_mode` (graphdiag's own knob) dropped for both runs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from graphdiag.errors import GraphdiagError
from graphdiag.report.analysis.known import unmet
from graphdiag.scenario import list_scenarios
from tests.support.llama_parity import check, files, for_llama, known_met, llama_cpp  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]

# the presets exported as GGUF files; moe-tiny as llama's MoE (Mixtral-style: its router weights normalised,
# the top-k router fused with the norm), which also runs the MoE scenarios (MOE_SCENARIOS), as does
# qwen3moe-tiny exported as qwen3moe (MOE_FILES); gemma3-tiny as Gemma 3 (iSWA) for the sliding-window
# scenarios (ISWA_SCENARIOS)
MODELS = [("tiny", "f16"), ("tiny", "q8_0"), ("1b", "f16"), ("1b", "q8_0"), ("moe-tiny", "f16")]
MOE_FILES = [("moe-tiny", "llama"), ("qwen3moe-tiny", "qwen3moe"), ("gpt-oss-tiny", "gpt-oss")]  # (preset, arch), F16


def _expressible(family: str) -> list[str]:
    """Shipped scenarios llama.cpp can express whose model is of `family` ("" dense llama, "moe", "gemma3"),
    sim_mode aside (dropped for both runs: llama_parity.for_llama)."""
    from graphdiag.llama.command import resolve_llama
    from graphdiag.llama.expressible import check_expressible
    out, folder = [], Path(tempfile.mkdtemp(prefix="parity-scenarios-"))
    for sc in list_scenarios():
        model = str(sc.run.get("model", ""))
        if next((f for f in ("moe", "gemma3") if model.startswith(f)), "") != family:
            continue
        try:
            cfg, s = resolve_llama("x.gguf", {}, for_llama(sc.name, folder))
            check_expressible(cfg, s)
        except GraphdiagError:
            continue
        out.append(sc.name)
    return out


SCENARIOS = _expressible("")
MOE_SCENARIOS = _expressible("moe")
ISWA_SCENARIOS = _expressible("gemma3")


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("model,wtype", MODELS)
def test_llama_cpp_decides_as_graphdiag(model, wtype, scenario, llama_cpp, files, tmp_path):
    check(f"{model} {wtype}", files(model, wtype), scenario, tmp_path)


@pytest.mark.parametrize("scenario", MOE_SCENARIOS)
@pytest.mark.parametrize("model,arch", MOE_FILES)
def test_llama_cpp_decides_as_graphdiag_on_the_moe_scenarios(model, arch, scenario, llama_cpp, files, tmp_path):
    check(f"{model} f16", files(model, "f16", arch), scenario, tmp_path)


@pytest.mark.parametrize("wtype", ["q8_0", "q4_k"])
@pytest.mark.parametrize("model,arch", MOE_FILES)
def test_quantised_moe_decides_as_graphdiag_at_every_width(model, arch, wtype, llama_cpp, files, tmp_path):
    """Issue 50: MUL_MAT_ID's decisions (mat-vec, MMQ, the sorted path; needs-sync) at 1, 2, 4, 8, 16 and 32
    sequences on quantised experts; the F16 files run the same scenario among MOE_SCENARIOS."""
    check(f"{model} {wtype}", files(model, wtype, arch), "moe-sequences-sweep", tmp_path)


@pytest.mark.parametrize("scenario", ISWA_SCENARIOS)
def test_llama_cpp_decides_as_graphdiag_on_the_iswa_scenarios(scenario, llama_cpp, files, tmp_path):
    check("gemma3-tiny f16", files("gemma3-tiny", "f16", "gemma3"), scenario, tmp_path)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gemma3_decides_as_graphdiag(scenario, request, llama_cpp, tmp_path):
    try:
        path = request.getfixturevalue("gemma3_file")
    except pytest.FixtureLookupError:
        pytest.skip("no gemma3_file fixture (tests/conftest.py)")
    if path is None:
        pytest.skip("no Gemma 3 file")
    check("gemma3", path, scenario, tmp_path)


def parity_cases() -> set[str]:
    """The cases of the fixed models, as check() names them ("label scenario"); the real Gemma 3 file's aside
    (it may be absent)."""
    return ({f"{m} {w} {s}" for m, w in MODELS for s in SCENARIOS}
            | {f"{m} f16 {s}" for m, _ in MOE_FILES for s in MOE_SCENARIOS}
            | {f"{m} {w} moe-sequences-sweep" for m, _ in MOE_FILES for w in ("q8_0", "q4_k")}
            | {f"gemma3-tiny f16 {s}" for s in ISWA_SCENARIOS})


def test_known_differences_still_occur():
    """Runs last (file order): once every parity case of the fixed models ran in this session and compared
    equal, each known difference was excused in one of those cases. Only those cases count: a skipped or
    failed case, another file's comparisons (the differential test's timelines) or the Gemma 3 file's do not."""
    cases = parity_cases()
    done, met = known_met(cases)
    if met is None:
        pytest.skip(f"{done} of {len(cases)} parity cases compared equal in this session")
    assert not unmet(met), f"known differences that no longer occur in the parity cases: {unmet(met)}"

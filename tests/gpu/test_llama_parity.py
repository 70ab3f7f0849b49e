"""Upstream parity on the H200 (issue 28): every shipped scenario real llama.cpp can express decides the same
in graphdiag and in llama.cpp 0c1e57098 (llama-cpp-python 0.3.36) on the same GGUF — per step and graph
entry: eager / capture / replay, new / updated / refused+re-instantiated executables, warmup transitions,
evictions of captured entries, graph nodes per captured graph (report/analysis/observed_diff.py).

graphdiag runs in this process on CUDA with one graph per split (--chunk-size 0: upstream has no chunks);
llama.cpp runs in a `graphdiag llama` child per scenario (ggml reads its environment once per process, and
each scenario gets a fresh eviction clock). KNOWN lists the differences that cannot match, each with why;
the test fails on any other, and on a known one that no longer occurs (the list stays honest).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.errors import GraphdiagError
from graphdiag.report.analysis.observed_diff import diff_observed
from graphdiag.report.record.header import RunHeader
from graphdiag.report.record.read import read_record
from graphdiag.runner import run
from graphdiag.scenario import list_scenarios, load_scenario

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]

# name -> {"models": models it applies to ("*": all), "scenarios": (...) or "*", "what": the kind of decision
# (observed_diff.Decision.what) it concerns, "decision": a substring of the differing decision (either side),
# "why": why it cannot match}. A matched entry's kind is left out and the comparison runs again, so a known
# difference never hides the decisions after it.
KNOWN: dict[str, dict] = {
    "graph-nodes": {
        "models": "*", "scenarios": "*", "what": "capture", "decision": "graph nodes",
        "why": "graphdiag's captured graph has 1 node more than llama.cpp's (tiny F16: 58 vs 57 kernels at 1 "
               "token, 73 vs 72 at 2), named by the kernel names of each captured graph "
               "(cuGraphKernelNodeGetParams + cuFuncGetName on both sides, H200 2026-12-02): llama.cpp keeps "
               "the token embedding on the CPU (llama-model.cpp: the input layer always stays there), so its "
               "GET_ROWS is in a CPU split, where graphdiag keeps it on the GPU (README). The recording of "
               "2026-12-02 (tests/data/llama: 59 vs 57, 74 vs 72) had a second extra node, layer 0's CPY of the "
               "KQ mask to F16; graphdiag now builds the mask as 0c1e57098's build_attn_inp_kq_mask does (an F16 "
               "input, no cast), so that one is gone",
    },
    "cublas-split-k": {
        "models": ("moe-tiny",), "scenarios": ("fusion-boundary",), "what": "executable",
        "decision": "TOPOLOGY_CHANGED",
        "why": "llama.cpp's MoE router mat-mul (ffn_gate_inp, F32 weights) leaves its float mat-vec above 3 "
               "columns (ggml_cuda_should_use_mmvf on Ampere+) for cuBLAS, which on the H200 ran it as a split-K "
               "GEMM (cutlass s1688gemm + cublasLt splitKreduce_kernel) at 8 and 9 tokens; the graph captured "
               "at 9 tokens did not update the one captured at 8 (TOPOLOGY_CHANGED) though both hold 88 kernels "
               "(tests/data/llama/kernels-moe-f16-fusion-boundary.json, H200 2026-12-04): what cuBLAS changed "
               "between them is inside cuBLAS. graphdiag's stand-in for the cuBLAS path is one kernel whose "
               "graph updates in place (tests/integration/test_captured_kernels.py counts the kernels)",
    },
}

# the presets exported as GGUF files; moe-tiny as llama's MoE (Mixtral-style: its router weights normalised,
# the top-k router fused with the norm), which also runs the MoE scenarios (MOE_SCENARIOS)
MODELS = [("tiny", "f16"), ("tiny", "q8_0"), ("1b", "f16"), ("1b", "q8_0"), ("moe-tiny", "f16")]
SEEN: set[str] = set()


def _expressible(moe: bool = False) -> list[str]:
    """Shipped scenarios llama.cpp can express on a dense llama file, or (`moe`) the MoE ones, which need a MoE
    GGUF (the dense ones run on it as well)."""
    from graphdiag.llama.command import resolve_llama
    from graphdiag.llama.expressible import check_expressible
    out = []
    for sc in list_scenarios():
        if str(sc.run.get("model", "")).startswith("moe") != moe:
            continue
        try:
            cfg, s = resolve_llama("x.gguf", {}, sc.name)
            check_expressible(cfg, s)
        except GraphdiagError:
            continue
        out.append(sc.name)
    return out


SCENARIOS = _expressible()
MOE_SCENARIOS = _expressible(moe=True)


@pytest.fixture(scope="module")
def llama_cpp():
    from graphdiag.llama.driver import load_llama_cpp
    try:
        ll = load_llama_cpp()
    except GraphdiagError as e:
        pytest.skip(str(e))
    if not ll.llama_supports_gpu_offload():
        pytest.skip("llama_cpp is a CPU-only build")
    return ll


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder, made = tmp_path_factory.mktemp("parity"), {}

    def get(model: str, wtype: str):
        if (model, wtype) not in made:
            p = folder / f"{model}-{wtype}.gguf"
            assert main(["export-gguf", "--model", model, "--wtype", wtype, str(p)]) == 0
            made[(model, wtype)] = p
        return made[(model, wtype)]
    return get


def _graphdiag(path, scenario: str):
    sc = load_scenario(scenario)
    cfg = resolve({"backend": "cuda", "model": str(path), "chunk_size": 0, "nvtx": False}, sc.run,
                  environ=sc.environ({}), env_origins=sc.env_origins())
    r = run(cfg, sc)
    return RunHeader.from_dict(r.header), r.events


def _llama(path, scenario: str, tmp_path):
    rec = tmp_path / f"{path.stem}-{scenario}.llama.jsonl"
    p = subprocess.run([sys.executable, "-m", "graphdiag", "llama", str(path), "--scenario", scenario, "--events",
                        str(rec), "--raw", str(rec.with_suffix(".raw.jsonl")), "--json"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode in (0, 1), p.stderr[-2000:]       # 1: an observable expectation failed; compared anyway
    return read_record(rec)


def _known(model: str, scenario: str, d) -> str | None:
    _, _, a, b = d.first
    lines = " | ".join(x.line() for x in (a, b) if x is not None)
    what = (a or b).what
    for name, k in KNOWN.items():
        ours = k["models"] == "*" or any(model == m or model.startswith(m + " ") for m in k["models"])
        if ours and (k["scenarios"] == "*" or scenario in k["scenarios"]) and k["what"] == what \
                and k["decision"] in lines:
            return name
    return None


def _compare(model: str, scenario: str, ours, theirs) -> None:
    """Equal, or equal once the known differences met are left out (each recorded in SEEN)."""
    skip: tuple[str, ...] = ()
    while True:
        d = diff_observed(ours, theirs, ("graphdiag", "llama.cpp"), skip=skip)
        assert not d.steps_only_in, d.to_json()
        print(f"{model} {scenario}: {d.decisions_compared} decisions over {d.steps_compared} steps, "
              f"{'equal' if d.equal else 'first difference at step ' + str(d.first[0])}"
              + (f" (without {', '.join(skip)})" if skip else ""))
        if d.equal:
            return
        name = _known(model, scenario, d)
        assert name is not None, d.to_json()
        SEEN.add(name)
        skip += (KNOWN[name]["what"],)


def _check(model, wtype, scenario, files, tmp_path):
    path = files(model, wtype)
    _compare(f"{model} {wtype}", scenario, _graphdiag(path, scenario), _llama(path, scenario, tmp_path))


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("model,wtype", MODELS)
def test_llama_cpp_decides_as_graphdiag(model, wtype, scenario, llama_cpp, files, tmp_path):
    _check(model, wtype, scenario, files, tmp_path)


@pytest.mark.parametrize("scenario", MOE_SCENARIOS)
def test_llama_cpp_decides_as_graphdiag_on_the_moe_scenarios(scenario, llama_cpp, files, tmp_path):
    _check("moe-tiny", "f16", scenario, files, tmp_path)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gemma3_decides_as_graphdiag(scenario, request, llama_cpp, tmp_path):
    try:
        path = request.getfixturevalue("gemma3_file")
    except pytest.FixtureLookupError:
        pytest.skip("no gemma3_file fixture (tests/conftest.py)")
    if path is None:
        pytest.skip("no Gemma 3 file")
    _compare("gemma3", scenario, _graphdiag(path, scenario), _llama(path, scenario, tmp_path))


def test_known_differences_still_occur(request):
    """Runs last (file order): each KNOWN entry was met by one of this session's parity runs."""
    ran = [i for i in request.session.items if i.name.startswith(("test_llama_cpp_decides", "test_gemma3_decides"))]
    if len(ran) < len(MODELS) * len(SCENARIOS) + len(MOE_SCENARIOS):
        pytest.skip("not every parity case ran in this session")
    assert set(KNOWN) <= SEEN, f"known differences that no longer occur: {sorted(set(KNOWN) - SEEN)}"

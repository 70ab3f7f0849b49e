"""graphdiag against real llama.cpp 0c1e57098 on timelines no one wrote (issue 46): for each exported model
file, N seeded timelines (graphdiag/llama/timelines.py: sequences joining and leaving, alternations, prefills
past n_ubatch, idle gaps, fusion / reuse / PDL off) run on graphdiag (CUDA in this process, one graph per
split) and on llama.cpp (`graphdiag llama` in a child), compared decision by decision under the known
differences (report/analysis/known.py), with the parity test's machinery (tests/support/llama_parity.py).

GRAPHDIAG_DIFF_SEEDS=N: seeds per file (default 2), drawn anew each session (the same in every pytest -n
worker) and printed;
GRAPHDIAG_DIFF_SEED=7,19: these seeds instead; GRAPHDIAG_DIFF_MODELS=tiny-qwen3-q4_k,...: only these files.
A failure prints the seed, the file and the command that replays exactly that case.
"""

from __future__ import annotations

import os
import random
import shlex

import pytest

from graphdiag.llama.timelines import write_timeline
from tests.support.llama_parity import check, files, llama_cpp  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]

WTYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k")
# the weight types of issue 50 and the mixes people download (llama's tiny only): Q4_1, llama.cpp's Q2_K and
# Q3_K_M mixes, IQ4_NL, IQ4_XS, Q4_K_M (each with llama.cpp's fallbacks where rows are no multiple of 256)
FILE_TYPES = ("q4_1", "q2_k", "q3_k_m", "iq4_nl", "iq4_xs", "q4_k_m")
# (preset, arch, weight type): the dense preset as each architecture at each weight type, llama's MoE, qwen3moe
# (Qwen3-30B-A3B's: top 4 of 16 experts, GQA, head_dim 128), gpt-oss (sinks, iSWA, MXFP4 experts) and the
# Gemma 3 preset exported as gemma3 (iSWA)
FILES = ([("tiny", arch, w) for arch in ("llama", "qwen2", "qwen3") for w in WTYPES]
         + [("tiny", "llama", w) for w in FILE_TYPES]
         + [("moe-tiny", "llama", w) for w in ("f16", "q8_0", "q4_k")]
         + [("qwen3moe-tiny", "qwen3moe", w) for w in ("f16", "q8_0", "q4_k")]
         + [("gpt-oss-tiny", "gpt-oss", w) for w in ("f16", "mxfp4_moe")]
         + [("gemma3-tiny", "gemma3", w) for w in ("f16", "q4_k")])


def _seeds() -> list[int]:
    given = os.environ.get("GRAPHDIAG_DIFF_SEED", "").strip()
    if given:
        return [int(s) for s in given.replace(",", " ").split()]
    n = int(os.environ.get("GRAPHDIAG_DIFF_SEEDS", "2"))
    # under pytest -n every worker collects: each must draw the same seeds (xdist gives them one run id)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    rng = random.Random(run) if run else random.SystemRandom()
    return [rng.randrange(2**31) for _ in range(n)]


def _files() -> list:
    """One param per file, its id the label GRAPHDIAG_DIFF_MODELS takes; the Gemma 3 fixture file last."""
    only = {s.strip() for s in os.environ.get("GRAPHDIAG_DIFF_MODELS", "").split(",") if s.strip()}
    out = [pytest.param(*f, id="-".join(f)) for f in FILES if not only or "-".join(f) in only]
    return out + ([pytest.param("gemma3", "gemma3", "", id="gemma3")] if not only or "gemma3" in only else [])


SEEDS = _seeds()
print(f"test_llama_differential seeds: {SEEDS}")


def _replay(label: str, seed: int) -> str:
    return (f"GRAPHDIAG_DIFF_SEED={seed} GRAPHDIAG_DIFF_MODELS={label} python -m pytest -p no:cacheprovider -s "
            f"tests/gpu/test_llama_differential.py  # timeline: "
            f"python -c {shlex.quote(f'from graphdiag.llama.timelines import *; print(to_toml(timeline({seed})))')}")


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("model,arch,wtype", _files())
def test_generated_timeline_decides_as_llama_cpp(model, arch, wtype, seed, request, llama_cpp, files, tmp_path):
    if model == "gemma3":
        path = request.getfixturevalue("gemma3_file")     # skips where the file is not installed
        label = "gemma3"
    else:
        path, label = files(model, wtype, arch), f"{model}-{arch}-{wtype}"
    scenario = write_timeline(seed, tmp_path, model=str(path))
    print(f"{label} seed {seed}: {scenario}")
    check(label, path, str(scenario), tmp_path, replay=_replay(label, seed))

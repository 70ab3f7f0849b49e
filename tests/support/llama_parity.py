"""What the GPU tests that hold graphdiag against real llama.cpp share (tests/gpu/test_llama_parity.py, the
shipped scenarios; tests/gpu/test_llama_differential.py, generated timelines): exported model files, graphdiag's
run in this process on CUDA with one graph per split, llama.cpp's in a `graphdiag llama` child (ggml reads its
environment once per process, and each run gets a fresh eviction clock), and the comparison under the known
differences (report/analysis/known.py); RESULTS keeps, per case that compared equal, the known differences it
excused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.errors import GraphdiagError
from graphdiag.report.analysis.known import ModelFacts, diff_known, model_facts
from graphdiag.report.record.header import RunHeader
from graphdiag.report.record.read import read_record
from graphdiag.runner import run
from graphdiag.scenario import load_scenario

# "label scenario" of each case of this session whose comparison ran to its end and was equal -> the names of the
# known differences it excused (a failed or skipped case has no entry)
RESULTS: dict[str, set[str]] = {}


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
    """files(model, wtype, arch="llama") -> the exported GGUF (seed 0), made once per module."""
    folder, made = tmp_path_factory.mktemp("gguf"), {}

    def get(model: str, wtype: str, arch: str = "llama") -> Path:
        if (model, wtype, arch) not in made:
            p = folder / f"{model}-{arch}-{wtype}.gguf"
            assert main(["export-gguf", "--model", model, "--wtype", wtype, "--arch", arch, str(p)]) == 0
            made[(model, wtype, arch)] = p
        return made[(model, wtype, arch)]
    return get


def for_llama(scenario: str | Path, folder: Path) -> str:
    """The scenario as both runs take it: a copy without [run] sim_mode where it has one (graphdiag's own knob
    for its simulated driver: ignored on CUDA, refused by `graphdiag llama`), else as given."""
    sc = load_scenario(scenario)
    if "sim_mode" not in sc.run:
        return str(scenario)
    text = sc.path.read_text(encoding="utf-8").splitlines(keepends=True)
    line = sc.lines["run.sim_mode"]
    copy = folder / sc.path.name
    copy.write_text("".join(t for i, t in enumerate(text, 1) if i != line), encoding="utf-8")
    return str(copy)


def graphdiag_run(path: Path, scenario: str) -> tuple:
    sc = load_scenario(scenario)
    cfg = resolve({"backend": "cuda", "model": str(path), "chunk_size": 0, "nvtx": False}, sc.run,
                  environ=sc.environ({}), env_origins=sc.env_origins())
    r = run(cfg, sc)
    return RunHeader.from_dict(r.header), r.events


def llama_run(path: Path, scenario: str, folder: Path) -> tuple:
    rec = folder / f"{path.stem}-{Path(scenario).stem}.llama.jsonl"
    p = subprocess.run([sys.executable, "-m", "graphdiag", "llama", str(path), "--scenario", scenario, "--events",
                        str(rec), "--raw", str(rec.with_suffix(".raw.jsonl")), "--json"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode in (0, 1), p.stderr[-2000:]       # 1: an observable expectation failed; compared anyway
    return read_record(rec)


def compare(label: str, facts: ModelFacts, scenario: str, ours: tuple, theirs: tuple, replay: str = "",
            case: str = "") -> None:
    """Equal once the known differences excuse their pairs (each pair alone); RESULTS[case] records it (case:
    "label scenario" unless given)."""
    d = diff_known(ours, theirs, facts)
    excused = ", ".join(f"{x['name']} at step {x['step']}" for x in d.excused)
    print(f"{label} {Path(scenario).stem}: {d.decisions_compared} decisions over {d.steps_compared} steps, "
          f"{'equal' if d.equal else 'first difference at step ' + str(d.first[0]) if d.first else 'steps differ'}"
          + (f" (excused: {excused})" if excused else ""))
    assert d.equal, d.to_json() + (f"\nreplay: {replay}" if replay else "")
    RESULTS[case or f"{label} {scenario}"] = {x["name"] for x in d.excused}


def known_met(cases: set[str]) -> tuple[int, set[str] | None]:
    """How many of `cases` compared equal in this session, and the known differences those excused (None until
    every one of them did: only executed cases count, and no other comparison)."""
    done = cases & RESULTS.keys()
    return len(done), (set().union(*(RESULTS[c] for c in cases)) if done == cases else None)


def check(label: str, path: Path, scenario: str, folder: Path, replay: str = "") -> None:
    """Both runs of one scenario on one file, compared; the case is "label scenario" as given (before for_llama
    may copy the scenario file)."""
    case = f"{label} {scenario}"
    scenario = for_llama(scenario, folder)
    compare(label, model_facts(path, label), scenario, graphdiag_run(path, scenario),
            llama_run(path, scenario, folder), replay, case)

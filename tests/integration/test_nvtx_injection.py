"""NVTX ranges checked through a real NVTX injection library (no GPU, no Nsight Systems needed).

The test builds `nvtx_log_inject.c` with the system gcc against the NVTX v3 headers of the `nvidia-nvtx`
wheel (the project's `test` extra), then runs an event sequence through NvtxSink in a subprocess with
NVTX_INJECTION64_PATH set (NVTX picks its tool once, at its first call) and reads the library's log.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent

SCRIPT = textwrap.dedent("""
    from graphdiag import events as E
    from graphdiag.report.sinks.nvtx_sink import NvtxSink
    bus = E.EventBus()
    sink = bus.subscribe(NvtxSink(), spans=True)
    print("enabled", sink.enabled)
    with bus.span("step", "step", payload=3, step=3):
        with bus.span("split compute", "split/compute", payload=17, step=3, split=0, uid=17):
            with bus.span("chunk capture", "graph/capture", payload=0):
                pass
            with bus.span("chunk capture", "graph/capture", payload=1):
                bus.emit(E.UpdateRefused(step=3, chunk=1, reason="TOPOLOGY_CHANGED"))
            bus.emit(E.WarmupTransition(step=3, uid=17, from_state="warm", to_state="cold"))
            bus.emit(E.ReplayLaunched(step=3, n_chunks=2))      # not marked
        with bus.span("replay", "graph/replay", payload=2):
            pass
    try:
        with bus.span("step", "step", payload=4, step=4):
            raise RuntimeError("a step that fails still pops its range")
    except RuntimeError:
        pass
""")


def nvtx_include_dir() -> Path | None:
    """The folder holding nvtx3/nvToolsExt.h: the nvidia-nvtx wheel, the nvtx package, or a CUDA toolkit."""
    roots = []
    spec = importlib.util.find_spec("nvidia")
    if spec and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    spec = importlib.util.find_spec("nvtx")
    if spec and spec.origin:
        roots.append(Path(spec.origin).parent)
    for root in roots:
        for header in sorted(root.glob("**/nvtx3/nvToolsExt.h")):
            return header.parent.parent
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    return cuda if (cuda / "nvtx3" / "nvToolsExt.h").exists() else None


@pytest.fixture(scope="module")
def injection_lib(tmp_path_factory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: cannot build the NVTX injection library")
    include = nvtx_include_dir()
    assert include is not None, "NVTX headers not found: pip install nvidia-nvtx (the project's test extra)"
    lib = tmp_path_factory.mktemp("nvtx") / "libnvtx_log_inject.so"
    subprocess.run([gcc, "-O2", "-shared", "-fPIC", f"-I{include}", str(HERE / "nvtx_log_inject.c"),
                    "-o", str(lib)], check=True, capture_output=True, text=True)
    return lib


def run_traced(tmp_path: Path, lib: Path | None, script: str = SCRIPT) -> tuple[str, list[str]]:
    """Run SCRIPT in a fresh interpreter (with or without the injection); return its stdout and log lines."""
    log = tmp_path / "nvtx.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if lib is not None:
        env |= {"NVTX_INJECTION64_PATH": str(lib), "NVTX_LOG": str(log)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return out, (log.read_text().splitlines() if log.exists() else [])


def ranges(log: list[str]) -> list[tuple[int, str]]:
    """(depth, 'PUSH message|cat=..|payload=..' or 'MARK ...') in order; asserts pops balance pushes."""
    depth, seen = 0, []
    for line in log:
        op, _, rest = line.partition(" ")
        if op in ("PUSH", "MARK"):
            seen.append((depth, f"{op} {rest.split(' ', 1)[1]}"))
            depth += op == "PUSH"
        elif op == "POP":
            depth -= 1
            assert depth >= 0, "pop without push"
    assert depth == 0, "ranges left open"
    return seen


def test_nvtx_ranges_nest_with_payloads(injection_lib, tmp_path):
    out, log = run_traced(tmp_path, injection_lib)
    assert "enabled True" in out
    assert log[0] == "DOMAIN graphdiag"
    cats = {line.split()[3]: line.split()[2] for line in log if line.startswith("CATEGORY")}
    assert set(cats) == {"step", "split/compute", "graph/capture", "graph/update", "graph/warmup",
                         "graph/replay"}
    c = {name: f"cat={cid}" for name, cid in cats.items()}
    assert ranges(log) == [
        (0, f"PUSH step|{c['step']}|payload=3"),
        (1, f"PUSH split compute|{c['split/compute']}|payload=17"),
        (2, f"PUSH chunk capture|{c['graph/capture']}|payload=0"),
        (2, f"PUSH chunk capture|{c['graph/capture']}|payload=1"),
        (3, f"MARK update refused: TOPOLOGY_CHANGED|{c['graph/update']}|payload=1"),
        (2, f"MARK warmup reset|{c['graph/warmup']}|payload=17"),
        (1, f"PUSH replay|{c['graph/replay']}|payload=2"),
        (0, f"PUSH step|{c['step']}|payload=4"),
    ]


def test_nvtx_strings_and_categories_registered_once(injection_lib, tmp_path):
    _, log = run_traced(tmp_path, injection_lib)
    strings = [line for line in log if line.startswith("STRING")]
    categories = [line for line in log if line.startswith("CATEGORY")]
    assert len(strings) == len(set(strings)) == 6   # step, split compute, chunk capture, replay, 2 marks
    assert len(categories) == len(set(categories))


def test_nvtx_sink_is_a_noop_without_a_tool(tmp_path):
    out, log = run_traced(tmp_path, None)
    assert "enabled False" in out
    assert log == []


RUN_SCRIPT = textwrap.dedent("""
    from graphdiag import runner
    from graphdiag.config import resolve
    from graphdiag.report.sinks.nvtx_sink import NvtxSink
    sink = NvtxSink()
    result = runner.run(resolve({"backend": "sim", "steps": 4}, environ={}), span_sinks=[sink])
    sink.close()
    print("enabled", sink.enabled, "steps", sum(e.kind == "step_finished" for e in result.events))
""")


def test_nvtx_ranges_of_a_real_run_are_balanced_and_categorised(injection_lib, tmp_path):
    out, log = run_traced(tmp_path, injection_lib, RUN_SCRIPT)
    assert "enabled True steps 5" in out
    seen = ranges(log)                                   # asserts push/pop balance
    top = [r for depth, r in seen if depth == 0]
    assert len(top) == 5 and all(r.startswith("PUSH ") for r in top)
    categories = [line.split(" ", 3)[3] for line in log if line.startswith("CATEGORY")]
    assert categories and all("/" in c for c in categories)
    strings = [line for line in log if line.startswith("STRING")]
    assert len(strings) == len(set(strings))            # each span name registered once
    assert any(depth > 0 for depth, _ in seen)          # nested scopes inside the steps

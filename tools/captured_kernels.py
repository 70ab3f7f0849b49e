"""Name the kernels of every CUDA graph graphdiag and real llama.cpp capture for one scenario on one GGUF, and
show the first capture where the two differ, by kernel count or by name (graphdiag's mapped to ggml's
identifiers: graphdiag/llama/kernel_names.py) (a parity diagnostic; needs a GPU and a CUDA llama-cpp-python).

    python tools/captured_kernels.py MODEL.gguf --scenario nkv-growth [--out DIR]

graphdiag runs in this process on CUDA with one graph per split (as the parity test runs it); llama.cpp runs
in a `graphdiag llama` child with GRAPHDIAG_WATCH_KERNEL_NAMES=1, so its raw stream names each captured
graph's kernels. Captures are compared in order, the n-th of one side with the n-th of the other.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
from pathlib import Path


def graphdiag_captures(model: str, scenario: str) -> list[list[str]]:
    from graphdiag.backends.drivers import cuda
    from graphdiag.config import resolve
    from graphdiag.runner import run
    from graphdiag.scenario import load_scenario

    captures: list[list[str]] = []
    end = cuda.CudaDriver.end_capture

    def end_capture(self, stream):
        graph = end(self, stream)
        captures.append(cuda.graph_kernel_names(graph))
        return graph

    cuda.CudaDriver.end_capture = end_capture
    try:
        sc = load_scenario(scenario)
        cfg = resolve({"backend": "cuda", "model": model, "chunk_size": 0, "nvtx": False}, sc.run,
                      environ=sc.environ({}), env_origins=sc.env_origins())
        run(cfg, sc)
    finally:
        cuda.CudaDriver.end_capture = end
    return captures


def llama_captures(model: str, scenario: str, work: Path) -> list[list[str]]:
    raw = work / f"{Path(model).stem}-{Path(scenario).stem}.llama.raw.jsonl"     # a name, or a .toml path
    rec = raw.with_name(raw.name.replace(".raw", ""))
    env = {**os.environ, "GRAPHDIAG_WATCH_KERNEL_NAMES": "1"}
    p = subprocess.run([sys.executable, "-m", "graphdiag", "llama", model, "--scenario", scenario, "--events",
                        str(rec), "--raw", str(raw)], env=env, capture_output=True, text=True, timeout=900)
    if p.returncode not in (0, 1):
        sys.exit(f"graphdiag llama failed ({p.returncode}): {p.stderr[-2000:]}")
    caps = []
    for line in raw.read_text().splitlines()[1:]:
        ev = json.loads(line)
        if ev.get("ev") == "api" and ev.get("fn") == "cudaStreamEndCapture" and "kernel_names" in ev:
            caps.append(ev["kernel_names"])
    return caps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--out", default=".", help="where NAME-SCENARIO.kernels.json goes")
    ap.add_argument("--work", default=None, help="where llama.cpp's raw stream and record go (default: --out)")
    a = ap.parse_args()
    out = Path(a.out)
    work = Path(a.work or a.out)
    for d in (out, work):
        d.mkdir(parents=True, exist_ok=True)
    ours = graphdiag_captures(a.model, a.scenario)
    theirs = llama_captures(a.model, a.scenario, work)
    (out / f"{Path(a.model).stem}-{Path(a.scenario).stem}.kernels.json").write_text(
        json.dumps({"graphdiag": ours, "llama.cpp": theirs}))
    print(f"{a.scenario}: graphdiag captured {len(ours)} graphs ({[len(c) for c in ours]}), "
          f"llama.cpp {len(theirs)} ({[len(c) for c in theirs]})")
    from graphdiag.llama.kernel_names import differences, without_cublas_conversions
    same = True
    for i, (x, y0) in enumerate(zip(ours, theirs)):
        y, f16_gemms = without_cublas_conversions(y0)   # conversions graphdiag does not launch (BF16) left out
        if len(x) - 1 != len(y):     # graphdiag's first kernel is the embedding's GET_ROWS (llama.cpp's on the CPU)
            print(f"capture {i}: {len(x)} kernels in graphdiag's (1 the embedding), {len(y)} in llama.cpp's "
                  f"({len(y0) - len(y)} cuBLAS conversions aside)")
            for line in difflib.unified_diff([k[:60] for k in y], [k[:60] for k in x[1:]], "llama.cpp", "graphdiag",
                                             lineterm="", n=1):
                print("   ", line)
            same = False
            break
        for d in differences(x, y, f16_gemms=f16_gemms):   # counts agree; names (ggml's identifiers) do not
            print(f"capture {i}: kernel {d.index} is {d.kernel} ({d.ours}) in graphdiag's, {d.theirs} in llama.cpp's")
            same = False
    if same:
        print("every compared capture has the same kernels (as ggml names them; graphdiag's embedding and the "
              "conversions around cuBLAS's BF16 GEMMs aside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

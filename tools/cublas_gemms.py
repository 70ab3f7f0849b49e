"""Record where cuBLAS splits llama.cpp's GEMMs over K: for each N, a scenario of 4 sequences each prefilled with
N tokens (the later prefills capture) runs on real llama.cpp (`graphdiag llama` in a child, kernel names on);
every cuBLAS GEMM of its first prefill capture is listed in order with whether cublasLt's splitKreduce_kernel
followed it (needs a GPU and a CUDA llama-cpp-python). Writes or extends the fixture
tests/data/llama/cublas-gemms-h100.json, which tests/integration/test_cublas_split.py holds graphdiag's model of
cuBLAS (gpu/compat.cublas_split_k_parts) to.

    python tools/cublas_gemms.py MODEL.gguf --key qwen3moe-tiny-f16 --tokens 17,48,64,65,100,128,129,158,192 \\
        --out tests/data/llama/cublas-gemms-h100.json

--key is PRESET-WTYPE, the graphdiag preset and weight type the file was exported from (`graphdiag export-gguf`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

_GEMM = re.compile(r"(\w?\d+gemm_\w+?)_(?:tn|nn|nt)")


def gemms(kernels: list[str]) -> list[list]:
    """[short GEMM name, split?] for each cuBLAS GEMM of a captured graph's kernel list, in order: a cutlass /
    xmma GEMM (named by its `…gemm_…` tile) or an nvjet kernel, split where splitKreduce_kernel comes next."""
    out = []
    for i, k in enumerate(kernels):
        if "gemm" in k or k.startswith("nvjet"):
            m = _GEMM.search(k)
            out.append([m.group(1) if m else k, i + 1 < len(kernels) and "splitKreduce" in kernels[i + 1]])
    return out


def first_prefill(captures: list[list[str]]) -> list[str] | None:
    """The first capture holding a cuBLAS GEMM (a decode's graphs hold none at these sizes); None if none."""
    return next((c for c in captures if gemms(c)), None)


def main() -> int:
    from captured_kernels import llama_captures
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--key", required=True, help="PRESET-WTYPE the file was exported from")
    ap.add_argument("--tokens", required=True, help="prompt lengths, comma-separated (at most n_ubatch)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="cublas-gemms-work")
    a = ap.parse_args()
    out, work = Path(a.out), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = json.loads(out.read_text()) if out.exists() else {"recorded": "", "files": {}}
    per = data["files"].setdefault(a.key, {})
    for n in (int(t) for t in a.tokens.split(",")):
        name = f"probe-{Path(a.model).stem}-{n}"
        sc = work / f"{name}.toml"
        sc.write_text(f'name = "{name}"\ndescription = "cuBLAS GEMMs of {n}-token prefills"\ntimeline = []\n\n'
                      f'[run]\nmodel = "{a.model}"\nprompt_tokens = {n}\nsteps = 2\nbatch = 4\n')
        cap = first_prefill(llama_captures(a.model, str(sc), work))
        if cap is None:
            print(f"{n}: no prefill captured (n_kv moved between the prefills?)")
            continue
        per[str(n)] = {"kernels": len(cap), "gemms": gemms(cap)}
        print(f"{n}: {len(cap)} kernels, GEMMs split: {[s for _, s in per[str(n)]['gemms']]}")
    out.write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Record the type llama.cpp's own quantizer gives each weight of graphdiag's presets under an ftype mix (a fixture
for graphdiag's model/mixes.py).

    PYTHONPATH=<a llama-cpp-python 0.3.36 build> python tools/record_quant_mixes.py --out tests/data/quant_mixes.json

Each preset is exported as F16 GGUF (graphdiag export-gguf), then quantized by libllama's llama_model_quantize
(llama-quantize's function, no imatrix, default params) to each ftype of graphdiag's MIXES; the output file's
tensor types are read with gguf-py. A CPU build of llama-cpp-python 0.3.36 (llama.cpp 0c1e57098) is enough.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path

PRESETS = ("tiny", "small", "moe-tiny", "qwen3moe-tiny", "gemma3-tiny", "gpt-oss-tiny")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default=",".join(PRESETS))
    args = ap.parse_args()
    import gguf
    import llama_cpp

    from graphdiag.cli.main import main as graphdiag
    from graphdiag.model.mixes import MIXES
    out: dict = {"llama_cpp": getattr(llama_cpp, "__version__", "?"), "types": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            src = Path(tmp) / f"{preset}-f16.gguf"
            arch = ["--arch", "llama"] if preset == "moe-tiny" else []
            if graphdiag(["export-gguf", "--model", preset, *arch, str(src)]) != 0:
                return 1
            for name, mix in MIXES.items():
                params = llama_cpp.llama_model_quantize_default_params()
                params.ftype, params.nthread = mix.ftype, os.cpu_count() or 1
                dst = Path(tmp) / f"{preset}-{name}.gguf"
                rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
                if rc != 0:
                    print(f"{preset} {name}: llama_model_quantize returned {rc}", file=sys.stderr)
                    return 1
                types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(dst).tensors}
                out["types"].setdefault(preset, {})[name] = types
                dst.unlink()
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

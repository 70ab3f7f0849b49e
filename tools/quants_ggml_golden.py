"""Regenerate tests/data/quants_ggml.npz: ggml's own quantisers' and dequantisers' output on fixed inputs.

Compiles ggml-quants.c of the vendored llama.cpp 0c1e57098 (path as the first argument, default
/work/up/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml) with gcc -O2 for plain x86-64 (no FMA, as a release
build of ggml-base), calls quantize_row_*_ref and dequantize_row_* through ctypes and stores, per type, the
bytes and the values. IQ4_NL's bytes are quantize_iq4_nl's without an importance matrix, what llama-quantize
writes (its _ref tries no scales; graphdiag.quants.iquants says why). MXFP4 also on its edge inputs
(mxfp4_edge_inputs: block maxima one ulp below powers of two, level midpoints). The inputs are drawn by graphdiag's counter-based generator (quants_inputs() in the
test), so the file holds outputs only. Run: python tools/quants_ggml_golden.py [GGML_DIR]
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from graphdiag.ir.dtypes import GGMLType, block_size, type_size  # noqa: E402
from test_quants_ggml import GOLDEN, TYPES, mxfp4_edge_inputs, quants_inputs  # noqa: E402

# The few ggml.c symbols ggml-quants.c refers to; none is reached by the *_ref / dequantize_row_* calls.
STUBS = r"""
#include <stddef.h>
#include <stdlib.h>
void ggml_abort(const char *f, int l, const char *fmt, ...) { abort(); }
size_t ggml_row_size(int t, long n) { abort(); }
const char *ggml_type_name(int t) { return "?"; }
size_t ggml_type_size(int t) { abort(); }
"""


def build(ggml: Path, out: Path) -> ctypes.CDLL:
    stub = out / "stubs.c"
    stub.write_text(STUBS)
    lib = out / "libq.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-ffp-contract=off", f"-I{ggml}/include", f"-I{ggml}/src",
                    str(ggml / "src" / "ggml-quants.c"), str(stub), "-lm", "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def main() -> None:
    ggml = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/up/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml")
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(ggml, Path(tmp))
        x = quants_inputs()
        out = {}
        for t in TYPES:
            name = t.name.lower().replace("_k", "_K")   # ggml spells q4_K
            n = x.size
            raw = np.zeros(n // block_size(t) * type_size(t), np.uint8)
            vals = np.zeros(n, np.float32)
            fp = ctypes.POINTER(ctypes.c_float)
            if t == GGMLType.IQ4_NL:     # quantize_iq4_nl(src, dst, nrow, n_per_row, imatrix NULL)
                lib.quantize_iq4_nl(x.ctypes.data_as(fp), raw.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(1),
                                    ctypes.c_int64(n), None)
            else:
                getattr(lib, f"quantize_row_{name}_ref")(x.ctypes.data_as(fp), raw.ctypes.data_as(ctypes.c_void_p),
                                                          ctypes.c_int64(n))
            if t != GGMLType.Q8_1:           # ggml has no dequantize_row_q8_1
                getattr(lib, f"dequantize_row_{name}")(raw.ctypes.data_as(ctypes.c_void_p), vals.ctypes.data_as(fp),
                                                       ctypes.c_int64(n))
            out[f"{t.name.lower()}_bytes"], out[f"{t.name.lower()}_values"] = raw, vals
        edge = mxfp4_edge_inputs()
        raw = np.zeros(edge.size // 32 * 17, np.uint8)
        lib.quantize_row_mxfp4_ref(edge.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                   raw.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(edge.size))
        out["mxfp4_edge_bytes"] = raw
    np.savez_compressed(GOLDEN, **out)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()

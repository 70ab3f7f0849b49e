"""Where cuBLAS splits a GEMM over K, against what it did on the H100 (tests/data/llama/cublas-gemms-h100.json:
llama.cpp 0c1e57098's captured prefill graphs of 17 to 192 tokens, every cuBLAS GEMM in order with whether
cublasLt's splitKreduce_kernel followed it). graphdiag launches mul_mat_fixup_f32 after its k-split exactly where
its model of cuBLAS (gpu/compat.cublas_split_k_parts) says cuBLAS splits; a GEMM split on one side only changes
the captured graph's kernel count, so the update decision with it (qwen3moe-tiny's attention output at 158
tokens split on graphdiag's side before the K-per-tile bound: the differential test's seed 234848585)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdiag.backends.drivers import sim
from graphdiag.config import resolve
from graphdiag.runner import run
from graphdiag.scenario import load_scenario

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "llama" / "cublas-gemms-h100.json").read_text())
GEMMS = {"mul_mat_f16", "mul_mat_f32", "mul_mat_bf16"}
CASES = [(f, int(n)) for f, per in DATA["files"].items() for n in per]


def _first_capture(model: str, wtype: str, n: int, tmp_path: Path, monkeypatch) -> list[str]:
    name = f"probe-{n}"
    sc = tmp_path / f"{name}.toml"
    sc.write_text(f'name = "{name}"\ndescription = "probe"\ntimeline = []\n\n[run]\nmodel = "{model}"\n'
                  f'wtype = "{wtype}"\nprompt_tokens = {n}\nsteps = 2\nbatch = 4\n')
    caps: list[list[str]] = []
    end = sim.SimDriver.end_capture

    def end_capture(self, stream):
        kernels = [node.name for node in self._stream(stream, "end_capture").capture.nodes if node.type == "kernel"]
        graph = end(self, stream)
        caps.append(kernels)
        return graph

    monkeypatch.setattr(sim.SimDriver, "end_capture", end_capture)
    s = load_scenario(str(sc))
    cfg = resolve({"backend": "sim", "model": model, "chunk_size": 0, "nvtx": False, "sim_mode": "decisions"},
                  s.run, environ=s.environ({}), env_origins=s.env_origins())
    run(cfg, s)
    return caps[0]


@pytest.mark.parametrize("file,n", CASES, ids=[f"{f}-{n}" for f, n in CASES])
def test_gemms_split_where_cublas_split(file, n, tmp_path, monkeypatch):
    model, wtype = file.rsplit("-", 1)
    theirs = DATA["files"][file][str(n)]
    ours = _first_capture(model, wtype, n, tmp_path, monkeypatch)
    split = [k == "mul_mat_fixup_f32" for k in ours[1:]] + [False]
    ours_gemms = [split[i] for i, k in enumerate(ours) if k in GEMMS]
    assert ours_gemms == [s for _, s in theirs["gemms"]], (
        f"{file} at {n} tokens: graphdiag splits GEMMs {ours_gemms}, cuBLAS split {[s for _, s in theirs['gemms']]}")
    # the simulated device is the H100's (cc 9.0, 132 SMs); graphdiag launches the F16 path's conversions, not
    # BF16's (x to BF16 before each GEMM: report/analysis/known.py's cublas-conversions)
    bf16_conversions = len(theirs["gemms"]) if wtype == "bf16" else 0
    assert len(ours) - 1 + bf16_conversions == theirs["kernels"], (
        f"{file} at {n} tokens: {len(ours)} kernels (the embedding's GET_ROWS one of them), "
        f"llama.cpp {theirs['kernels']}")


def test_the_recording_tool_reads_gemms_and_their_splits():
    """tools/cublas_gemms.py, which wrote the fixture: a GEMM named by its tile, split where cublasLt's
    splitKreduce_kernel follows it; nvjet kernels (BF16) are GEMMs too; the first capture holding one."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from cublas_gemms import first_prefill, gemms
    caps = [["_Z12rms_norm_f32ILi256E", "_Z13mul_mat_vec_fIfLi1E"],
            ["_Z23convert_unary_cont_vec4If6__halfEvPKvPT0_l",
             "_ZN7cutlass7Kernel2I51cutlass_80_tensorop_h16816gemm_64x64_64x6_tn_align8EEvNT_6ParamsE",
             "_ZN8cublasLt19splitKreduce_kernelILi32ELi16Ei6__halfS1_",
             "_ZN7cutlass7Kernel2I58cutlass_80_wmma_tensorop_h161616gemm_32x32_128x2_tn_align8EEvNT_6ParamsE",
             "nvjet_sm90_tss_8x64_64x16_4x1_v_bz_TNN", "_Z11k_bin_bcastI"]]
    assert first_prefill(caps) is caps[1]
    assert gemms(caps[1]) == [["h16816gemm_64x64_64x6", True], ["h161616gemm_32x32_128x2", False],
                              ["nvjet_sm90_tss_8x64_64x16_4x1_v_bz_TNN", False]]
    assert first_prefill(caps[:1]) is None

"""graphdiag's captured graphs against real llama.cpp's, kernel by kernel count (fixtures recorded on the H200:
tests/data/llama/kernels-*.json, tools/captured_kernels.py). A capture's kernel count is its topology: where
the counts of two consecutive captures of one entry differ, cudaGraphExecUpdate refuses and the executable is
instantiated again, so a count that moves on one side and not the other is a decision graphdiag gets wrong.

graphdiag's capture has one kernel more than llama.cpp's everywhere (the token embedding's GET_ROWS, which
llama.cpp keeps on the CPU: report/analysis/known.py's graph-nodes). At more than 8 tokens on quantised weights
upstream's stream-k MMQ launches mul_mat_q_stream_k_fixup after each mat-mul whose tiles leave SMs idle;
graphdiag launches mul_mat_fixup_f32 after its k-split there (gpu/compat.py mmq_stream_k_parts), so those
counts match too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.runner import run
from graphdiag.scenario import load_scenario

DATA = Path(__file__).resolve().parents[1] / "data" / "llama"
EMBEDDING_ON_CPU = 1
# Gemma 3's Q and K rms_norm+mul+rope: llama.cpp fuses both in every layer (18 layers x 2), and so does graphdiag
# since its allocator never takes a view parent in place (ggml_gallocr_is_own is false for views): the QK-norm
# used to go in place over the reshaped mat-mul, the rope's output then overlapped it and the fusion's
# memory-range check refused.
GEMMA_QK_ROPE_FUSED = 36


def _captures(model: str, scenario: str) -> list[int]:
    sc = load_scenario(scenario)
    cfg = resolve({"backend": "sim", "model": model, "chunk_size": 0, "nvtx": False, "sim_mode": "decisions"},
                  sc.run, environ=sc.environ({}), env_origins=sc.env_origins())
    return [e.n_graph_nodes for e in run(cfg, sc).events if type(e).__name__ == "ChunkCaptured"]


def _theirs(name: str) -> list[list[str]]:
    return json.loads((DATA / f"kernels-{name}.json").read_text())["llama.cpp"]


def _expected(theirs: list[list[str]]) -> list[int]:
    return [len(c) + EMBEDDING_ON_CPU for c in theirs]


@pytest.fixture(scope="module")
def tiny_q8_0(tmp_path_factory):
    p = tmp_path_factory.mktemp("k") / "tiny-q8_0.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", "q8_0", str(p)]) == 0   # seed 0, as on the H200
    return str(p)


def test_tiny_q8_0_captures_as_llama_cpp(tiny_q8_0):
    theirs = _theirs("tiny-q8_0-fusion-boundary")
    assert [len(c) for c in theirs] == [82, 101, 101, 130]
    assert _captures(tiny_q8_0, "fusion-boundary") == _expected(theirs)


@pytest.mark.parametrize("scenario", ["nkv-growth", "fusion-boundary", "prompt-over-ubatch"])
def test_gemma3_captures_as_llama_cpp(gemma3_file, scenario):
    """Before graphdiag counted flash attention's kernels as upstream does, it captured 458 kernels at one token
    (llama.cpp 403) and the same 458 after n_kv grew to 512 (llama.cpp 421: its vec flash attention gained its
    combine in each of the 18 layers, so its update was refused where graphdiag's went through).
    prompt-over-ubatch: at the second prompt the 16-token no-output graph outgrows the compute buffer and the
    scheduler reallocates it; cuMemAlloc hands the larger buffer out at the freed base (measured on the H200),
    so no address moves and llama.cpp captures twice in all. The simulated driver reuses freed addresses as
    cuMemAlloc does (memory.AddressSpace's granule); before it did, every address moved and it captured a
    third time."""
    theirs = _theirs(f"gemma3-{scenario}")
    assert sum(c.count("rms_norm_mul_rope_f32") for c in theirs[:1]) == GEMMA_QK_ROPE_FUSED
    assert _captures(str(gemma3_file), scenario) == _expected(theirs)


def test_flash_attention_kernels_per_layer_follow_upstream(gemma3_file):
    """The flash-attention kernels of each capture: llama.cpp's combine / stream-k fixup appear where
    graphdiag's combine does."""
    theirs = _theirs("gemma3-nkv-growth")
    extra = [sum(k in ("flash_attn_combine_results", "flash_attn_stream_k_fixup_uniform",
                       "flash_attn_stream_k_fixup_general") for k in c) for c in theirs]
    assert extra == [0, 18]


# llama.cpp's MoE router mat-mul (ffn_gate_inp, F32 weights) takes its float mat-vec only up to 3 columns on
# Ampere and newer (ggml_cuda_should_use_mmvf: F32 ne11 <= 3), then cuBLAS (MMF refuses F32 there), and cuBLAS
# ran it as a split-K GEMM: cutlass_80_tensorop_s1688gemm + cublasLt splitKreduce_kernel, two kernels (H200
# 2026-12-04; H100 2026-12-06 from 4 columns). graphdiag's stand-in for that path is two launches too
# (compat.cublas_split_k_parts: mul_mat_f32 split over k + mul_mat_fixup_f32), so the counts are llama.cpp's + 1.


def test_moe_captures_as_llama_cpp_with_cublas_split_k(tmp_path):
    """moe-tiny exported as llama's MoE, fusion-boundary (recorded on the H200): 73, 84, 88, 88 kernels in
    llama.cpp's captures at 1, 2, 8 and 9 tokens; graphdiag's are those + 1 (the embedding), its cuBLAS
    stand-in taking two launches as cuBLAS's split-K does."""
    from graphdiag.backends.gpu.compat import mul_mat_path
    from graphdiag.ir.dtypes import GGMLType
    from graphdiag.model.build import DECODE, GraphParams, build_graph
    from graphdiag.model.presets import PRESETS
    from graphdiag.model.weights import create_model
    p = tmp_path / "moe-f16.gguf"
    assert main(["export-gguf", "--model", "moe-tiny", "--wtype", "f16", str(p)]) == 0
    theirs = _theirs("moe-f16-fusion-boundary")
    assert [len(c) for c in theirs] == [73, 84, 88, 88]
    split_k = [sum("splitKreduce_kernel" in k for k in c) for c in theirs]
    assert split_k == [0, 0, 4, 4]
    model = create_model(PRESETS["moe-tiny"], GGMLType.F16, with_data=False)   # the file's shapes and types
    for n_tokens, k in zip((1, 2, 8, 9), split_k):     # the router's path at each capture's tokens
        g = build_graph(model, GraphParams(n_tokens, n_tokens, n_tokens, DECODE, 256)).graph
        routers = [g.node(i) for i in range(g.n_nodes) if g.node(i).name.startswith("ffn_moe_logits")]
        assert len(routers) == 4
        assert all(mul_mat_path(r, 900) == ("cublas" if k else "mmvf") for r in routers)
    assert _captures(str(p), "fusion-boundary") == _expected(theirs)



# The experts' MUL_MAT_IDs of moe-tiny Q8_0 (exported as llama's MoE), as llama.cpp 0c1e57098 launches them on
# the H200 (ggml-cuda.cu ggml_cuda_mul_mat_id; tests/unit/test_mul_mat_id_paths.py): up to 8 tokens mmvq, the gate
# and up fused with their GLU (quantize_q8_1 + mul_mat_vec_q(_moe) each, 4 kernels a layer); above, MMQ with ids
# (mm_ids_helper, quantize_mmq_q8_1, mul_mat_q, mul_mat_q_stream_k_fixup: 4 a MUL_MAT_ID, 13 a layer with the GLU).
# llama.cpp's counts were measured by the differential test (tests/gpu/test_llama_differential.py, H200): 101 at 3
# tokens, 105 at 6, 158 at 10 and 11; graphdiag captured 102, 106, 123 and 123 there before its experts launched
# upstream's kernels. 1 token (98 + 1) is read off the source, not measured.
MOE_Q8_0_SCENARIO = """name = "moe-batches"
description = "moe-tiny decoding 1, 3, 6, 10 and 11 sequences"
timeline = [{ at_step = 6, batch = 6 }, { at_step = 9, batch = 10 }, { at_step = 12, batch = 11 }]

[run]
model = "tiny"
prompt_tokens = 1
steps = 12
batch = 3
"""


def test_moe_q8_0_captures_as_llama_cpp_measured(tmp_path):
    p = tmp_path / "moe-q8_0.gguf"
    assert main(["export-gguf", "--model", "moe-tiny", "--wtype", "q8_0", str(p)]) == 0
    scenario = tmp_path / "moe-batches.toml"
    scenario.write_text(MOE_Q8_0_SCENARIO, encoding="utf-8")
    theirs = [98, 101, 105, 158, 158]       # at 1, 3, 6, 10 and 11 tokens
    assert _captures(str(p), str(scenario)) == [n + EMBEDDING_ON_CPU for n in theirs]


def _kernel_names(model: str, scenario: str, monkeypatch) -> list[list[str]]:
    """The kernel names of each graph graphdiag captures on the simulated driver (its nodes carry the names
    the CUDA driver's kernels have), one graph per split."""
    from graphdiag.backends.drivers import sim
    captures, end = [], sim.SimDriver.end_capture

    def end_capture(self, stream):
        graph = end(self, stream)
        captures.append([n.name for n in graph.nodes if n.type == "kernel"])
        return graph
    monkeypatch.setattr(sim.SimDriver, "end_capture", end_capture)
    sc = load_scenario(scenario)
    cfg = resolve({"backend": "sim", "model": model, "chunk_size": 0, "nvtx": False}, sc.run,
                  environ=sc.environ({}), env_origins=sc.env_origins())
    run(cfg, sc)
    return captures


# Where graphdiag's kernels differ from llama.cpp's by name though the counts agree (graphdiag/llama/kernel_names.py
# maps both to ggml's identifiers), exactly: (fixture, capture) -> {(graphdiag's kernel, llama.cpp's family): the
# positions in llama.cpp's capture}. Every differing position of every capture must be listed and every listed one
# must still differ: an entry excuses those positions only, never the rest of its capture. Each is a real
# difference in graphdiag's choice of kernel, to be fixed (then this test fails: remove the entry). None is left:
# the last ones (2026-12-07) were graphdiag's vec flash attention at 2-8 tokens where ggml 0c1e57098 runs its
# tensor-core kernel from 2 tokens (geometry.fa_takes_vec), and graphdiag's F16 mat-vec at 2-8 columns where ggml
# runs MMF (lowering: the tile kernel), in tiny Q8_0 and moe-tiny F16 at 2 and 8 tokens.
NAME_DIFFERENCES: dict = {}


def _by_kernel(diffs) -> dict:
    """{(graphdiag's kernel, llama.cpp's family): positions} of kernel_names.differences()."""
    out: dict = {}
    for d in diffs:
        out.setdefault((d.kernel, d.theirs), []).append(d.index)
    return {k: tuple(v) for k, v in out.items()}


@pytest.mark.parametrize("name, model, arch, scenario", [
    ("tiny-q8_0-fusion-boundary", ("tiny", "q8_0"), "llama", "fusion-boundary"),
    ("moe-f16-fusion-boundary", ("moe-tiny", "f16"), "llama", "fusion-boundary"),
    ("tiny-f16-gen-716079883", ("tiny", "f16"), "llama", 716079883),
    ("qwen3moe-f16-moe-sequences-sweep", ("qwen3moe-tiny", "f16"), "qwen3moe", "moe-sequences-sweep"),
])
def test_captured_kernel_names_follow_llama_cpp(name, model, arch, scenario, tmp_path, monkeypatch):
    """Not only the counts: each capture's kernels in order, graphdiag's mapped to ggml's identifiers, against
    the names llama.cpp's captures recorded (the embedding's GET_ROWS left out of graphdiag's, the conversions
    graphdiag does not launch, around cuBLAS's BF16 GEMMs, out of llama.cpp's: kernel_names.
    without_cublas_conversions; the F16 path's graphdiag launches too), every position.
    A scenario given as a number is the differential test's timeline of that seed."""
    from graphdiag.llama.kernel_names import differences, without_cublas_conversions
    from graphdiag.llama.timelines import write_timeline
    p = tmp_path / f"{name}.gguf"
    assert main(["export-gguf", "--model", model[0], "--wtype", model[1], "--arch", arch, str(p)]) == 0
    if isinstance(scenario, int):
        scenario = str(write_timeline(scenario, tmp_path, model=str(p)))
    ours, theirs = _kernel_names(str(p), scenario, monkeypatch), _theirs(name)
    assert len(ours) == len(theirs)
    found = {}
    for i, (a, b) in enumerate(zip(ours, theirs)):
        b, f16_gemms = without_cublas_conversions(b)
        if d := _by_kernel(differences(a, b, f16_gemms=f16_gemms)):
            found[(name, i)] = d
    assert found == {k: v for k, v in NAME_DIFFERENCES.items() if k[0] == name}


# F16 weights past MMF's 16 columns go to cuBLAS upstream: a conversion of x to F16 before each GEMM and of the F16
# result to F32 after it, and for a long K at few output tiles cuBLAS splits the GEMM over K (cutlass h16816gemm +
# cublasLt splitKreduce_kernel); graphdiag launches the same (lowering._cublas_f16; the split as
# compat.cublas_split_k_parts models it from the H100's records below), so cublas_extra is 0 there. Before the
# split, the differential test's F16 timelines failed at their first prompt capture (tiny: 70 kernels, llama.cpp
# 122 = 69 + 50 conversions + 3 reduces), and qwen3moe-tiny at 32 sequences (101 against 138).
SPLIT_K_GEN_SEED = 716079883


def _captures_with_cublas(model: str, scenario: str) -> list[tuple[int, int]]:
    sc = load_scenario(scenario)
    cfg = resolve({"backend": "sim", "model": model, "chunk_size": 0, "nvtx": False, "sim_mode": "decisions"},
                  sc.run, environ=sc.environ({}), env_origins=sc.env_origins())
    return [(e.n_graph_nodes, e.cublas_extra) for e in run(cfg, sc).events if type(e).__name__ == "ChunkCaptured"]


@pytest.mark.parametrize("model,arch,fixture", [
    ("tiny", "llama", f"tiny-f16-gen-{SPLIT_K_GEN_SEED}"),
    ("qwen3moe-tiny", "qwen3moe", "qwen3moe-f16-moe-sequences-sweep"),
])
def test_f16_cublas_captures_as_llama_cpp(model, arch, fixture, tmp_path):
    from graphdiag.llama.timelines import write_timeline
    p = tmp_path / f"{model}-f16.gguf"
    assert main(["export-gguf", "--model", model, "--arch", arch, "--wtype", "f16", str(p)]) == 0
    scenario = (str(write_timeline(SPLIT_K_GEN_SEED, tmp_path, model=str(p))) if model == "tiny"
                else "moe-sequences-sweep")
    theirs = _theirs(fixture)
    ours = _captures_with_cublas(str(p), scenario)
    assert [n - EMBEDDING_ON_CPU + extra for n, extra in ours] == [len(c) for c in theirs]
    reduces = [sum("splitKreduce_kernel" in k for k in c) for c in theirs]
    assert reduces == {"tiny": [3, 0, 0, 0, 0, 0], "qwen3moe-tiny": [0, 0, 4, 4, 4, 8]}[model]


@pytest.mark.parametrize("scenario", ["nkv-growth", "fusion-boundary", "prompt-over-ubatch"])
def test_gemma3_kernel_names_follow_llama_cpp(gemma3_file, scenario, monkeypatch):
    """The real Gemma 3 270M file, every position of every capture (H200 recordings): its scale kernel, the fused
    QK-norm rope, and its Q5_0 tensors at 9 tokens and more, where graphdiag's dequantize_f16 + tile mat-mul
    stand for ggml's Q8_1 quantize + mul_mat_q (kernel_names.upstream_sequence)."""
    from graphdiag.llama.kernel_names import differences, without_cublas_conversions
    ours, theirs = _kernel_names(str(gemma3_file), scenario, monkeypatch), _theirs(f"gemma3-{scenario}")
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        b, f16_gemms = without_cublas_conversions(b)
        assert differences(a, b, f16_gemms=f16_gemms) == [], (scenario, i)

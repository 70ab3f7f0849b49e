"""Gemma 3's iSWA decode captures as llama.cpp 0c1e57098 makes them, and why they depend on the SWA cache's size.

The H200 parity run (tests/gpu/test_llama_parity.py, 2026-12-06, /work/.device/2/parity.log) captured at step 3 on
the exported gemma3-tiny F16 108 graph nodes in llama.cpp for swa-full and 110 for swa-mask-stops-growing;
graphdiag captured 117 in both. The graphs are the same; what differs is which gate/up mat-vec + GEGLU triples
fuse. ggml_cuda_can_fuse (ggml-cuda.cu 3211-3220) fuses one only when ggml_cuda_check_fusion_memory_ranges
(2968) finds no source of the three overlapping the GLU's output, so it depends on where ggml-alloc put the
tensors, and that plan is not the decode graph's own:

- llama_context::sched_reserve (llama-context.cpp 615-760) reserves, as the context is made, a 512-token prompt
  graph over the whole memory (memory->init_full: n_kv is every cell of each cache), a decode graph, the
  prompt graph again; ggml_gallocr_alloc_graph (ggml-alloc.c 1052) re-plans a later graph only when
  ggml_gallocr_needs_realloc (1009) says it does not fit, which a decode graph always does: its tensors take
  the 512-token prompt's offsets (graphdiag's Context.sched_reserve).
- Every graph input lives on the CPU (ggml-backend.cpp 945, "1.inp"); the CUDA split gets copies placed at its
  start (split pass 5, graph copy 1510-1525), freed by ggml-alloc after their last reader like any tensor
  that is no output (ggml_gallocr_free_node, 691). The cell indices are I64 (llama-kv-cache.cpp 1419).
  graphdiag placed its inputs first and never freed them (sched/alloc_order.py now places them as llama.cpp).

So the freed masks' blocks (n_kv x 512 F16: 4096 global cells, 4 MiB; the SWA cache 768 cells, 768 KiB, or
4096 with swa_full) shape the free list the later layers are placed in. In the reserve's plan without
swa_full, layer 5's ffn_norm (512 KiB) is freed after ffn_up-5 into a hole that, merged with its neighbour,
is exactly the 1 MiB GEGLU: ffn_geglu-5 lands on ffn_norm-5, at decode sizes the two overlap (2048 and 1024
bytes at one offset) and the fusion is refused; with swa_full that hole is 512 KiB alone, the GEGLU goes to
the top and fuses. graphdiag, planning its first prefill (n_kv 512) with inputs kept, refused layers 1-4.

A step-3 capture (one token, n_kv 768 in both caches) in kernels, per layer: attn_norm (rms_norm+mul), the
Q, K, V mat-vecs, Q and K rms_norm+mul+rope, Q's scale, two set_rows, the vec flash attention and its
combine (768 positions = 6 KV tiles of D = 128: parallel blocks, fattn-common.cuh 1185-1305), the output
mat-vec, the post-attention rms_norm+mul+add, ffn_norm, gate/up+GEGLU (one kernel fused, three not), ffn_down,
the post-FFN rms_norm+mul+add: 17 x 6 = 102; then inp_scaled, the last layer's two GET_ROWS, its
post-attention ADD (rms_norm+mul alone there), result_norm, result_output: 108, and one more unfused GEGLU
makes 110. graphdiag's capture has the token embedding's GET_ROWS besides (llama.cpp runs it on the CPU:
report/analysis/known.py's graph-nodes): 109 and 111. Step 11 (after position 768: the global n_kv 1024)
captures the same counts."""

from __future__ import annotations

from collections import Counter

import pytest

from graphdiag import events as E
from graphdiag.backends.cpu import CpuBackend
from graphdiag.config import resolve
from graphdiag.ir.tensor import Tensor
from graphdiag.model.source import build_model
from graphdiag.runner import run
from graphdiag.scenario import load_scenario
from graphdiag.sched.context import make_context

EMBEDDING_ON_CPU = 1                   # graphdiag's GET_ROWS of token_embd, in llama.cpp's CPU split
GLU = "mul_mat_vec+glu"
# llama.cpp's graph nodes per capture step on the H200 (step 3 measured; step 11 the same graph recaptured)
LLAMA_CPP = {"swa-full": {3: 108, 11: 108}, "swa-mask-stops-growing": {3: 110, 11: 110}}


def _captures(scenario: str) -> dict[int, tuple[int, Counter, list[int]]]:
    """step -> (graph nodes, fusions by pattern, the GLU fusions' gate node positions) of each capture."""
    sc = load_scenario(scenario)
    cfg = resolve({"backend": "sim", "chunk_size": 0, "nvtx": False}, sc.run, environ=sc.environ({}),
                  env_origins=sc.env_origins())
    ev = run(cfg, sc).events
    out = {}
    for c in (e for e in ev if isinstance(e, E.ChunkCaptured)):
        fused = [e for e in ev if isinstance(e, E.FusionApplied) and e.uid == c.uid]   # the plan of its graph
        out[c.step] = (c.n_graph_nodes, Counter(e.pattern for e in fused),
                       [e.node for e in fused if e.pattern == GLU])
    return out


@pytest.fixture(scope="module")
def captures():
    return {s: _captures(s) for s in LLAMA_CPP}


@pytest.mark.parametrize("scenario", sorted(LLAMA_CPP))
def test_iswa_captures_have_llama_cpps_graph_nodes(captures, scenario):
    assert {s: n for s, (n, _, _) in captures[scenario].items()} == {
        s: n + EMBEDDING_ON_CPU for s, n in LLAMA_CPP[scenario].items()}


def test_the_sliding_cache_size_decides_the_last_layers_geglu_fusion(captures):
    """swa_full: every layer's gate/up + GEGLU fuses (6); the SWA cache at 768 cells: all but layer 5's
    (the global one, the last), whose GEGLU the reserve placed over its ffn_norm input."""
    full, sized = captures["swa-full"][3], captures["swa-mask-stops-growing"][3]
    assert full[1][GLU] == 6 and sized[1][GLU] == 5
    assert sized[2] == full[2][:5]                       # the same fusions but the last layer's
    assert {k: v for k, v in full[1].items() if k != GLU} == {k: v for k, v in sized[1].items() if k != GLU} == {
        "rms_norm+mul": 14, "rms_norm+mul+add": 11, "rms_norm+mul+rope": 12}


def _reserved(swa_full: bool) -> dict[str, tuple[int, int]]:
    """name -> (offset, planned bytes) of each tensor the context's reserve placed (its last graph: the
    512-token prompt), on one backend with CUDA's 128-byte alignment."""
    class Cuda128(CpuBackend):
        alignment = 128

    ctx = make_context(build_model("gemma3-tiny", "f16", swa_full=swa_full), [Cuda128()])
    g, alloc = ctx.sched.graph, ctx.sched.galloc
    placed = {}
    for slots, plans in ((g.leafs.tolist(), alloc.leafs), (g.nodes.tolist(), alloc.nodes)):
        for i, p in zip(slots, plans):
            if p is not None:
                placed[Tensor(g.arena, i).name] = (p.offset, p.size)
    ctx.sched.close()
    return placed


@pytest.mark.parametrize("swa_full", [False, True])
def test_the_reserve_plans_every_cell_of_both_caches_and_where_the_last_geglu_goes(swa_full):
    """sched_reserve's graphs are over the whole memory: the KQ masks at n_ctx cells and at the SWA cache's
    size (768 for gemma3-tiny: its 128 positions + a 512-token ubatch, padded to 256; n_ctx with swa_full),
    F16 x 512 tokens. Without swa_full the plan puts ffn_geglu-5 where ffn_norm-5 was (the fusion's memory
    ranges overlap at any size), with it elsewhere."""
    placed = _reserved(swa_full)
    assert placed["attn_inp_kq_mask"][1] == 4096 * 512 * 2
    assert placed["attn_inp_kq_mask_swa"][1] == (4096 if swa_full else 768) * 512 * 2
    assert placed["attn_inp_k_idxs"][1] == 512 * 8                  # llama.cpp's I64 cell indices
    same = placed["ffn_geglu-5"][0] == placed["ffn_norm-5"][0]
    assert same != swa_full

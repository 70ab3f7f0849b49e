"""MUL_MAT_ID as llama.cpp 0c1e57098's CUDA backend runs it, per weight type and batch, on an H200 (cc 9.0, 132
SMs): the path (gpu/compat.py mul_mat_id_path), the fusion (gpu/fusion.py) and the launches (gpu/lowering_mmid.py),
each read off llama.cpp 0c1e57098's ggml/src/ggml-cuda (as llama-cpp-python 0.3.36 vendors it):

  ggml-cuda.cu ggml_cuda_mul_mat_id: quantized experts take mmvq while dst->ne[2] (tokens) <=
      get_mmvq_mmid_max_batch (mmvq.cu: MMVQ_MAX_BATCH_SIZE = 8 on Volta, Ada Lovelace and newer), then MMQ
      (mmq.cu ggml_cuda_should_use_mmq with n_experts: always on Turing+); float experts MMF
      (mmf.cu ggml_cuda_should_use_mmf with mul_mat_id: up to 512 columns for experts of <= 1024 rows); the
      sorted fallback (ids to the host, a sync) only where none applies (ggml_cuda_mul_mat_id_needs_sync).
  mmvq.cu ggml_cuda_mul_mat_vec_q: quantize_row_q8_1_cuda, then mul_mat_vec_q (1 token) or
      mul_mat_vec_q_moe (more): two launches, both through ggml_cuda_kernel_launch (PDL).
  mmq.cu ggml_cuda_mul_mat_q with ids: ggml_cuda_launch_mm_ids_helper (mmid.cu), quantize_scatter_mmq_q8_1_cuda
      (gate/up: ne11 == 1) or quantize_mmq_q8_1_cuda (down), then mmq.cuh launch_mul_mat_q: mul_mat_q, and
      mul_mat_q_stream_k_fixup where ntiles = ceil(M / 128) * ceil(T / J) * n_expert leave SMs idle (moe-tiny:
      4 * 1 * 8 = 32 tiles on 132 SMs, 24 %: always). All four `<<<>>>` launches (no PDL).
  mmf.cu ggml_cuda_mul_mat_f: ids and ncols_dst (tokens) > 16 -> mm_ids_helper first, then mul_mat_f_ids
      (mmf.cuh); up to 16 mul_mat_f reads the ids itself. `<<<>>>` launches.
  ggml-cuda.cu's fusion loop: {MUL_MAT_ID, MUL_MAT_ID, GLU} (ggml_cuda_can_fuse: ggml_cuda_should_fuse_mul_mat)
      runs as one mat-vec where ggml_cuda_should_fuse_mul_mat_vec_f (float: mmvf at dst->ne[2] == 1) or
      ggml_cuda_should_fuse_mul_mat_vec_q (quantized: src1->ne[1] <= 8, dst->ne[2] <= get_mmvq_mmid_max_batch,
      cc > Pascal) holds.
No memset or memcpy node: mmvq and mmq clear a weight's padding only for src0 in a compute buffer (experts are
weights). The families are graphdiag/llama/kernel_names.py's (what both sides' captures are compared in).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.cpu import CpuBackend
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.capture import lower_graph
from graphdiag.backends.gpu.compat import check_compatibility, mul_mat_id_needs_sync, mul_mat_id_path
from graphdiag.backends.gpu.fusion import MMID_GLU, fusion_plan
from graphdiag.backends.gpu.lowering import op_launches
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.ir import Arena, GGMLType as G, GluOp, Graph, Op
from graphdiag.ir.build import Ctx
from graphdiag.llama.kernel_names import upstream
from graphdiag.model.build import DECODE, GraphParams, build_graph
from graphdiag.model.presets import PRESETS
from graphdiag.quants import quantize
from support.placement import place_tensors

H200_CC, H200_SMS = 900, 132
WTYPES = (G.F16, G.BF16, G.Q8_0, G.Q4_0, G.Q4_K, G.Q6_K)
SUFFIX = {G.F16: "f16", G.BF16: "bf16", G.Q8_0: "q8_0", G.Q4_0: "q4_0", G.Q4_K: "q4_k", G.Q6_K: "q6_k"}
QUANTIZED = (G.Q8_0, G.Q4_0, G.Q4_K, G.Q6_K)


def moe_ffn(c: Ctx, wt: G, t: int, k: int = 512, m: int = 512, n_expert: int = 8, n_used: int = 2):
    """llama.cpp's build_moe_ffn expert part at moe-tiny's shapes (n_embd 512, n_ff_exp 512, 8 experts, 2 used):
    gate and up MUL_MAT_IDs of x (K, 1, T), their SWIGLU, the down MUL_MAT_ID. Returns (down, leaves)."""
    L = {"x": c.new_tensor(G.F32, (k, 1, t), "x"), "ids": c.new_input(G.I32, (n_used, t), "ids")}
    for name, ne in (("gate_exps", (k, m, n_expert)), ("up_exps", (k, m, n_expert)), ("down_exps", (m, k, n_expert))):
        L[name] = c.new_tensor(wt, ne, name)
    gate = c.mul_mat_id(L["gate_exps"], L["x"], L["ids"], "ffn_moe_gate")
    up = c.mul_mat_id(L["up_exps"], L["x"], L["ids"], "ffn_moe_up")
    glu = c.glu_split(gate, up, GluOp.SWIGLU, "ffn_moe_swiglu")
    return c.mul_mat_id(L["down_exps"], glu, L["ids"], "ffn_moe_down"), L


def _graph(wt: G, t: int, **shape):
    arena = Arena()
    out, leaves = moe_ffn(Ctx(arena), wt, t, **shape)
    g = Graph(arena)
    g.build_forward_expand(out)
    return g, out, leaves


def _launches(g: Graph, cc: int = H200_CC) -> list[tuple[str, str, bool]]:
    """(graphdiag kernel, the upstream family it stands for, PDL) of every launch, in order."""
    return [(la.kernel, upstream(la.kernel), la.pdl) for op in lower_graph(g, fusion_plan(g, cc), cc, nsm=H200_SMS)
            if op is not None for la in op_launches(op)]


def upstream_moe_launches(wt: G, t: int) -> list[tuple[str, str, bool]]:
    """What llama.cpp launches for gate, up, GLU and down of one MoE layer at t tokens (module docstring), as
    (graphdiag's kernel, upstream family, PDL)."""
    w, swiglu = SUFFIX[wt], ("glu_swiglu_f32", "unary_gated_op_kernel", True)
    if wt in QUANTIZED and t <= 8:                       # mmvq, gate/up + GLU fused
        return [("quantize_q8_1", "quantize", True), (f"mul_mat_id_vec_glu_{w}", "mul_mat_vec_q", True),
                ("quantize_q8_1", "quantize", True), (f"mul_mat_id_vec_{w}", "mul_mat_vec_q", True)]
    if wt in QUANTIZED:                                  # MMQ with its stream-k fixup
        mmq = [("mm_ids_helper", "mm_ids_helper", False), ("quantize_q8_1", "quantize", False),
               (f"mul_mat_id_q_{w}", "mul_mat_q", False), ("mul_mat_fixup_f32", "fixup", False)]
        return mmq + mmq + [swiglu] + mmq
    if t == 1:                                           # mmvf with ids, fused; MMF for the down projection
        return [(f"mul_mat_id_vec_glu_{w}", "mul_mat_vec_f", True), (f"mul_mat_id_vec_{w}", "mul_mat_f", False)]
    if t <= 16:                                          # MMF reading the ids
        mmf = [(f"mul_mat_id_vec_{w}", "mul_mat_f", False)]
        return mmf + mmf + [swiglu] + mmf
    mmf = [("mm_ids_helper", "mm_ids_helper", False), (f"mul_mat_id_f_{w}", "mul_mat_f_ids", False)]
    return mmf + mmf + [swiglu] + mmf


@pytest.mark.parametrize("wt", WTYPES, ids=lambda t: t.name)
def test_each_batch_takes_upstreams_path_without_a_sync(wt):
    for t in range(1, 33):
        g, down, _ = _graph(wt, t)
        want = "mmvq" if wt in QUANTIZED and t <= 8 else "mmq" if wt in QUANTIZED else "mmf"
        assert mul_mat_id_path(down, H200_CC) == want, t
        assert not mul_mat_id_needs_sync(down, H200_CC)


@pytest.mark.parametrize("wt", WTYPES, ids=lambda t: t.name)
def test_a_moe_layer_launches_what_llama_cpp_launches_at_every_batch_up_to_32(wt):
    """Kernel for kernel, family for family, PDL edge for PDL edge (a change of any of them between two
    captures of one graph is a topology change: cudaGraphExecUpdate refuses)."""
    for t in range(1, 33):
        g, *_ = _graph(wt, t)
        assert _launches(g) == upstream_moe_launches(wt, t), (wt.name, t)


@pytest.mark.parametrize("cc,wt,t,path", [
    (610, G.Q8_0, 4, "mmvq"), (610, G.Q8_0, 5, "mmq"),     # Pascal: Q8_0's mmvq MoE limit is 4 (mmvq.cu table)
    (610, G.Q4_K, 5, "mmvq"), (610, G.Q4_K, 6, "mmq"),
    (600, G.Q8_0, 9, "mmq"),                                 # no dp4a, but "for MoE, mmq is faster": n_experts > 0
    (600, G.F16, 2, "sorted"), (700, G.F16, 2, "mmf"),       # MMF F16 needs Volta's or Turing's mma
    (860, G.BF16, 2, "mmf"), (750, G.BF16, 2, "sorted"),     # BF16 needs Ampere
    (900, G.F16, 600, "sorted"),                             # MMF takes at most 512 columns for these experts
])
def test_the_path_on_other_devices_and_the_sync_where_none_applies(cc, wt, t, path):
    _, down, _ = _graph(wt, t)
    assert mul_mat_id_path(down, cc) == path
    assert mul_mat_id_needs_sync(down, cc) == (path == "sorted")


@pytest.mark.parametrize("cc,wt,fused_up_to", [(900, G.Q8_0, 8), (750, G.Q6_K, 8), (610, G.Q8_0, 4), (610, G.Q4_K, 5),
                                               (600, G.Q8_0, 0), (900, G.F16, 1), (900, G.BF16, 1)])
def test_the_gate_up_glu_fusion_follows_the_mat_vec_paths_batch(cc, wt, fused_up_to):
    """ggml_cuda_should_fuse_mul_mat_vec_q: quantized experts fuse at every batch their mmvq takes, not on
    Pascal P100 (cc <= 6.0) or older; ggml_cuda_should_fuse_mul_mat_vec_f: float experts at one token."""
    got = [t for t in range(1, 11)
           if any(f.pattern == MMID_GLU for f in fusion_plan(_graph(wt, t)[0], cc).values())]
    assert got == list(range(1, fused_up_to + 1))


def _moe_tiny_total(wt: G, t: int) -> int:
    """Launches of moe-tiny's whole decode graph at t sequences (one token each), the router's weights
    normalised as in llama's MoE files: a CUDA graph's node count (nothing but kernels), the token
    embedding's GET_ROWS included (llama.cpp runs it on the CPU)."""
    from graphdiag.model.weights import create_model
    m = create_model(dataclasses.replace(PRESETS["moe-tiny"], moe_norm_w=True), wt, with_data=False)
    g = build_graph(m, GraphParams(t, t, t, DECODE, 256)).graph
    return sum(len(op_launches(op)) for op in lower_graph(g, fusion_plan(g, H200_CC), H200_CC, nsm=H200_SMS)
               if op is not None)


@pytest.mark.parametrize("wt,t,theirs", [
    (G.Q8_0, 3, 101), (G.Q8_0, 6, 105), (G.Q8_0, 10, 158), (G.Q8_0, 11, 158),
    (G.Q4_K, 3, 101), (G.Q4_K, 6, 105), (G.Q4_K, 11, 158),
])
def test_moe_tiny_node_counts_are_llama_cpps_plus_the_embedding(wt, t, theirs):
    """llama.cpp 0c1e57098 on the H200 (tests/gpu/test_llama_differential.py, moe-tiny exported as llama):
    Q8_0 captured 158 nodes at 10 tokens (seed 1723160370) and Q8_0 / Q4_K 101, 105 and 158 at 3, 6 and 11
    (seed 1335961359), where graphdiag captured 123 at 10 and 11 (its experts one launch each above 8
    tokens, where upstream's MMQ launches four) and 102 / 106 at 3 / 6."""
    assert _moe_tiny_total(wt, t) == theirs + 1


def _fill(g: Graph, leaves: dict, alloc, write, seed: int) -> None:
    rng = np.random.default_rng(seed)
    place_tensors(g, alloc)
    for name, x in sorted(leaves.items()):
        if name == "ids":                 # distinct experts per token, as the top-k router gives
            n_expert = leaves["gate_exps"].ne[2]
            v = np.stack([rng.permutation(n_expert)[: x.ne[0]] for _ in range(x.ne[1])]).astype(np.int32)
        else:
            v = rng.standard_normal(int(np.prod(x.ne))).astype(np.float32) * 0.5
            v = quantize(v.reshape(-1, x.ne[0]), x.type) if x.type != G.F32 else v
        write(x.data, np.ascontiguousarray(v))


@pytest.mark.parametrize("wt,t", [(G.Q8_0, 3), (G.Q8_0, 9), (G.Q4_K, 1), (G.Q4_K, 9), (G.Q6_K, 10),
                                  (G.F16, 17), (G.BF16, 20)], ids=lambda v: getattr(v, "name", v))
def test_each_path_computed_on_the_simulated_gpu_is_the_cpu_backends_product(wt, t):
    """The lowered launches (Q8_1 x, the expert-sorted map, the k-split's partials and fixup in one pool
    buffer) on the simulated driver against the CPU backend's float product: Q8_1 rounding of x apart, the
    same. Small experts (K 256, M 256, 4 experts) keep it quick; 4 k parts at 9 tokens and more."""
    shape = dict(k=256, m=256, n_expert=4)
    outs = []
    cpu = CpuBackend()
    g, out, leaves = _graph(wt, t, **shape)
    _fill(g, leaves, cpu.buffer_alloc, cpu.tensor_set, seed=t)
    cpu.graph_compute(g, 0)
    outs.append(cpu.tensor_get(out.data, out.nbytes()).view(np.float32))
    drv = SimDriver(memory_bytes=16 << 20)
    gpu = GpuBackend(drv, E.EventBus(), RuntimeOptions())
    try:
        g, out, leaves = _graph(wt, t, **shape)
        kernels = [k for k, *_ in _launches(g)]
        assert ("mul_mat_fixup_f32" in kernels) == (wt in QUANTIZED and t > 8)
        _fill(g, leaves, gpu.buffer_alloc, gpu.tensor_set, seed=t)
        gpu.graph_compute(g, 0)
        outs.append(gpu.tensor_get(out.data, out.nbytes()).view(np.float32))
    finally:
        gpu.close()
        drv.close()
    want, got = outs
    tol = 3e-2 if wt in QUANTIZED else 1e-4
    assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))


# -- qwen3moe-tiny (model/arch/qwen3moe.py): 16 experts of 256 rows over n_embd 512, the top 4 per token --------
SEQS = (1, 2, 4, 8, 16, 32)


def _qwen3moe_decode(wt: G, n_seq: int) -> Graph:
    """qwen3moe-tiny's decode graph at n_seq sequences (one token each: the experts' T is n_seq)."""
    from graphdiag.model.weights import create_model
    m = create_model(PRESETS["qwen3moe-tiny"], wt, with_data=False)
    return build_graph(m, GraphParams(n_seq, n_seq, n_seq, DECODE, 256)).graph


def _expert_launches(g: Graph, il: int, cc: int = H200_CC) -> list[tuple[str, str, bool]]:
    """The launches of layer il's expert nodes, gate MUL_MAT_ID to down MUL_MAT_ID (the GLU between)."""
    names = [g.node(i).name for i in range(g.n_nodes)]
    a, b = names.index(f"ffn_moe_gate-{il}"), names.index(f"ffn_moe_down-{il}")
    ops = lower_graph(g, fusion_plan(g, cc), cc, nsm=H200_SMS)
    return [(la.kernel, upstream(la.kernel), la.pdl) for op in ops[a:b + 1] if op is not None
            for la in op_launches(op)]


@pytest.mark.parametrize("wt", WTYPES, ids=lambda t: t.name)
def test_qwen3moe_tiny_takes_upstreams_path_and_launches_at_each_sequence_count(wt):
    """Each MUL_MAT_ID of qwen3moe-tiny's real decode graph at 1-32 sequences: the path ggml_cuda_mul_mat_id
    takes on the H200 (the module docstring's reading: mmvq up to 8 tokens for quantized experts, then MMQ;
    MMF for float experts, which have <= 1024 rows: up to 512 columns), never the sorted fallback (no sync:
    the graph stays capturable), and each layer's expert launches those of upstream_moe_launches. The
    stream-k fixup holds as for moe-tiny: gate/up 2 x 1 x 16 = 32 tiles, down 4 x 1 x 16 = 64, both under
    90 % of 132 SMs."""
    for t in SEQS:
        g = _qwen3moe_decode(wt, t)
        mmid = [g.node(i) for i in range(g.n_nodes) if g.node(i).op == Op.MUL_MAT_ID]
        assert len(mmid) == 3 * 4 and {n.src[0].ne[2] for n in mmid} == {16} and {n.ne[2] for n in mmid} == {t}
        want = "mmvq" if wt in QUANTIZED and t <= 8 else "mmq" if wt in QUANTIZED else "mmf"
        assert {mul_mat_id_path(n, H200_CC) for n in mmid} == {want}, t
        assert not any(mul_mat_id_needs_sync(n, H200_CC) for n in mmid), t
        assert check_compatibility(g, H200_CC) is None
        for il in range(4):
            assert _expert_launches(g, il) == upstream_moe_launches(wt, t), (wt.name, t, il)


# graphdiag's CUDA-graph node count (kernels; the embedding's GET_ROWS included, which llama.cpp runs on the CPU)
# of qwen3moe-tiny's decode step at 1, 2, 4, 8, 16, 32 sequences on the H200: predictions to hold against
# llama.cpp's captured counts (tests/gpu/test_llama_differential.py and test_llama_parity.py run the exported
# file on the GPU; none was recorded here). Where they step: 1 -> 2 the one-token fusions end (float experts'
# gate/up + GLU, mat-vec + ADD); 2 -> 4 the F32 router mat-mul (16 experts x K 512) becomes cuBLAS's split-k
# pair (cublas_split_k_parts, one more launch a layer); 8 -> 16 quantized experts leave mmvq for MMQ (mm_ids_helper,
# quantize, mul_mat_q, fixup per projection); 16 -> 32 float experts' MMF runs mm_ids_helper first, and F16's
# attention projections (past MMF's 16 columns: cuBLAS) split the K-1024 output projection over K (compat.
# cublas_split_k_parts: one more launch a layer). The F16 count at 32 is llama.cpp's, recorded on the H100
# (tests/data/llama/kernels-qwen3moe-f16-moe-sequences-sweep.json: 138 = 139 - 1 embedding), graphdiag launching
# the cuBLAS path's conversions too (lowering._cublas_f16: x's F16 copy and the F16 result's conversion around
# each of the 17 GEMMs, 34 launches).
SPLIT_K_AT_32 = {G.F16: 4 + 34}
QWEN3MOE_TINY_NODES = {
    G.F16: (74, 85, 89, 89, 89, 139), G.BF16: (74, 85, 89, 89, 89, 101),
    G.Q8_0: (99, 102, 106, 106, 159, 159), G.Q4_0: (99, 102, 106, 106, 159, 159),
    G.Q4_K: (99, 102, 106, 106, 159, 159), G.Q6_K: (99, 102, 106, 106, 159, 159),
}


@pytest.mark.parametrize("wt", WTYPES, ids=lambda t: t.name)
def test_qwen3moe_tiny_node_counts_per_sequence_count(wt):
    """The whole decode graph's launches, and the experts' share of each step: from 4 to 8 sequences and from
    16 to 32 the rest of the graph launches the same (its dense mat-muls keep their paths within each pair), so
    the four layers' expert launches (upstream_moe_launches) account for every change there, and at 32 F16's
    split output projection (SPLIT_K_AT_32)."""
    got = []
    for t in SEQS:
        g = _qwen3moe_decode(wt, t)
        got.append(sum(len(op_launches(op)) for op in lower_graph(g, fusion_plan(g, H200_CC), H200_CC, nsm=H200_SMS)
                       if op is not None))
    assert tuple(got) == QWEN3MOE_TINY_NODES[wt]
    experts = {t: 4 * len(upstream_moe_launches(wt, t)) for t in SEQS}
    rest = {t: n - experts[t] for t, n in zip(SEQS, got)}
    assert rest[4] == rest[8] and rest[16] + SPLIT_K_AT_32.get(wt, 0) == rest[32]

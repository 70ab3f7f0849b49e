"""llama MoE GGUF files (issue 29): `export-gguf --model moe-tiny` writes llama's MoE (Mixtral-style) as llama.cpp
0c1e57098's loader reads it, and a llama file with experts builds build_moe_ffn as llama.cpp's llama does —
the router weights normalised (norm_w) — computed on the simulated GPU with the fused router and checked
against the oracle; a file graphdiag does not build is refused in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.gguf_io import export_config, open_gguf
from graphdiag.model.presets import PRESETS, ModelConfig
from graphdiag.model.weights import create_file_model, create_model
from graphdiag.runner import run
from support.arch_gguf import write_arch_gguf
from support.cli import export_files, one_line

gguf = pytest.importorskip("gguf")

# a small llama MoE for the refusals and the one-expert file (rows of 128: whole Q8_0 blocks)
MOE_MINI = ModelConfig("moe-mini", 2, 128, 4, 2, 0, 512, n_expert=4, n_expert_used=2, n_ff_exp=256, n_ctx=512)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_files(tmp_path_factory.mktemp("moe-gguf"), "moe-tiny", "wtype", ("f16", "q8_0"))


def _llama_cpp_tensors(n_layer: int) -> dict[str, tuple[int, ...]]:
    """name -> ne of every tensor llama_model_llama::load_arch_tensors creates for moe-tiny's file (n_expert
    8 > 0: the MoE branch; no output bias, rope_freqs or Granite shared experts): its loader also refuses a
    file holding any other tensor (done_getting_tensors), so this is the file's whole tensor list."""
    d, v, f, e = 512, 4096, 512, 8
    out = {"token_embd.weight": (d, v), "output_norm.weight": (d,), "output.weight": (d, v)}
    for i in range(n_layer):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": (d,), p + "attn_q.weight": (d, d), p + "attn_k.weight": (d, d),
                p + "attn_v.weight": (d, d), p + "attn_output.weight": (d, d), p + "ffn_norm.weight": (d,),
                p + "ffn_gate_inp.weight": (d, e), p + "ffn_gate_exps.weight": (d, f, e),
                p + "ffn_down_exps.weight": (f, d, e), p + "ffn_up_exps.weight": (d, f, e)}
    return out


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_the_export_is_llamas_moe_as_llama_cpp_loads_it(exported, wtype):
    r = gguf.GGUFReader(exported[wtype])
    f = lambda k: r.fields[k].contents()
    assert f("general.architecture") == "llama" and f("llama.block_count") == 4
    assert f("llama.expert_count") == 8 and f("llama.expert_used_count") == 2
    assert f("llama.feed_forward_length") == 512          # llama sizes the expert stacks by n_ff
    assert "llama.expert_group_count" not in r.fields and "llama.expert_feed_forward_length" not in r.fields
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    want = _llama_cpp_tensors(4)
    assert {n: s[:len(want[n])] for n, s in got.items()} == want and all(len(s) <= 3 for s in got.values())
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["blk.3.ffn_norm.weight"] == "F32"
    assert {types[f"blk.{i}.ffn_{n}_exps.weight"] for i in range(4) for n in ("gate", "up", "down")} == {wtype.upper()}


def test_the_file_reads_back_as_llamas_moe(exported):
    g = open_gguf(str(exported["f16"].resolve()))
    cfg = g.cfg
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff, cfg.moe_norm_w) == (8, 2, 512, 0, True)
    assert cfg.norm_eps == np.float32(1e-5)            # a GGUF float32
    assert dataclasses.replace(cfg, name="moe-tiny", norm_eps=1e-5) == export_config("moe-tiny", "llama")
    assert not PRESETS["moe-tiny"].moe_norm_w       # the preset's own graph is not llama's (OLMoE's form)


# build_moe_ffn (src/llama-graph.cpp at 0c1e57098) as llama's MoE layer calls it (src/models/llama.cpp 196-213:
# LLM_FFN_SILU, norm_w true, w_scale = hparams.expert_weights_scale, which llama never reads: 0, softmax gating,
# no expert bias, no probs_in, no merged gate_up), nodes in ggml_build_forward_expand's depth-first order:
FFN_NORM = ["RMS_NORM", "MUL"]                    # build_norm(ffn_inp, ffn_norm) (llama.cpp 196-199)
ROUTER = ["MUL_MAT",                              # logits = build_lora_mm(gate_inp, cur)           2039
          "SOFT_MAX",                             # probs = ggml_soft_max(logits)                   2057
          "RESHAPE",                              # probs reshaped (1, n_expert, T): GET_ROWS' src0  2133
          "ARGSORT", "VIEW",                      # ggml_argsort_top_k: "ffn_moe_argsort", "ffn_moe_topk" 2123
          "GET_ROWS"]                             # weights = ggml_get_rows(probs, selected)        2137
NORM_W = ["RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"]    # if (norm_w) { ... }          2148-2161
EXPERTS = ["RESHAPE",                             # cur reshaped (n_embd, 1, T) after the expand    2171
           "MUL_MAT_ID", "MUL_MAT_ID", "GLU",     # gate (the swiglu's src0, visited first), up, swiglu 2204-2260
           "MUL_MAT_ID",                          # experts = build_lora_mm_id(down_exps, ...)      2318
           "MUL"]                                 # experts * weights (weight_before_ffn: llama4 only) 2335
SUM_K2 = ["VIEW", "VIEW", "ADD"]                  # the views before the adds, then their sum       2345-2362
RESIDUAL = ["ADD"]                                # cur = ggml_add(cur, ffn_inp) (llama.cpp 215)


def _layers(graph, n_layer: int) -> list[list[str]]:
    """Each layer's ops from its ffn_norm RMS_NORM (the node before the MUL "ffn_norm-il") to "l_out-il"."""
    names = [graph.node(i).name for i in range(graph.n_nodes)]
    out = []
    for il in range(n_layer):
        a, b = names.index(f"ffn_norm-{il}") - 1, names.index(f"l_out-{il}")
        out.append([graph.node(i).op.name for i in range(a, b + 1)])
    return out


@pytest.mark.parametrize("gtype,t", [(DECODE, 1), (PREFILL, 7)])
def test_the_loaded_graph_is_llama_cpps_build_moe_ffn(exported, gtype, t):
    m = create_file_model(open_gguf(str(exported["f16"].resolve())), with_data=False)
    g = build_graph(m, GraphParams(t, 1, 1, gtype, 256)).graph
    want = FFN_NORM + ROUTER + NORM_W + EXPERTS + SUM_K2 + RESIDUAL
    assert _layers(g, 4) == [want] * 4
    names = [g.node(i).name for i in range(g.n_nodes)]
    at = names.index("ffn_moe_weights-2")
    norm = [g.node(at + j) for j in range(1, 6)]
    assert [x.name for x in norm] == ["ffn_moe_weights-2 (reshaped)", "ffn_moe_weights_sum-2",
                                      "ffn_moe_weights_sum_clamped-2", "ffn_moe_weights_norm-2",
                                      "ffn_moe_weights_norm-2 (reshaped)"]
    assert [x.ne for x in norm] == [(2, t, 1, 1), (1, t, 1, 1), (1, t, 1, 1), (2, t, 1, 1), (1, 2, t, 1)]
    assert (norm[2].param_f32(0), norm[2].param_f32(1)) == (np.float32(6.103515625e-5), np.inf)
    assert norm[3].src[0] == norm[0] and norm[3].src[1] == norm[2]
    weighted = g.node(names.index("ffn_moe_weighted-2"))
    assert weighted.src[1] == norm[4]                  # the experts are weighted by the normalised weights
    # moe-tiny's own graph is the same but the norm (build_moe_ffn with norm_w false)
    preset = build_graph(create_model(PRESETS["moe-tiny"], with_data=False), GraphParams(t, 1, 1, gtype, 256)).graph
    assert _layers(preset, 4) == [FFN_NORM + ROUTER + EXPERTS + SUM_K2 + RESIDUAL] * 4


def test_graph_optimize_keeps_the_normalised_router_alive_until_the_node_after_it(exported):
    """0c1e57098's add_alloc_deps(i, i + ops.size()) over the group with the norm: its 10 nodes and their
    sources, kept until the experts' input reshape."""
    from graphdiag.backends.gpu.fusion import moe_alloc_deps
    m = create_file_model(open_gguf(str(exported["f16"].resolve())), with_data=False)
    g = build_graph(m, GraphParams(3, 1, 1, PREFILL, 256)).graph
    deps: dict[int, list[int]] = {}
    moe_alloc_deps(g, deps)
    names = g.arena.rec["name"]
    kept = {names[u].decode(): sorted(names[k].decode() for k in ks) for u, ks in deps.items()}
    assert kept["ffn_norm-1 (reshaped)"] == sorted([
        "ffn_moe_logits-1", "ffn_moe_probs-1", "ffn_moe_probs-1 (reshaped)", "ffn_moe_argsort-1", "ffn_moe_topk-1",
        "ffn_moe_weights-1", "ffn_moe_weights-1 (reshaped)", "ffn_moe_weights_sum-1", "ffn_moe_weights_sum_clamped-1",
        "ffn_moe_weights_norm-1", "ffn_moe_weights_norm-1 (reshaped)"])


def test_one_expert_ends_in_a_cont_and_runs(tmp_path, capsys):
    """expert_used_count 1: no ADD sums the views, build_moe_ffn CONTs the single one (llama-graph.cpp
    2365-2368); the fused router (with the norm of one weight) and the CONT run on the simulated GPU and meet
    the oracle."""
    p = write_arch_gguf(tmp_path / "one.gguf", "llama", dataclasses.replace(MOE_MINI, n_expert_used=1))
    m = create_file_model(open_gguf(str(p.resolve())), with_data=False)
    g = build_graph(m, GraphParams(1, 1, 1, DECODE, 256)).graph
    assert _layers(g, 2) == [FFN_NORM + ROUTER + NORM_W + EXPERTS + ["VIEW", "CONT"] + RESIDUAL] * 2
    assert main(["run", "--backend", "sim", "--model", str(p), "--steps", "3", "--prompt-tokens", "3",
                 "--oracle", "--verify"]) == 0
    assert "0 over the bound" in capsys.readouterr().out


def test_a_simulated_run_of_the_exported_file_fuses_the_normalised_router_and_meets_the_oracle(exported):
    """graphdiag run --model <exported moe gguf> --steps 6 --verify --oracle: every layer's router, norm
    included, is one topk_moe_f32 (+9 nodes absorbed) in the prefill and the decodes."""
    cfg = resolve({"backend": "sim", "model": str(exported["f16"]), "steps": 6, "verify": True, "oracle": True,
                   "nvtx": False}, environ={})
    r = run(cfg)
    fused = [e for e in r.events if type(e).__name__ == "FusionApplied" and e.pattern == "topk_moe"]
    assert fused and {e.absorbed for e in fused} == {9} and len({(e.step, e.node) for e in fused}) == len(fused)
    assert len([e for e in fused if e.step == 0]) == 4
    checks = [e for e in r.events if type(e).__name__ == "OracleCheck"]
    assert len(checks) == 7 and all(e.ok for e in checks) and not r.failures
    verifies = [e for e in r.events if type(e).__name__ == "VerifyResult"]
    assert verifies and all(e.ok for e in verifies)


def test_the_cli_run_of_the_q8_0_file_passes(exported, capsys):
    assert main(["run", "--backend", "sim", "--model", str(exported["q8_0"]), "--steps", "6", "--verify",
                 "--oracle"]) == 0
    out = capsys.readouterr().out
    assert "0 over the bound" in out and "0 mismatches" in out


def test_the_cpu_backend_computes_the_norm_unfused(exported, capsys):
    """The CPU backend runs SUM_ROWS, CLAMP and DIV node by node and meets the oracle; the file generates other
    tokens than moe-tiny (its weights normalised)."""
    base = {"backend": "cpu", "steps": 4, "prompt_tokens": 8, "oracle": True, "nvtx": False}
    filed = run(resolve({**base, "model": str(exported["f16"])}, environ={}))
    preset = run(resolve({**base, "model": "moe-tiny"}, environ={}))
    assert not filed.failures and all(e.ok for e in filed.events if type(e).__name__ == "OracleCheck")
    assert filed.tokens != preset.tokens


@pytest.mark.parametrize("kind,needle", [
    ("used-above-count", "llama.expert_count 4, expert_used_count 5: llama.cpp needs 0 < expert_used_count <= "
                         "expert_count <= 1024"),
    ("groups", "llama.expert_group_count 2: build_moe_ffn's grouped expert selection is not built by graphdiag"),
    ("used-without-experts", "expert_used_count 2 / expert_group_count 0 without experts"),
    ("expert-scale", "tensor blk.1.ffn_up_exps.scale changes llama's graph in llama.cpp"),
    ("no-gate", "tensor blk.0.ffn_gate_exps.weight is missing"),
])
def test_a_moe_file_graphdiag_does_not_build_is_refused_in_one_line(tmp_path, capsys, kind, needle):
    p = tmp_path / f"{kind}.gguf"
    if kind == "used-above-count":
        write_arch_gguf(p, "llama", dataclasses.replace(MOE_MINI, n_expert_used=5))
    elif kind == "groups":
        write_arch_gguf(p, "llama", MOE_MINI, extra={"llama.expert_group_count": 2})
    elif kind == "used-without-experts":
        write_arch_gguf(p, "llama", extra={"llama.expert_used_count": 2})
    elif kind == "expert-scale":
        write_arch_gguf(p, "llama", MOE_MINI, extra_tensors={"blk.1.ffn_up_exps.scale": np.ones(4)})
    else:
        write_arch_gguf(p, "llama", MOE_MINI, drop=("blk.0.ffn_gate_exps.weight",))
    line = one_line(capsys, ["run", "--backend", "cpu", "--model", str(p), "--steps", "2"])
    assert needle in line, line


def test_a_moe_preset_exports_only_as_an_architecture_with_experts(exported, tmp_path, capsys):
    line = one_line(capsys, ["export-gguf", "--model", "moe-tiny", "--arch", "qwen3", str(tmp_path / "q.gguf")])
    assert "cannot write MoE preset moe-tiny as qwen3: llama.cpp's qwen3 has no experts (use --arch llama, qwen3moe, gpt-oss)" \
        in line and not (tmp_path / "q.gguf").exists()


def test_the_gpu_backend_runs_the_norm_unfused_without_fusion(exported):
    """--no-fusion (GGML_CUDA_DISABLE_FUSION in llama.cpp): SUM_ROWS, CLAMP and DIV run as kernels of their own
    (sum_rows_f32, clamp_f32, div_f32: one of each per layer, none with the fused router), and a simulated run
    meets verify and the oracle."""
    from graphdiag.backends.gpu.capture import lower_graph
    from graphdiag.backends.gpu.fusion import fusion_plan

    m = create_file_model(open_gguf(str(exported["f16"].resolve())), with_data=False)
    g = build_graph(m, GraphParams(1, 1, 1, DECODE, 256)).graph

    def kernels(plan):
        names = []
        for op in lower_graph(g, plan, 900):
            if op is not None:
                names += [l.kernel for l in getattr(op, "launches", [getattr(op, "launch", None)]) if l is not None]
        return {k: names.count(k) for k in ("sum_rows_f32", "clamp_f32", "div_f32", "topk_moe_f32")}
    assert kernels({}) == {"sum_rows_f32": 4, "clamp_f32": 4, "div_f32": 4, "topk_moe_f32": 0}
    assert kernels(fusion_plan(g, 900)) == {"sum_rows_f32": 0, "clamp_f32": 0, "div_f32": 0, "topk_moe_f32": 4}
    base = {"backend": "sim", "steps": 4, "prompt_tokens": 8, "oracle": True, "verify": True, "nvtx": False,
            "model": str(exported["f16"]), "fusion": False}
    unfused = run(resolve(base, environ={}))
    assert not unfused.failures and all(e.ok for e in unfused.events if type(e).__name__ == "OracleCheck")
    assert not any(e.pattern.startswith("topk_moe") for e in unfused.events if type(e).__name__ == "FusionApplied")


@pytest.mark.parametrize("upstream,clamp_in_place", [("0c1e57098", True), ("d99724f2", False)])
def test_the_norm_is_placed_as_ggml_alloc_places_it(exported, tmp_path, upstream, clamp_in_place):
    """ggml_op_can_inplace: CLAMP takes over its SUM_ROWS's memory at 0c1e57098 (its list gained CLAMP after
    d99724f2), and with one expert the DIV takes over the CLAMP's (DIV is in both lists; with two experts the
    DIV's layout is not the CLAMP's). Placing them elsewhere moved every later address and with it which
    routers fuse (a review found layer 0's DIV over the router logits under d99724f2 at 2-4 tokens)."""
    from graphdiag.backends.cpu import CpuBackend
    from graphdiag.sched.alloc import GraphAllocator

    def norm_nodes(path, il):
        m = create_file_model(open_gguf(str(path.resolve())), with_data=False)
        g = build_graph(m, GraphParams(3, 1, 1, PREFILL, 256)).graph
        GraphAllocator([CpuBackend()], upstream=upstream).alloc_graph(g, [0] * g.n_nodes, [0] * len(g.leafs))
        by = {g.node(i).name: g.node(i) for i in range(g.n_nodes)}
        return (by[f"ffn_moe_weights_sum-{il}"], by[f"ffn_moe_weights_sum_clamped-{il}"],
                by[f"ffn_moe_weights_norm-{il}"])

    s, c, d = norm_nodes(exported["f16"], 1)
    assert (c.data == s.data) == clamp_in_place and d.data != c.data
    one = write_arch_gguf(tmp_path / "one.gguf", "llama", dataclasses.replace(MOE_MINI, n_expert_used=1))
    s, c, d = norm_nodes(one, 0)
    assert (c.data == s.data) == clamp_in_place and d.data == c.data


def test_clamp_of_a_nan_is_each_backends_own():
    """GGML_OP_CLAMP differs upstream between backends on a NaN: ggml-cpu's MAX(MIN(x, max), min) gives max,
    ggml-cuda's fminf(fmaxf(x, min), max) gives min; the CPU backend and the simulated GPU's clamp_f32 follow
    their own (the GPU kernel case 'bounds-nan' holds the CUDA kernel to the twin)."""
    from graphdiag.backends import cpu_ops
    from graphdiag.backends.sim_kernels import SIM_KERNELS
    x = np.array([np.nan, -1.0, 0.25, 3.0, np.inf], np.float32)
    assert cpu_ops.clamp(x, 0.0, 1.0).tolist() == [1.0, 0.0, 0.25, 1.0, 1.0]
    assert cpu_ops.clamp_cuda(x, 0.0, 1.0).tolist() == [0.0, 0.0, 0.25, 1.0, 1.0]
    assert "clamp_f32" in SIM_KERNELS

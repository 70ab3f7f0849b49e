"""Graph structure per architecture (issue 27, point 1): the decode and prompt graphs of llama, qwen2 and qwen3
against llama.cpp 0c1e57098's — node count, compute-node count and op census — and the pieces each
architecture adds, in llama.cpp's order and names (Q/K/V bias ADDs, QK-norm, NEOX rope, tied output,
head_dim != n_embd / n_head)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from graphdiag.ir.ops import Op, is_view_or_noop
from graphdiag.model.arch import get_arch
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.presets import PRESETS, ROPE_NEOX, ROPE_NORM, ModelConfig
from graphdiag.model.weights import create_model
from support.arch_gguf import MINI, MINI_QWEN3_WIDE, arch_config

# llama.cpp 0c1e57098's graph for one sequence, flash attention on, a KV cache of one stream, derived from the
# source: src/models/{llama,qwen2,qwen3}.cpp; llama-graph.cpp build_norm (RMS_NORM, MUL), build_qkv (MUL_MAT,
# ADD of the bias where there is one, RESHAPE to 3-D), build_attn (cpy_k / cpy_v of llama-kv-cache.cpp: a 2-D
# VIEW and SET_ROWS each; get_k / get_v: a VIEW of the cache each), build_attn_mha (a 4-D VIEW of Q, PERMUTE of
# Q, K and V, FLASH_ATTN_EXT, RESHAPE to 2-D; the mask is made F16, no cast), the output MUL_MAT, residual ADD,
# build_ffn SILU/PAR (two MUL_MATs, GLU, MUL_MAT), residual ADD. Once: the embedding GET_ROWS, the last layer's
# two GET_ROWS of inp_out_ids (built for every graph, so prompt and decode graphs have the same nodes), the
# output norm and lm_head. The same reading of gemma3.cpp gives the 727 nodes / 511 compute measured for Gemma
# 3 270M (real-models.md). Per layer:
_LLAMA = dict(MUL_MAT=7, RMS_NORM=2, MUL=2, ROPE=2, SET_ROWS=2, FLASH_ATTN_EXT=1, ADD=2, GLU=1,
              RESHAPE=4, VIEW=5, PERMUTE=3)
UPSTREAM_PER_LAYER = {
    "llama": _LLAMA,
    "qwen2": {**_LLAMA, "ADD": 2 + 3},                       # + the Q, K and V bias ADDs
    "qwen3": {**_LLAMA, "RMS_NORM": 2 + 2, "MUL": 2 + 2},    # + QK-norm of Q and of K
}
UPSTREAM_ONCE = dict(GET_ROWS=3, RMS_NORM=1, MUL=1, MUL_MAT=1)

# graphdiag's llama-family graph (model/graph_context.py, shared by the three) is 0c1e57098's node for node
# (tests/unit/test_upstream_nodes.py holds it against llama.cpp's own scheduler). Under --upstream d99724f2
# it has one node more, once: a CPY casting the F32 KQ mask to F16 (llama.cpp d3cf1f14 did; 0c1e57098 makes
# the mask an F16 input that flash attention reads as it is).
DEVIATION_ONCE = {"0c1e57098": {}, "d99724f2": dict(CPY=1)}

# real models' shapes (structure only): the numbers llama.cpp prints as "graph nodes" for them on the H200
QWEN2_5_0_5B = ModelConfig("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, rope_base=1e6, norm_eps=1e-6,
                           arch="qwen2", rope_type=ROPE_NEOX, tied_output=True, qkv_bias=True)
QWEN3_0_6B = ModelConfig("qwen3-0.6b", 28, 1024, 16, 8, 3072, 151936, rope_base=1e6, norm_eps=1e-6,
                         arch="qwen3", n_embd_head=128, rope_type=ROPE_NEOX, tied_output=True)


def upstream_census(arch: str, n_layer: int) -> Counter:
    c = Counter(UPSTREAM_ONCE)
    for op, n in UPSTREAM_PER_LAYER[arch].items():
        c[op] += n * n_layer
    return c


def upstream_counts(arch: str, n_layer: int) -> tuple[int, int]:
    """(nodes, compute nodes) of llama.cpp's graph."""
    c = upstream_census(arch, n_layer)
    noop = sum(n for op, n in c.items() if op in ("RESHAPE", "VIEW", "PERMUTE"))
    return sum(c.values()), sum(c.values()) - noop


def graphdiag_census(cfg: ModelConfig, n_tokens: int, upstream: str = "0c1e57098") -> tuple[Counter, int]:
    m = create_model(cfg, with_data=False, upstream=upstream)
    g = build_graph(m, GraphParams(n_tokens, 1, 1, DECODE if n_tokens == 1 else PREFILL, 256)).graph
    ops = Counter(Op(g.node(i).op).name for i in range(g.n_nodes))
    compute = sum(not is_view_or_noop(int(g.node(i).op), g.node(i).ne) for i in range(g.n_nodes))
    return ops, compute


def test_the_upstream_figures_of_real_models_are_these():
    """The figures to hold against llama.cpp's own log ("graph nodes") on the H200, per architecture."""
    assert upstream_counts("llama", PRESETS["1b"].n_layer) == (502, 310)
    assert upstream_counts("llama", PRESETS["tiny"].n_layer) == (130, 82)
    assert upstream_counts("qwen2", QWEN2_5_0_5B.n_layer) == (822, 534)
    assert upstream_counts("qwen3", QWEN3_0_6B.n_layer) == (986, 650)


@pytest.mark.parametrize("upstream", ["0c1e57098", "d99724f2"])
@pytest.mark.parametrize("n_tokens", [1, 7], ids=["decode", "prompt"])
@pytest.mark.parametrize("cfg", [PRESETS["tiny"], PRESETS["1b"], arch_config("qwen2", PRESETS["tiny"]),
                                 QWEN2_5_0_5B, arch_config("qwen3", PRESETS["tiny"]), QWEN3_0_6B],
                         ids=["llama-tiny", "llama-1b", "qwen2-tiny", "qwen2.5-0.5b", "qwen3-tiny", "qwen3-0.6b"])
def test_the_graph_census_is_upstreams(cfg, n_tokens, upstream):
    ops, compute = graphdiag_census(cfg, n_tokens, upstream)
    want = upstream_census(cfg.arch, cfg.n_layer)
    want.update(DEVIATION_ONCE[upstream])
    assert ops == +want
    nodes, comp = upstream_counts(cfg.arch, cfg.n_layer)
    # the compute nodes are upstream's exactly (plus the mask cast under d99724f2)
    cast = upstream == "d99724f2"
    assert compute == comp + cast and sum(ops.values()) == nodes + cast


def _layer0(cfg: ModelConfig, n_tokens: int = 1):
    m = create_model(cfg, with_data=False)
    g = build_graph(m, GraphParams(n_tokens, 1, 1, DECODE if n_tokens == 1 else PREFILL, 256)).graph
    nodes = [g.node(i) for i in range(g.n_nodes)]
    end = next(i for i, t in enumerate(nodes) if t.name == "l_out-0")
    return m, nodes[1: end + 1], nodes              # layer 0's nodes, after embd


def test_qwen2_adds_a_bias_after_each_qkv_mat_mul_named_as_llama_cpp():
    m, lay, _ = _layer0(arch_config("qwen2"))
    seq = [(Op(t.op).name, t.name) for t in lay[:13]]
    assert seq == [("RMS_NORM", "norm-0"), ("MUL", "attn_norm-0"),
                   ("MUL_MAT", "Qcur-0"), ("ADD", "Qcur-0"), ("RESHAPE", "Qcur-0"), ("ROPE", "Qcur-0"),
                   ("MUL_MAT", "Vcur-0"), ("ADD", "Vcur-0"), ("RESHAPE", "Vcur-0"),
                   ("MUL_MAT", "Kcur-0"), ("ADD", "Kcur-0"), ("RESHAPE", "Kcur-0"), ("ROPE", "Kcur-0")]
    q_add = lay[3]
    assert q_add.src[0] == lay[2] and q_add.src[1] == m.layers[0].bq
    assert m.layers[0].bq.ne[0] == 128 and m.layers[0].bk.ne[0] == m.cfg.n_embd_kv
    # ROPE(K) is followed by its cache write (the fused rope+view+set_rows pattern)
    assert [Op(t.op).name for t in lay[12:15]] == ["ROPE", "VIEW", "SET_ROWS"]


@pytest.mark.parametrize("arch,mode", [("llama", ROPE_NORM), ("qwen2", ROPE_NEOX), ("qwen3", ROPE_NEOX)])
def test_the_rope_mode_is_the_architectures(arch, mode):
    _, lay, _ = _layer0(arch_config(arch))
    ropes = [t for t in lay if t.op == Op.ROPE]
    assert len(ropes) == 2 and all(t.param_i32(2) == mode for t in ropes)


def test_qwen3_norms_each_head_of_q_and_k_before_rope():
    m, lay, _ = _layer0(arch_config("qwen3", MINI_QWEN3_WIDE))
    seq = [(Op(t.op).name, t.name) for t in lay[2:15]]
    assert seq == [("MUL_MAT", "Qcur-0"), ("RESHAPE", "Qcur-0"), ("RMS_NORM", "norm-0"),
                   ("MUL", "Qcur_normed-0"), ("ROPE", "Qcur-0"),
                   ("MUL_MAT", "Vcur-0"), ("RESHAPE", "Vcur-0"),
                   ("MUL_MAT", "Kcur-0"), ("RESHAPE", "Kcur-0"), ("RMS_NORM", "norm-0"),
                   ("MUL", "Kcur_normed-0"), ("ROPE", "Kcur-0"), ("VIEW", "Kcur-0 (view)")]
    norm, mul = lay[4], lay[5]
    assert tuple(norm.ne[:3]) == (64, 4, 1)                           # per head: rows of head_dim
    assert mul.src[1] == m.layers[0].attn_q_norm and tuple(m.layers[0].attn_q_norm.ne[:1]) == (64,)
    assert lay[12].src[1] == m.layers[0].attn_k_norm


def test_qwen3_head_dim_may_differ_from_n_embd_over_n_head():
    cfg = arch_config("qwen3", MINI_QWEN3_WIDE)
    assert cfg.head_dim == 64 and cfg.n_embd_q == 256 and cfg.n_embd_kv == 128
    m, lay, _ = _layer0(cfg, n_tokens=3)
    assert tuple(m.layers[0].wq.ne[:2]) == (128, 256) and tuple(m.layers[0].wo.ne[:2]) == (256, 128)
    kqv = next(t for t in lay if t.name == "kqv_out-0")
    assert tuple(kqv.ne[:2]) == (256, 3)
    fa = next(t for t in lay if t.op == Op.FLASH_ATTN_EXT)
    assert fa.param_f32(0) == pytest.approx(1 / 8)                # 1/sqrt(head_dim), not 1/sqrt(32)
    assert tuple(m.layers[0].k_cache.ne[:2]) == (128, m.cfg.n_ctx)


def test_a_tied_output_is_the_embedding_read_twice():
    m, _, nodes = _layer0(arch_config("qwen2", tied=True))
    assert m.output is m.tok_embd and "output.weight" not in {t.name for t in m.tensors()}
    out = nodes[-1]
    assert out.name == "result_output" and out.src[0] == m.tok_embd
    untied, _, nodes = _layer0(arch_config("qwen2"))
    assert nodes[-1].src[0] == untied.output != untied.tok_embd


def test_the_llama_presets_are_unchanged_by_the_registry():
    """The new ModelConfig fields default to llama's: same tensors, in the same order, as before the registry."""
    cfg = PRESETS["tiny"]
    assert (cfg.arch, cfg.rope_type, cfg.n_embd_head, cfg.tied_output, cfg.qkv_bias) == ("llama", 0, 0, False, False)
    names = [s.name for s in get_arch("llama").tensors(cfg)]
    per = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
    assert names == ["token_embd.weight", *(f"blk.{i}.{n}.weight" for i in range(4) for n in per),
                     "output_norm.weight", "output.weight"]
    assert dataclasses.replace(cfg) == get_arch("llama").preset(cfg)

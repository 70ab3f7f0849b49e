"""Model presets, weights and the graph builder: names, node order, inputs, determinism (no data needed)."""

import dataclasses

import numpy as np
import pytest

from graphdiag.errors import UsageError
from graphdiag.ir.dtypes import GGMLType
from graphdiag.ir.ops import GluOp, Op, TensorFlag
from graphdiag.memory import dequantize_q8_0
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph, padded_n_kv
from graphdiag.model.presets import PRESETS, get_preset, weight_type
from graphdiag.model.weights import create_model, on_cpu

N_7B_DECODE_NODES = 998   # 32 layers x 31 + 6: the two out_ids GET_ROWS included (and no mask cast: 0c1e57098)


@pytest.fixture(scope="module")
def tiny():
    return create_model(PRESETS["tiny"], with_data=False)


@pytest.fixture(scope="module")
def moe():
    return create_model(PRESETS["moe-tiny"], with_data=False)


def decode_params(n: int, n_kv: int = 256) -> GraphParams:
    return GraphParams(n, n, n, DECODE, n_kv)


def node_index(g) -> dict[str, int]:
    """First position of each node name (names repeat: `norm-l` is both norms of layer l)."""
    out: dict[str, int] = {}
    for i, t in enumerate(g.iter_nodes()):
        out.setdefault(t.name, i)
    return out


def op_index(g, op: Op, name: str) -> int:
    """Position of the node of op `op` named `name` (upstream's names repeat: Kcur-0 is K's mat-mul, reshape
    and rope; `cache_k_l0 (view)` its cache write and the attention's cache view)."""
    return next(i for i, t in enumerate(g.iter_nodes()) if t.op == op and t.name == name)


def consumers(g, t) -> list[str]:
    return [n.name for n in g.iter_nodes() if t in n.src]


def test_presets_and_lookup():
    assert (PRESETS["small"].n_layer, PRESETS["small"].n_head_kv, PRESETS["small"].head_dim) == (8, 4, 64)
    moe = get_preset("moe-tiny")
    assert (moe.n_expert, moe.n_expert_used, moe.n_ff_exp, moe.is_moe) == (8, 2, 512, True)
    assert PRESETS["7b"].n_embd_kv == 4096 and PRESETS["1b"].n_embd_kv == 512
    assert weight_type("Q8_0") == GGMLType.Q8_0
    with pytest.raises(UsageError, match="known: tiny"):
        get_preset("13b")


def test_weights_types_layout_and_dense():
    cfg = dataclasses.replace(PRESETS["tiny"], n_layer=1, n_vocab=256)
    m = create_model(cfg, GGMLType.Q8_0, seed=7)
    assert m.arena.mark == m.arena.top == len(m.tensors())
    lay = m.layers[0]
    assert lay.wq.type == GGMLType.Q8_0 and m.tok_embd.type == GGMLType.Q8_0
    assert lay.attn_norm.type == GGMLType.F32 and lay.k_cache.type == GGMLType.F16
    assert lay.k_cache.ne[:2] == (cfg.n_embd_kv, cfg.n_ctx)
    wq = m.host["blk.0.attn_q.weight"]
    assert wq.shape == (512, 512 // 32)                        # ggml (K, M) as numpy (M, K/32) blocks
    assert np.array_equal(m.dense("blk.0.attn_q.weight"), dequantize_q8_0(wq))
    # scale 1/sqrt(fan_in): rows of W x stay O(1) for x of O(1)
    assert 0.8 < float(m.dense("blk.0.ffn_down.weight").std() * np.sqrt(cfg.n_ff)) < 1.2
    again = create_model(cfg, GGMLType.Q8_0, seed=7)
    assert np.array_equal(again.host["output.weight"], m.host["output.weight"])


def test_n_cpu_moe_placement_is_the_first_layers_experts():
    assert on_cpu("blk.1.ffn_up_exps.weight", 2) and not on_cpu("blk.2.ffn_up_exps.weight", 2)
    assert not on_cpu("blk.0.ffn_gate_inp.weight", 2) and not on_cpu("blk.0.attn_q.weight", 4)


def test_decode_layer_order_matches_what_the_runtime_fuses(tiny):
    g = build_graph(tiny, decode_params(4)).graph
    at = node_index(g)
    names = [t.name for t in g.iter_nodes()]
    norm = g.node(at["attn_norm-0"])
    assert sorted(consumers(g, norm)) == ["Kcur-0", "Qcur-0", "Vcur-0"]
    i = op_index(g, Op.ROPE, "Kcur-0")
    rope, view, set_rows = g.node(i), g.node(i + 1), g.node(i + 2)
    assert (rope.op, view.op, set_rows.op) == (Op.ROPE, Op.VIEW, Op.SET_ROWS)
    assert view.src[0] == rope and set_rows.src[1] == view and set_rows.view_src == tiny.layers[0].k_cache
    assert view.ne[:2] == (512, 4)
    i = at["ffn_gate-0"]
    assert names[i:i + 3] == ["ffn_gate-0", "ffn_up-0", "ffn_swiglu-0"]
    assert g.node(i + 2).op == Op.GLU and g.node(i + 2).param_i32(0) == GluOp.SWIGLU
    fa = g.node(at["__fattn__-0"])
    k, v, mask = fa.src[1], fa.src[2], fa.src[3]
    # build_attn_mha's permutes of the cache views (get_k, get_v), each view's source the cache's SET_ROWS
    assert (k.op, k.name, v.op, v.name) == (Op.PERMUTE, "cache_k_l0 (view) (permuted)", Op.PERMUTE,
                                            "cache_v_l0 (view) (permuted)")
    k, v = k.src[0], v.src[0]
    assert k.ne[:3] == (64, 8, 256) and k.src[0].op == Op.SET_ROWS and k.src[0].name == "cache_k_l0 (view)"
    assert v.src[0].op == Op.SET_ROWS and op_index(g, Op.SET_ROWS, "cache_v_l0 (view)") < at["__fattn__-0"]
    q = fa.src[0]
    assert (q.op, q.name, q.ne[:3], q.src[0].op, q.src[0].name) == (Op.PERMUTE, "Qcur-0 (view) (permuted)",
                                                                    (64, 4, 8), Op.VIEW, "Qcur-0 (view)")
    # flash attention reads the F16 mask input itself (0c1e57098: no cast node; d99724f2: test below)
    assert mask.name == "attn_inp_kq_mask" and mask.op == Op.NONE and mask.type == GGMLType.F16
    assert mask.flags & TensorFlag.INPUT and mask.ne[:2] == (256, 4)
    assert abs(fa.param_f32(0) - 1 / 8) < 1e-7
    assert names[-3:] == ["norm", "result_norm", "result_output"]
    for n in ("attn_out-0", "ffn_inp-0", "ffn_norm-0", "ffn_out-0", "l_out-3", "embd"):
        assert n in at


@pytest.mark.parametrize("n_tokens", [1, 5])
def test_the_kq_mask_is_an_f16_input_at_0c1e57098_and_a_cast_f32_one_at_d99724f2(n_tokens):
    """0c1e57098's build_attn_inp_kq_mask: F16 (flash attention on) of (n_kv, n_tokens), named
    attn_inp_kq_mask, made after the K/V cell indices and read by every layer's flash attention as it is (no
    cast node). graphdiag's d99724f2 graph keeps its F32 mask and layer 0's CPY to F16, inside that layer's
    Q/K/V fork-join range, where it is first used."""
    gtype = DECODE if n_tokens == 1 else PREFILL
    new = create_model(PRESETS["tiny"], with_data=False)
    old = create_model(PRESETS["tiny"], with_data=False, upstream="d99724f2")
    b_new, b_old = (build_graph(m, GraphParams(n_tokens, 1, 1, gtype, 256)) for m in (new, old))
    g = b_new.graph
    mask = b_new.inputs.kq_mask
    assert new.upstream == "0c1e57098" and b_new.inputs.kq_mask_cnv == mask
    assert (mask.name, mask.type, mask.op, tuple(mask.ne)) == ("attn_inp_kq_mask", GGMLType.F16, Op.NONE,
                                                               (256, n_tokens, 1, 1))
    assert mask.idx in set(g.leafs.tolist()) and Op.CPY not in {t.op for t in g.iter_nodes()}
    assert all(t.src[3] == mask for t in g.iter_nodes() if t.op == Op.FLASH_ATTN_EXT)
    inp = b_new.inputs           # created as build_inp_pos, build_attn_inp_kv, build_inp_out_ids create them
    assert inp.pos.idx < inp.k_idxs.idx < inp.v_idxs.idx < mask.idx < inp.out_ids.idx
    g_old = b_old.graph
    cnv, at = b_old.inputs.kq_mask_cnv, node_index(g_old)
    assert (cnv.name, cnv.op, cnv.type) == ("kq_mask (copy)", Op.CPY, GGMLType.F16)
    assert cnv.src[0] == b_old.inputs.kq_mask and b_old.inputs.kq_mask.type == GGMLType.F32
    assert tuple(cnv.ne[:2]) == (256, n_tokens)
    assert op_index(g_old, Op.SET_ROWS, "cache_v_l0 (view)") < at["kq_mask (copy)"] < at["__fattn__-0"]
    assert [t.name for t in g_old.iter_nodes() if t.op == Op.CPY] == ["kq_mask (copy)"]
    assert g_old.n_nodes == g.n_nodes + 1
    # the cast is the only difference: the rest of the node list is the same names and ops
    assert [(t.name, t.op) for t in g_old.iter_nodes() if t.op != Op.CPY] == [(t.name, t.op) for t in g.iter_nodes()]


def test_inputs_and_output_flags(tiny):
    b = build_graph(tiny, decode_params(2))
    inp = b.inputs
    for t, ty in ((inp.tokens, GGMLType.I32), (inp.pos, GGMLType.I32), (inp.kq_mask, GGMLType.F16),
                  (inp.k_idxs, GGMLType.I32), (inp.v_idxs, GGMLType.I32)):
        assert t.flags & TensorFlag.INPUT and t.type == ty and t.idx in set(b.graph.leafs.tolist())
    # llama.cpp builds inp_out_ids even when every token is an output: the topology must not depend on it
    assert inp.out_ids.flags & TensorFlag.INPUT and inp.out_ids.ne[0] == 2
    assert [g for g in b.graph.iter_nodes() if g.op == Op.GET_ROWS and g.src[1] == inp.out_ids]
    assert b.logits.flags & TensorFlag.OUTPUT and b.logits.ne[:2] == (4096, 2)


def test_prefill_computes_only_the_output_rows_at_the_end(tiny):
    b = build_graph(tiny, GraphParams(9, 1, 1, PREFILL, 256))
    at = node_index(b.graph)
    assert b.inputs.out_ids.ne[0] == 1 and b.inputs.out_ids.name == "inp_out_ids"
    rows = b.graph.node(at["attn_out_rows-3"])
    assert rows.op == Op.GET_ROWS and rows.src[1] == b.inputs.out_ids and rows.ne[:2] == (512, 1)
    assert at["attn_out-3"] < at["attn_out_rows-3"] < at["ffn_inp-3"]
    assert b.graph.node(at["attn_out-2"]).ne[1] == 9 and b.logits.ne[:2] == (4096, 1)


def test_moe_ffn_names_and_order(moe):
    g = build_graph(moe, decode_params(3)).graph
    names = [t.name for t in g.iter_nodes()]
    i, j = names.index("ffn_moe_logits-1"), names.index("ffn_moe_out-1")
    assert [n for n in names[i:j + 1] if "reshaped" not in n] == [
        "ffn_moe_logits-1", "ffn_moe_probs-1", "ffn_moe_argsort-1", "ffn_moe_topk-1", "ffn_moe_weights-1",
        "ffn_moe_gate-1", "ffn_moe_up-1", "ffn_moe_swiglu-1", "ffn_moe_down-1", "ffn_moe_weighted-1",
        "ffn_moe_weighted-1 (view)", "ffn_moe_weighted-1 (view)", "ffn_moe_out-1"]
    assert names[names.index("ffn_moe_gate-1") - 1] == "ffn_norm-1 (reshaped)"   # the experts' input
    at = node_index(g)
    assert [g.node(at[f"ffn_moe_{n}-1"]).op for n in ("gate", "up", "down")] == [Op.MUL_MAT_ID] * 3
    # ggml_argsort_top_k, as build_moe_ffn: a descending ARGSORT of all 8 experts, the top 2 a VIEW of it
    srt, topk = g.node(at["ffn_moe_argsort-1"]), g.node(at["ffn_moe_topk-1"])
    assert (srt.op, srt.ne[:2], srt.param_i32(0), topk.op, topk.src[0]) == (Op.ARGSORT, (8, 3), 1, Op.VIEW, srt)
    assert topk.nb[:2] == srt.nb[:2] and Op.TOP_K not in {t.op for t in g.iter_nodes()}
    assert g.node(at["ffn_moe_topk-1"]).ne[:2] == (2, 3) and g.node(at["ffn_moe_weights-1"]).ne[:3] == (1, 2, 3)
    assert g.node(at["ffn_moe_down-1"]).ne[:3] == (512, 2, 3)


def test_rebuild_after_reset_gives_identical_structs(tiny):
    tiny.arena.reset()
    g1 = build_graph(tiny, decode_params(4)).graph
    snap = tiny.arena.raw[g1.nodes].copy(), g1.nodes.copy(), g1.first_node_addr
    tiny.arena.reset()
    g2 = build_graph(tiny, decode_params(4)).graph
    assert g2.first_node_addr == snap[2] and np.array_equal(g2.nodes, snap[1])
    assert np.array_equal(tiny.arena.raw[g2.nodes], snap[0])


def test_other_params_change_shapes_not_addresses(tiny):
    tiny.arena.reset()
    g1 = build_graph(tiny, decode_params(1)).graph
    ne1 = tiny.arena.rec["ne"][g1.nodes].copy()
    tiny.arena.reset()
    g4 = build_graph(tiny, decode_params(4, n_kv=512)).graph
    assert g4.first_node_addr == g1.first_node_addr and g4.n_nodes == g1.n_nodes
    changed = {(g4.node(i).op, g4.node(i).name)
               for i in np.nonzero((tiny.arena.rec["ne"][g4.nodes] != ne1).any(axis=1))[0]}
    assert {(Op.GET_ROWS, "embd"), (Op.MUL_MAT, "Qcur-0"), (Op.VIEW, "cache_k_l0 (view)"),
            (Op.PERMUTE, "cache_v_l0 (view) (permuted)"), (Op.MUL_MAT, "result_output")} <= changed
    assert not {n for op, n in changed if op == Op.SET_ROWS}   # the whole cache, whatever the batch


def test_padded_n_kv():
    assert [padded_n_kv(n, 4096) for n in (0, 1, 256, 257, 600)] == [256, 256, 256, 512, 768]
    assert padded_n_kv(1000, 1000) == 1000


def test_7b_decode_graph_builds_without_data():
    m = create_model(PRESETS["7b"], GGMLType.Q8_0, with_data=False)
    b = build_graph(m, decode_params(1))
    assert m.host == {} and all(t.data == 0 for t in m.tensors())
    assert b.graph.n_nodes == N_7B_DECODE_NODES
    assert b.graph.node(0).name == "embd" and b.logits.ne[:2] == (32000, 1)

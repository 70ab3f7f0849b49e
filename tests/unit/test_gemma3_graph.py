"""Gemma 3's graph against llama.cpp 0c1e57098's (real-models.md: the 270M decode graph measured with a CPU
build, one sequence, flash attention on) and its hyper-parameters against llama.cpp's defaults."""

from collections import Counter

import pytest

from graphdiag.errors import UsageError
from graphdiag.ir.ops import Op, TensorFlag, is_view_or_noop
import dataclasses
from pathlib import Path

from graphdiag.model.arch import gemma3
from graphdiag.model.arch.common import Meta
from graphdiag.model.arch.gemma3 import swa_pattern
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.weights import create_model

# Gemma 3 270M's metadata (gemma-3-270m-q4_k_m.gguf, read with gguf 0.19.0): keys absent from it are absent here
META_270M = {
    "gemma3.block_count": 18, "gemma3.embedding_length": 640, "gemma3.feed_forward_length": 2048,
    "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 256,
    "gemma3.attention.value_length": 256, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
    "gemma3.context_length": 32768, "gemma3.rope.freq_base": 1e6, "gemma3.attention.sliding_window": 512,
}


def config_from_metadata(meta, n_vocab, name, n_ctx, swa_full=False):
    """gemma3.config over a dict of metadata (a file with a 262144-token vocabulary and no output.weight)."""
    names = {"token_embd.weight"}
    shapes = {"token_embd.weight": (640, n_vocab)}
    m = Meta(Path(name + ".gguf"), "gemma3", lambda k, d=None: meta.get(k, d), names, shapes.get)
    return dataclasses.replace(gemma3.config(m), n_ctx=n_ctx, swa_full=swa_full)


def _cfg(n_ctx=4096, **kw):
    return config_from_metadata({**META_270M, **kw}, 262144, "gemma-3-270m", n_ctx)


def _census(model, params):
    res = build_graph(model, params)
    rec = model.arena.rec
    ops = Counter()
    for i in res.graph.nodes:
        r = rec[int(i)]
        if not is_view_or_noop(int(r["op"]), r["ne"]):
            ops[Op(int(r["op"])).name] += 1
    return res, ops


def test_270m_hparams_take_llama_cpp_defaults():
    cfg = _cfg()
    assert (cfg.head_dim, cfg.n_head_kv, cfg.n_embd_q) == (256, 1, 1024)
    assert cfg.rope_base == 1e6 and cfg.rope_base_swa == 10000.0          # freq_base_swa absent
    assert [il for il in range(18) if not cfg.is_swa(il)] == [5, 11, 17]  # pattern 6 absent: the default
    assert cfg.f_attention_scale == pytest.approx(1 / 16)
    assert cfg.swa_size == 1024 and cfg.tied_output and cfg.rope_type == 2


def test_pattern_and_window_keys():
    assert swa_pattern(4, 2) == (True, False, True, False)
    cfg = _cfg(**{"gemma3.attention.sliding_window_pattern": [True, False] * 9})
    assert [cfg.is_swa(il) for il in range(3)] == [True, False, True]
    meta = dict(META_270M)
    del meta["gemma3.attention.sliding_window"]
    assert not any(config_from_metadata(meta, 100, "g", 4096).is_swa(il) for il in range(18))
    with pytest.raises(UsageError, match="layer_norm_rms_epsilon"):
        config_from_metadata({k: v for k, v in META_270M.items() if "epsilon" not in k}, 100, "g", 4096)
    with pytest.raises(UsageError, match="final_logit_softcapping"):
        config_from_metadata({**META_270M, "gemma3.final_logit_softcapping": 30.0}, 100, "g", 4096)


@pytest.mark.parametrize("gtype, n_tokens", [(DECODE, 1), (PREFILL, 7)])
def test_270m_graph_census_equals_llama_cpp(gtype, n_tokens):
    model = create_model(_cfg(), with_data=False)
    res, ops = _census(model, GraphParams(n_tokens, 1, 1, gtype, 512, 256))
    assert res.graph.n_nodes == 727
    assert sum(ops.values()) == 511
    assert ops == {"MUL_MAT": 127, "RMS_NORM": 109, "MUL": 109, "ROPE": 36, "SET_ROWS": 36, "ADD": 36,
                   "SCALE": 19, "GLU": 18, "FLASH_ATTN_EXT": 18, "GET_ROWS": 3}
    assert sorted(_input_names(model, res)) == sorted([
        "inp_tokens", "inp_pos", "attn_inp_k_idxs", "attn_inp_v_idxs", "attn_inp_kq_mask", "attn_inp_k_idxs_swa",
        "attn_inp_v_idxs_swa", "attn_inp_kq_mask_swa", "inp_out_ids"])


def _input_names(model, res):
    rec = model.arena.rec
    return [rec[int(i)]["name"].decode() for i in res.graph.leafs if int(rec[int(i)]["flags"]) & TensorFlag.INPUT]


def test_each_layer_reads_its_cache_mask_and_rope_base():
    cfg = _cfg()
    model = create_model(cfg, with_data=False)
    res = build_graph(model, GraphParams(1, 1, 1, DECODE, 768, 512))
    rec, inp = model.arena.rec, res.inputs
    assert (inp.kq_mask.ne[0], inp.kq_mask_swa.ne[0]) == (768, 512)
    assert inp.kq_mask_swa.name == "attn_inp_kq_mask_swa"
    by_name = {rec[int(i)]["name"].decode(): int(i) for i in res.graph.nodes}
    for il in range(18):
        fa = model.arena.rec[by_name[f"__fattn__-{il}"]]
        want = inp.kq_mask_swa if cfg.is_swa(il) else inp.kq_mask
        assert int(fa["src"][3]) == want.addr
        k_view = model.arena.rec[model.arena.index(int(fa["src"][1]))]
        assert int(k_view["ne"][1]) == (512 if cfg.is_swa(il) else 768)      # permuted: (D, n_kv, H_kv)
        layer = model.layers[il]
        assert layer.k_cache.ne[1] == (1024 if cfg.is_swa(il) else 4096)
    rope = [r for r in (rec[int(i)] for i in res.graph.nodes) if int(r["op"]) == Op.ROPE]
    bases = [float(r["op_params"][5:6].view("f4")[0]) for r in rope]
    assert bases == [10000.0 if cfg.is_swa(il) else 1e6 for il in range(18) for _ in "QK"]
    assert all(int(r["op_params"][2]) == 2 for r in rope)                     # NEOX


def test_swa_full_sizes_the_swa_caches_as_the_global_one():
    model = create_model(config_from_metadata(META_270M, 262144, "g", 4096, swa_full=True), with_data=False)
    assert {lay.k_cache.ne[1] for lay in model.layers} == {4096}

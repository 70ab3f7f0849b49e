"""gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE): the preset gpt-oss-tiny, export-gguf, a gpt-oss-20b header, the
new ops on the CPU backend, and the oracle held against llama.cpp's own logits.

Which expectation comes from where: the node lists of one decode and one 3-token prefill are recorded from
llama.cpp (tests/data/nodes/gpt-oss-tiny-*.json, held node for node in test_upstream_nodes.py); the logits of
a 160-token prompt (past the 128-position window) are recorded from llama.cpp's CPU build on the exported F16
and MXFP4_MOE files (tests/data/gpt-oss-tiny-logits.npz, gpt-oss-tiny-mxfp4-logits.npz,
tools/record_llama_logits.py); the tensor list (load_arch_tensors),
the header's reading (load_arch_hparams) and the ops' formulas (ggml-cpu's swiglu_oai, add_id, the sinks in
flash attention) are from reading upstream's source."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from graphdiag.backends import cpu_ops
from graphdiag.config import resolve
from graphdiag.errors import UsageError
from graphdiag.model.arch import gpt_oss
from graphdiag.model.arch.common import Meta
from graphdiag.model.gguf_io import export_config, open_gguf
from graphdiag.model.presets import PRESETS, swa_pattern
from graphdiag.model.reference import Reference
from graphdiag.model.source import build_model
from graphdiag.runner import run
from support.cli import export_files

gguf = pytest.importorskip("gguf")

DATA = Path(__file__).resolve().parent.parent / "data"
TINY = PRESETS["gpt-oss-tiny"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_files(tmp_path_factory.mktemp("gpt-oss-gguf"), "gpt-oss-tiny", "wtype", ("f16", "mxfp4_moe"))


def _llama_cpp_tensors(n_layer, d, v, hd, n_head, n_kv, f, e) -> dict:
    """name -> ne of every tensor llama_model_openai_moe::load_arch_tensors creates (Q/K/V biases present)."""
    out = {"token_embd.weight": (d, v), "output_norm.weight": (d,), "output.weight": (d, v)}
    q, kv = hd * n_head, hd * n_kv
    for i in range(n_layer):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": (d,), p + "post_attention_norm.weight": (d,), p + "attn_q.weight": (d, q),
                p + "attn_k.weight": (d, kv), p + "attn_v.weight": (d, kv), p + "attn_q.bias": (q,),
                p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,), p + "attn_output.weight": (q, d),
                p + "attn_sinks.weight": (n_head,), p + "ffn_gate_inp.weight": (d, e),
                p + "ffn_gate_exps.weight": (d, f, e), p + "ffn_down_exps.weight": (f, d, e),
                p + "ffn_up_exps.weight": (d, f, e), p + "attn_output.bias": (d,), p + "ffn_gate_inp.bias": (e,),
                p + "ffn_gate_exps.bias": (f, e), p + "ffn_down_exps.bias": (d, e), p + "ffn_up_exps.bias": (f, e)}
    return out


def test_the_export_is_gpt_oss_as_llama_cpp_loads_it(exported):
    r = gguf.GGUFReader(exported["f16"])
    f = lambda k: r.fields[k].contents()
    assert f("general.architecture") == "gpt-oss" and f("gpt-oss.block_count") == 4
    assert (f("gpt-oss.expert_count"), f("gpt-oss.expert_used_count"), f("gpt-oss.expert_feed_forward_length")) == \
        (8, 4, 256)
    assert f("gpt-oss.attention.sliding_window") == 128
    assert (f("gpt-oss.rope.scaling.type"), f("gpt-oss.rope.scaling.factor"),
            f("gpt-oss.rope.scaling.original_context_length")) == ("yarn", 32.0, 4096)    # the 20b's YaRN
    assert "gpt-oss.attention.sliding_window_pattern" not in r.fields      # the default, 2, as the converter
    assert (f("gpt-oss.attention.key_length"), f("gpt-oss.attention.head_count_kv")) == (64, 2)
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    want = _llama_cpp_tensors(4, 256, 4096, 64, 8, 2, 256, 8)
    assert {n: s[:len(want[n])] for n, s in got.items()} == want
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert {types[n] for n in want if n.endswith((".bias", "norm.weight", "sinks.weight", "gate_inp.weight"))} == {"F32"}
    assert types["blk.0.ffn_gate_exps.weight"] == "F16"


def test_the_file_reads_back_as_the_preset(exported):
    cfg = open_gguf(str(exported["f16"].resolve())).cfg
    assert dataclasses.replace(cfg, name=TINY.name, norm_eps=1e-5) == export_config("gpt-oss-tiny", "gpt-oss") == TINY
    assert cfg.swa_layers == (True, False, True, False) == swa_pattern(4, 2)      # even layers slide
    assert (cfg.yarn_factor, cfg.yarn_orig_ctx, cfg.yarn()) == (32.0, 4096, TINY.yarn())
    assert (cfg.head_dim, cfg.n_embd_q, cfg.qkv_bias, cfg.moe_norm_w, cfg.rope_base_swa) == (64, 512, True, False, 1.5e5)


# the header of a real gpt-oss-20b GGUF (its HF converter's keys; tensor data aside)
GPT_OSS_20B = {"context_length": 131072, "embedding_length": 2880, "block_count": 24, "feed_forward_length": 2880,
               "attention.head_count": 64, "attention.head_count_kv": 8, "attention.key_length": 64,
               "attention.value_length": 64, "rope.freq_base": 150000.0, "attention.layer_norm_rms_epsilon": 1e-5,
               "expert_count": 32, "expert_used_count": 4, "expert_feed_forward_length": 2880,
               "attention.sliding_window": 128, "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
               "rope.scaling.original_context_length": 4096}


def _meta(keys: dict) -> Meta:
    shapes = _llama_cpp_tensors(keys["block_count"], keys["embedding_length"], 201088, 64, 64, 8, 2880, 32)
    values = {f"gpt-oss.{k}": v for k, v in keys.items()} | {"general.architecture": "gpt-oss"}
    return Meta(Path("gpt-oss-20b-mxfp4.gguf"), "gpt-oss", lambda k, d=None: values.get(k, d), set(shapes),
                lambda n: shapes.get(n))


def test_a_gpt_oss_20b_header_reads_as_llama_cpp_reads_it():
    cfg = gpt_oss.config(_meta(GPT_OSS_20B))
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff, cfg.head_dim, cfg.n_embd_q) == \
        (32, 4, 2880, 0, 64, 4096)
    assert cfg.swa_layers == swa_pattern(24, 2) and cfg.n_swa == 128 and cfg.rope_base_swa == 150000.0
    assert len(gpt_oss.tensors(cfg)) == 3 + 24 * 19
    y = cfg.yarn()          # llama_context: freq_scale 1/32, ext_factor 1, attn_factor ~1, betas 32 and 1
    assert (y.freq_scale, y.n_ctx_orig, y.ext_factor, y.beta_fast, y.beta_slow) == (1 / 32, 4096, 1.0, 32.0, 1.0)
    assert abs(y.attn_factor - 1.0) < 1e-6 and y.corr_dims(64, 150000.0) == (8.0, 18.0)
    plain = {k: v for k, v in GPT_OSS_20B.items() if not k.startswith("rope.scaling")}
    assert gpt_oss.config(_meta(plain)).yarn() is None
    with pytest.raises(UsageError, match="rope scaling .*'linear', factor 4.0"):
        gpt_oss.config(_meta(plain | {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}))
    with pytest.raises(UsageError, match="sliding_window is missing"):
        gpt_oss.config(_meta({k: v for k, v in plain.items() if k != "attention.sliding_window"}))


def test_the_oracle_is_llama_cpps_model_and_the_sinks_and_window_matter(exported):
    """The float64 oracle on the exported F16 file against llama.cpp's logits of the same 160 tokens (rows 0, 5,
    127, 128, 159: the window starts to drop positions at 128): within 2e-3 of the largest logit (llama.cpp's
    CPU rounds activations to F16 for F16 weights), the same argmax; without the sinks, the window or YaRN it
    is far off."""
    rec = np.load(DATA / "gpt-oss-tiny-logits.npz")
    m = build_model(str(exported["f16"]), "f16")

    def worst(ref) -> float:
        got = ref.prefill(rec["tokens"].tolist(), all_logits=True)[rec["rows"]]
        return float(np.max(np.abs(got - rec["logits"]).max(-1) / np.abs(rec["logits"]).max(-1)))

    plain = Reference(m)
    got = plain.prefill(rec["tokens"].tolist(), all_logits=True)[rec["rows"]]
    assert (got.argmax(-1) == rec["logits"].argmax(-1)).all()
    plain.seqs.clear()
    assert worst(plain) < 2e-3
    no_sinks = Reference(m)
    w = no_sinks.w
    no_sinks.w = lambda n: np.full(TINY.n_head, -np.inf) if n.endswith("attn_sinks.weight") else w(n)
    no_window = Reference(m)
    no_window.cfg = dataclasses.replace(no_window.cfg, n_swa=1 << 20)
    no_yarn = Reference(m)
    no_yarn.cfg = dataclasses.replace(no_yarn.cfg, yarn_factor=0.0)
    assert worst(no_sinks) > 0.1 and worst(no_window) > 0.1 and worst(no_yarn) > 0.1


def test_the_mxfp4_moe_export_is_llama_quants_mix(exported):
    """LLAMA_FTYPE_MOSTLY_MXFP4_MOE (38): the expert stacks MXFP4, every other 2-d weight Q8_0 (output and
    embedding included), 1-d tensors and the router F32."""
    r = gguf.GGUFReader(exported["mxfp4_moe"])
    assert r.fields["general.file_type"].contents() == 38
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert {t for n, t in types.items() if n.endswith("_exps.weight")} == {"MXFP4"}
    assert {t for n, t in types.items() if n.endswith(".weight") and "_exps" not in n and "norm" not in n
            and "sinks" not in n and "gate_inp" not in n} == {"Q8_0"}
    assert types["blk.1.ffn_gate_inp.weight"] == "F32"


def test_the_oracle_reads_the_mxfp4_file_as_llama_cpp(exported):
    """The oracle on the exported MXFP4_MOE file against llama.cpp's logits of the same 160 tokens: the same
    argmax in every row, within 2e-2 in most rows and 0.15 in all (llama.cpp's CPU multiplies Q8_0 and MXFP4
    weights by Q8_0-rounded activations, the oracle by Q8_1-rounded ones: recorded 1.4e-7 at row 0, about
    1e-2 at rows 5, 127 and 159, 9.9e-2 at row 128), where a misread block or a lost feature is far off."""
    rec = np.load(DATA / "gpt-oss-tiny-mxfp4-logits.npz")
    ref = Reference(build_model(str(exported["mxfp4_moe"]), "f16"), q8_1_activations=True)
    got = ref.prefill(rec["tokens"].tolist(), all_logits=True)[rec["rows"]]
    assert (got.argmax(-1) == rec["logits"].argmax(-1)).all()
    err = np.abs(got - rec["logits"]).max(-1) / np.abs(rec["logits"]).max(-1)
    assert np.median(err) < 2e-2 and err.max() < 0.15


@pytest.mark.parametrize("wtype", ["f16", "mxfp4_moe"])
def test_the_cpu_backend_meets_the_oracle(wtype):
    r = run(resolve({"nvtx": False, "oracle": True, "backend": "cpu", "model": "gpt-oss-tiny", "wtype": wtype,
                     "steps": 3, "prompt_tokens": 6, "batch": 2}, environ={}))
    checks = [e for e in r.events if type(e).__name__ == "OracleCheck"]
    assert checks and not r.failures and max(e.rel_err for e in checks) < 5e-4


def test_swiglu_oai_clamps_the_gate_from_above_and_up_both_ways():
    gate = np.array([-20.0, -1.0, 0.0, 3.0, 7.0, 50.0], np.float32)
    up = np.array([-50.0, 2.0, 1.0, -8.0, 0.5, 9.0], np.float32)
    x, y = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
    want = x / (1 + np.exp(-1.702 * x)) * (y + 1)
    got = cpu_ops.glu(3, gate, up, limit=7.0, alpha=1.702)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(gpt_oss.swiglu_oai(gate.astype(np.float64), up), want, rtol=1e-6)


def test_add_id_adds_each_slot_its_experts_row():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 3, 2, 5)).astype(np.float32)
    b = rng.standard_normal((1, 1, 4, 5)).astype(np.float32)
    ids = np.array([[[[3, 0], [1, 1], [2, 3]]]], np.int32)
    got = cpu_ops.add_id(a, b, ids)
    for t in range(3):
        for i in range(2):
            np.testing.assert_array_equal(got[0, t, i], a[0, t, i] + b[0, 0, ids[0, 0, t, i]])


def test_a_sink_joins_the_denominator_only():
    """A sink of -inf is no sink; a sink s on one visible key of score 0 gives that key weight 1 / (1 + e^s)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 4, 8), (1, 5, 2, 8), (1, 5, 2, 8)))
    mask = np.zeros((1, 1, 2, 5), np.float32)
    plain = cpu_ops.flash_attn_ext(q, k, v, mask, 0.3)
    np.testing.assert_allclose(cpu_ops.flash_attn_ext(q, k, v, mask, 0.3, np.full(4, -np.inf, np.float32)), plain)
    one = np.full((1, 1, 2, 5), -np.inf, np.float32)
    one[..., 2] = 0
    sinks = np.array([0.0, 1.0, -2.0, 30.0], np.float32)
    got = cpu_ops.flash_attn_ext(q, k, v, one, 0.0, sinks)            # scale 0: the visible key's score is 0
    want = v[0, 2][np.arange(4) // 2][None, None] / (1 + np.exp(sinks))[None, None, :, None]
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("wtype,batch", [("f16", 1), ("f16", 2), ("mxfp4_moe", 2)])
def test_the_simulated_gpu_meets_the_oracle(wtype, batch):
    """The preset on the simulated GPU: ADD_ID, the clamped SwiGLU, the sinks (folded in by the attention's
    combine) and YaRN on their kernels' twins, the experts' weighted sum fused as upstream's, and the experts'
    biases fused into their mat-vecs where upstream's paths take them (F16 experts at one token, MXFP4 up to
    7 on Turing and newer: gate/up + biases + GLU as one kernel, down + bias as one); within the oracle's bound
    (MXFP4_MOE: MXFP4 experts and Q8_0 on upstream's MMVQ paths, Q8_1 activations); replays verified."""
    r = run(resolve({"nvtx": False, "oracle": True, "backend": "sim", "model": "gpt-oss-tiny", "wtype": wtype,
                     "steps": 3, "prompt_tokens": 6, "batch": batch, "verify": True}, environ={}))
    checks = [e for e in r.events if type(e).__name__ == "OracleCheck"]
    assert checks and not r.failures and all(e.ok for e in checks)
    fused = {e.pattern for e in r.events if type(e).__name__ == "FusionApplied"}
    biased = {"mul_mat_id_vec+add_id+glu", "mul_mat_id_vec+add_id"}
    assert "moe_weighted_reduction" in fused and (biased <= fused) == (wtype != "f16" or batch == 1)
    assert all(e.ok for e in r.events if type(e).__name__ == "VerifyResult")


def test_the_yarn_rope_is_the_float64_formula():
    """cpu_ops.rope with the 20b's YaRN (what the CPU backend and the kernels' twin run) against the oracle's
    float64 yarn_neox: pairs below, inside and above the ramp (corr dims 8 and 18 of 32), positions to 4000."""
    y = TINY.yarn()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 12, 4, 64)).astype(np.float32)
    pos = np.array([0, 1, 2, 5, 17, 100, 127, 128, 500, 1000, 2047, 4000], np.int32)
    got = cpu_ops.rope(x, pos, 64, 150000.0, y.freq_scale, 2, (y.ext_factor, y.attn_factor, *y.corr_dims(64, 150000.0)))
    want = gpt_oss.yarn_neox(x[0].astype(np.float64), pos, 150000.0, y)
    np.testing.assert_allclose(got[0], want, atol=2e-3 * np.abs(want).max())   # float32 angles up to 4000
    np.testing.assert_allclose(got[0, :5], want[:5], atol=2e-6 * np.abs(want).max())


def _decode_graph():
    from graphdiag.model.build import DECODE, GraphParams, build_graph
    from graphdiag.model.weights import create_model
    return build_graph(create_model(TINY, with_data=False), GraphParams(1, 1, 1, DECODE, 256, 256)).graph


def test_the_delayed_router_fusion_matches_and_the_memory_check_decides():
    """ggml-cuda's top-k MoE fusion in its delayed-softmax form matches each layer's router at its ARGSORT
    (ARGSORT, VIEW, GET_ROWS, RESHAPE, SOFT_MAX, RESHAPE; ids at +1, weights at +5) on a graph without memory;
    ggml_cuda_check_fusion_memory_ranges then refuses it where the SOFT_MAX's output lies over the freed
    logits that the GET_ROWS reads through their reshape (not the ARGSORT's own source, the only one that may
    alias), which is where ggml-alloc puts it in gpt-oss-tiny's graphs: the simulated runs fuse no router."""
    from graphdiag.backends.gpu.fusion import TOPK_MOE_DELAYED, _topk_moe_delayed_fuses, fusion_plan
    from graphdiag.backends.gpu.fusion_graph import consumer_counts
    g = _decode_graph()
    names = [n.name for n in g.iter_nodes()]
    at = [names.index(f"ffn_moe_argsort-{il}") for il in range(TINY.n_layer)]
    plan = fusion_plan(g, 900)
    assert all(plan[i].pattern == TOPK_MOE_DELAYED and plan[i].absorbed == 5 for i in at)
    i, consumers = at[0], consumer_counts(g)
    for k, addr in zip(range(-2, 6), (0x1000, 0x1000, 0x2000, 0x2000, 0x3000, 0x3000, 0x4000, 0x4000)):
        g.node(i + k).data = addr       # probs, its reshape, argsort, ids, get_rows, reshape, softmax, weights
    assert _topk_moe_delayed_fuses(g, i, consumers, "0c1e57098") == 6
    g.node(i + 4).data = g.node(i + 5).data = 0x1000           # the softmax over the freed logits
    assert _topk_moe_delayed_fuses(g, i, consumers, "0c1e57098") == 0


def test_the_delayed_router_kernel_is_the_unfused_ops():
    """topk_moe_f32 with ip[2] (its twin) against ARGSORT's first k of the logits and SOFT_MAX of the k kept."""
    from graphdiag.backends.abi import new_params, set_desc
    from graphdiag.backends.sim_kernels import run_kernel
    from graphdiag.backends.sim_view import AddressSpace
    from graphdiag.ir.dtypes import GGMLType as G
    rng = np.random.default_rng(4)
    for n, k, t in ((8, 4, 3), (64, 40, 2)):
        logits = (rng.standard_normal((t, n)) * 3).astype(np.float32)
        space = AddressSpace(0x7F00_0000_0000)
        bufs = [np.zeros((t, k), np.float32), np.full((t, n), -1, np.int32), logits]
        addrs = []
        for b in bufs:
            addrs.append(space.alloc(b.nbytes))
            space.bytes(addrs[-1], b.nbytes)[:] = b.view(np.uint8).reshape(-1)
        p = new_params()
        set_desc(p, 0, addrs[0], int(G.F32), (k, t, 1, 1), (4, 4 * k, 4 * k * t, 4 * k * t))
        set_desc(p, 1, addrs[1], int(G.I32), (k, t, 1, 1), (4, 4 * n, 4 * n * t, 4 * n * t))
        set_desc(p, 2, addrs[2], int(G.F32), (n, t, 1, 1), (4, 4 * n, 4 * n * t, 4 * n * t))
        p["ip"][:3], p["fp"][0] = (k, 0, 1), 1.0
        run_kernel(space, "topk_moe_f32", p)
        ids = space.ndarray(addrs[1], int(G.I32), (n, t, 1, 1), (4, 4 * n, 4 * n * t, 4 * n * t)).reshape(t, n)[:, :k]
        w = space.ndarray(addrs[0], int(G.F32), (k, t, 1, 1), (4, 4 * k, 4 * k * t, 4 * k * t)).reshape(t, k)
        want_ids = cpu_ops.argsort(logits, True)[:, :k]
        assert np.array_equal(ids, want_ids)
        np.testing.assert_allclose(w, cpu_ops.soft_max(np.take_along_axis(logits, want_ids, -1)), rtol=1e-6)

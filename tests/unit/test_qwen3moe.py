"""qwen3moe (issue 50, point 3): Qwen3-30B-A3B's architecture as llama.cpp 0c1e57098 builds it
(src/models/qwen3moe.cpp: qwen3's QK-norm attention, build_moe_ffn with LLM_FFN_SILU, norm_w true, w_scale
hparams.expert_weights_scale — never read for qwen3moe, so 0 — and softmax gating; no shared expert), its
preset qwen3moe-tiny, export-gguf, a real Qwen3-MoE header, and the oracle on the simulator.

Which expectation comes from where: the node lists of one decode and one 3-token prefill are recorded from
llama.cpp (tests/data/nodes/qwen3moe-tiny-*.json, held node for node in test_upstream_nodes.py); the per-layer
op sequence and names below, the tensor list (load_arch_tensors) and the header's reading (load_arch_hparams)
are from reading upstream's source; the 30B's node count extrapolates the recorded list by build_moe_ffn's
loop (k views, k - 1 ADDs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.ir.ops import Op
from graphdiag.model.arch import qwen3moe
from graphdiag.model.arch.common import Meta
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.gguf_io import export_config, open_gguf
from graphdiag.model.presets import PRESETS
from graphdiag.model.source import build_model
from graphdiag.model.weights import create_file_model, create_model
from graphdiag.runner import run
from support.arch_gguf import write_arch_gguf
from support.cli import export_files, one_line

gguf = pytest.importorskip("gguf")

NODES = Path(__file__).resolve().parent.parent / "data" / "nodes"
TINY = PRESETS["qwen3moe-tiny"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_files(tmp_path_factory.mktemp("qwen3moe-gguf"), "qwen3moe-tiny", "wtype", ("f16", "q4_k"))


def _llama_cpp_tensors(n_layer: int, d: int, v: int, hd: int, n_head: int, n_kv: int, f: int, e: int) -> dict:
    """name -> ne of every tensor llama_model_qwen3moe::load_arch_tensors creates (no output bias, no fused
    QKV, no shared expert): its loader refuses a file holding any other, so this is the file's whole list."""
    out = {"token_embd.weight": (d, v), "output_norm.weight": (d,), "output.weight": (d, v)}
    for i in range(n_layer):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": (d,), p + "attn_q.weight": (d, hd * n_head), p + "attn_k.weight": (d, hd * n_kv),
                p + "attn_v.weight": (d, hd * n_kv), p + "attn_output.weight": (hd * n_head, d),
                p + "attn_k_norm.weight": (hd,), p + "attn_q_norm.weight": (hd,), p + "ffn_norm.weight": (d,),
                p + "ffn_gate_inp.weight": (d, e), p + "ffn_gate_exps.weight": (d, f, e),
                p + "ffn_down_exps.weight": (f, d, e), p + "ffn_up_exps.weight": (d, f, e)}
    return out


@pytest.mark.parametrize("wtype", ["f16", "q4_k"])
def test_the_export_is_qwen3moe_as_llama_cpp_loads_it(exported, wtype):
    r = gguf.GGUFReader(exported[wtype])
    f = lambda k: r.fields[k].contents()
    assert f("general.architecture") == "qwen3moe" and f("qwen3moe.block_count") == 4
    assert (f("qwen3moe.expert_count"), f("qwen3moe.expert_used_count")) == (16, 4)
    assert f("qwen3moe.expert_feed_forward_length") == 256       # the experts' width, as the HF converter writes it
    assert "qwen3moe.feed_forward_length" not in r.fields          # optional upstream; the preset has no dense FFN
    assert (f("qwen3moe.attention.key_length"), f("qwen3moe.attention.head_count_kv")) == (128, 2)
    assert f("tokenizer.ggml.model") == "gpt2"
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    want = _llama_cpp_tensors(4, 512, 4096, 128, 8, 2, 256, 16)
    assert {n: s[:len(want[n])] for n, s in got.items()} == want and all(len(s) <= 3 for s in got.values())
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["blk.3.attn_q_norm.weight"] == "F32"
    assert {types[f"blk.{i}.ffn_{n}_exps.weight"] for i in range(4) for n in ("gate", "up", "down")} == {wtype.upper()}


def _nodes(m, t: int) -> list[tuple]:
    g = build_graph(m, GraphParams(t, 1, 1, DECODE if t == 1 else PREFILL, 256)).graph
    return [(Op(n.op).name, int(n.type), tuple(n.ne), n.name) for n in g.iter_nodes()]


def test_the_file_reads_back_as_the_preset_with_the_same_graphs(exported):
    cfg = open_gguf(str(exported["f16"].resolve())).cfg
    assert (cfg.arch, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff, cfg.moe_norm_w) == \
        ("qwen3moe", 16, 4, 256, 0, True)
    assert (cfg.head_dim, cfg.n_embd_q, cfg.n_embd_kv, cfg.rope_type) == (128, 1024, 256, 2)
    assert dataclasses.replace(cfg, name=TINY.name, norm_eps=1e-6) == export_config("qwen3moe-tiny", "qwen3moe") == TINY
    for t in (1, 7):
        assert _nodes(build_model(str(exported["f16"]), "f16", with_data=False), t) == \
            _nodes(create_model(TINY, with_data=False), t)


# src/models/qwen3moe.cpp and build_moe_ffn (src/llama-graph.cpp) at 0c1e57098, read: one layer's nodes in
# ggml_build_forward_expand's order (the recorded lists agree: tests/data/nodes/qwen3moe-tiny-*.json)
ATTN = ["RMS_NORM", "MUL",                                    # build_norm(inpL, attn_norm) "attn_norm"
        "MUL_MAT", "RESHAPE", "RMS_NORM", "MUL", "ROPE",     # Qcur, its head reshape, "Qcur_normed", rope
        "MUL_MAT", "RESHAPE",                                # Vcur
        "MUL_MAT", "RESHAPE", "RMS_NORM", "MUL", "ROPE",     # Kcur, "Kcur_normed", rope (K last: cache write next)
        "VIEW", "SET_ROWS", "VIEW", "SET_ROWS",              # cpy_k, cpy_v
        "VIEW", "PERMUTE", "VIEW", "PERMUTE", "VIEW", "PERMUTE", "FLASH_ATTN_EXT", "RESHAPE",   # build_attn_mha
        "MUL_MAT", "ADD"]                                    # wo (unnamed upstream), "ffn_inp"
MOE = ["RMS_NORM", "MUL",                                     # "ffn_norm"
       "MUL_MAT", "SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS",   # logits, probs, top-k, weights
       "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE",    # norm_w true (no SCALE: w_scale 0)
       "RESHAPE", "MUL_MAT_ID", "MUL_MAT_ID", "GLU", "MUL_MAT_ID", "MUL",  # gate, up, SWIGLU, down, weighted
       "VIEW", "VIEW", "VIEW", "VIEW", "ADD", "ADD", "ADD",  # k = 4 views, then the k - 1 sums
       "ADD"]                                                 # the residual: "l_out" (build_cvec passes it on)


def test_a_layer_is_qwen3s_attention_and_build_moe_ffn():
    g = build_graph(create_model(TINY, with_data=False), GraphParams(1, 1, 1, DECODE, 256)).graph
    nodes = list(g.iter_nodes())
    names = [n.name for n in nodes]
    for il in range(3):                    # the last layer adds the two output-row GET_ROWS
        a = names.index(f"attn_norm-{il}") - 1
        b = names.index(f"l_out-{il}")
        assert [Op(n.op).name for n in nodes[a:b + 1]] == ATTN + MOE
    at = names.index("ffn_moe_weighted-1")
    assert names[at + 5: at + 8] == ["ffn_moe_sum1-1", "ffn_moe_sum2-1", "ffn_moe_out-1"]
    assert [nodes[at + 1 + i].view_offs for i in range(4)] == [i * 512 * 4 for i in range(4)]
    assert not any(n.op == Op.SCALE for n in nodes)
    q = nodes[names.index("Qcur-0")]
    assert q.ne[:2] == (1024, 1) and nodes[names.index("ffn_moe_gate-0")].ne[:3] == (256, 4, 1)


# the header of a real Qwen3-30B-A3B GGUF (its HF converter's keys; tensor data aside)
QWEN3_30B_A3B = {"context_length": 40960, "embedding_length": 2048, "block_count": 48, "feed_forward_length": 6144,
                 "attention.head_count": 32, "attention.head_count_kv": 4, "attention.key_length": 128,
                 "attention.value_length": 128, "rope.freq_base": 1e6, "attention.layer_norm_rms_epsilon": 1e-6,
                 "expert_count": 128, "expert_used_count": 8, "expert_feed_forward_length": 768}


def _meta(keys: dict, n_vocab: int = 151936) -> Meta:
    shapes = _llama_cpp_tensors(keys["block_count"], keys["embedding_length"], n_vocab, 128,
                                keys["attention.head_count"], keys["attention.head_count_kv"], 768, 128)
    values = {f"qwen3moe.{k}": v for k, v in keys.items()} | {"general.architecture": "qwen3moe"}
    return Meta(Path("Qwen3-30B-A3B-Q4_K_M.gguf"), "qwen3moe", lambda k, d=None: values.get(k, d), set(shapes),
                lambda n: shapes.get(n))


def test_a_qwen3_30b_a3b_header_reads_as_llama_cpp_reads_it():
    cfg = qwen3moe.config(_meta(QWEN3_30B_A3B))
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_vocab) == (48, 2048, 32, 4, 128, 151936)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff, cfg.moe_norm_w) == (128, 8, 768, 0, True)
    assert (cfg.rope_base, cfg.rope_type, cfg.n_ctx, cfg.tied_output) == (1e6, 2, 4096, False)
    assert {s.name: s.ne for s in qwen3moe.tensors(cfg)} == _llama_cpp_tensors(48, 2048, 151936, 128, 32, 4, 768, 128)
    # load_arch_tensors' fallback: no expert_feed_forward_length -> n_ff / n_expert_used
    alt = {k: v for k, v in QWEN3_30B_A3B.items() if k != "expert_feed_forward_length"}
    assert qwen3moe.config(_meta(alt)).n_ff_exp == 6144 // 8
    # keys qwen3moe's loader never reads change nothing (its gating, norm and scale are fixed in its graph)
    ignored = QWEN3_30B_A3B | {"expert_gating_func": 2, "expert_weights_norm": False, "expert_weights_scale": 2.5}
    assert qwen3moe.config(_meta(ignored)) == cfg


def test_the_30b_graph_has_the_recorded_layer_with_its_eight_experts_summed():
    """The 30B's decode graph (metadata only) against the recorded tiny list: the same head and tail, each
    layer the recorded one with 2 x (8 - 4) more nodes (build_moe_ffn's k views and k - 1 ADDs)."""
    up = [n["name"] for n in json.loads((NODES / "qwen3moe-tiny-1.json").read_text())["nodes"]]
    per_layer = up.index("l_out-1") - up.index("l_out-0")
    head = up.index("l_out-0") + 1 - per_layer              # the embedding
    tail = len(up) - head - 4 * per_layer                    # the last layer's output rows, the output norm and head
    assert (head, per_layer, tail) == (1, 55, 5)
    cfg = qwen3moe.config(_meta(QWEN3_30B_A3B))
    g = build_graph(create_model(cfg, with_data=False), GraphParams(1, 1, 1, DECODE, 256)).graph
    assert g.n_nodes == head + 48 * (per_layer + 2 * (8 - 4)) + tail == 3030
    assert sum(n.op == Op.MUL_MAT_ID for n in g.iter_nodes()) == 3 * 48


@pytest.mark.parametrize("extra,needle", [
    ({"expert_count": 0, "expert_used_count": 0}, "qwen3moe.expert_count is missing or 0"),
    ({"expert_feed_forward_length": 0, "feed_forward_length": 0}, "the experts' width is unknown"),
    ({"expert_group_count": 4}, "qwen3moe.expert_group_count 4: build_moe_ffn's grouped expert selection"),
])
def test_a_qwen3moe_header_graphdiag_cannot_build_is_refused(extra, needle):
    with pytest.raises(Exception) as e:
        qwen3moe.config(_meta(QWEN3_30B_A3B | extra))
    assert type(e.value).__name__ == "UsageError" and needle in str(e.value)


def test_a_file_with_a_dense_width_too_sizes_the_experts_by_their_own(tmp_path, capsys):
    """A qwen3moe file that gives feed_forward_length as well (as the 30B's does): the experts are
    expert_feed_forward_length wide (not n_ff / n_expert_used), and the file runs on the simulator."""
    mini = dataclasses.replace(PRESETS["qwen3moe-tiny"], n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_vocab=512,
                               n_expert=4, n_expert_used=2, n_ff_exp=128, n_embd_head=64, n_ctx=512)
    p = tmp_path / "ff.gguf"
    write_arch_gguf(p, "qwen3moe", dataclasses.replace(mini, n_ff=512))   # writes both keys
    r = gguf.GGUFReader(p)
    assert r.fields["qwen3moe.feed_forward_length"].contents() == 512
    assert r.fields["qwen3moe.expert_feed_forward_length"].contents() == 128
    cfg = open_gguf(str(p.resolve())).cfg
    assert cfg.n_ff_exp == 128 and cfg.n_ff == 0
    assert main(["run", "--backend", "sim", "--model", str(p), "--steps", "3", "--prompt-tokens", "5",
                 "--oracle", "--verify"]) == 0
    assert "0 over the bound" in capsys.readouterr().out


@pytest.mark.parametrize("model,arch,needle", [
    ("tiny", "qwen3moe", "cannot write dense preset tiny as qwen3moe: llama.cpp's qwen3moe has experts only "
                         "(use --arch llama, qwen2, qwen3, gemma3)"),
    ("qwen3moe-tiny", "qwen3", "cannot write MoE preset qwen3moe-tiny as qwen3: llama.cpp's qwen3 has no experts "
                               "(use --arch llama, qwen3moe, gpt-oss)"),
])
def test_export_refuses_what_the_architecture_cannot_express(tmp_path, capsys, model, arch, needle):
    out = tmp_path / "x.gguf"
    line = one_line(capsys, ["export-gguf", "--model", model, "--arch", arch, str(out)])
    assert needle in line and not out.exists()


def test_export_writes_the_preset_as_qwen3moe_unless_told(tmp_path, capsys):
    assert main(["export-gguf", "--model", "qwen3moe-tiny", str(tmp_path / "q.gguf")]) == 0
    assert "qwen3moe-tiny as qwen3moe" in capsys.readouterr().out
    assert main(["export-gguf", "--model", "qwen3moe-tiny", "--arch", "llama", str(tmp_path / "l.gguf")]) == 0
    assert open_gguf(tmp_path / "l.gguf").cfg.arch == "llama"          # the same experts as llama's MoE


def _oracle_ok(settings: dict) -> list:
    r = run(resolve({"nvtx": False, "oracle": True, **settings}, environ={}))
    checks = [e for e in r.events if type(e).__name__ == "OracleCheck"]
    assert checks and not r.failures, [(e.step, e.rel_err, e.bound) for e in checks if not e.ok]
    return checks


@pytest.mark.parametrize("wtype", ["f16", "q8_0", "q4_k"])
def test_the_simulated_run_meets_the_oracle(wtype):
    """The preset on the simulated GPU (fused router with its norm, weighted reduction of 4 experts, the QK-norm
    + rope fusions) at 1 and 2 sequences, each step's logits within the oracle's bound."""
    for batch in (1, 2):
        _oracle_ok({"backend": "sim", "model": "qwen3moe-tiny", "wtype": wtype, "steps": 3, "prompt_tokens": 6,
                    "batch": batch, "verify": True})


def test_the_simulated_run_meets_the_oracle_at_four_sequences():
    """4 sequences of Q8_0, 8 steps: the simulated GPU's Q8_1 activations flip a near-tie of the top 4 (the
    oracle's 4th and 5th router logits 1e-3 apart), which the oracle follows (oracle_router) instead of
    failing the step (0.147 against a bound of 0.057 without it: docs/commands/run.md)."""
    checks = _oracle_ok({"backend": "sim", "model": "qwen3moe-tiny", "wtype": "q8_0", "steps": 8,
                         "prompt_tokens": 16, "batch": 4})
    assert sum(e.followed for e in checks) >= 1


def test_the_cpu_backend_meets_the_oracle_at_four_sequences():
    """The graph's arithmetic, node by node in float: within 1e-3 at 4 sequences of Q8_0 (no Q8_1 rounding, so
    no twin and no expert choice to follow)."""
    checks = _oracle_ok({"backend": "cpu", "model": "qwen3moe-tiny", "wtype": "q8_0", "steps": 3, "prompt_tokens": 6,
                         "batch": 4})
    assert max(e.rel_err for e in checks) < 1e-3 and not any(e.followed for e in checks)


def test_the_exported_file_runs_on_the_simulator_with_the_fused_router(exported):
    cfg = resolve({"backend": "sim", "model": str(exported["q4_k"]), "steps": 4, "verify": True, "oracle": True,
                   "nvtx": False}, environ={})
    r = run(cfg)
    fused = {e.pattern for e in r.events if type(e).__name__ == "FusionApplied"}
    assert {"topk_moe", "moe_weighted_reduction"} <= fused
    assert all(e.ok for e in r.events if type(e).__name__ == "OracleCheck") and not r.failures
    verifies = [e for e in r.events if type(e).__name__ == "VerifyResult"]
    assert verifies and all(e.ok for e in verifies)

"""graphdiag's llama, qwen2, qwen3, llama-MoE, qwen3moe, gpt-oss and Gemma 3 graphs node for node against llama.cpp's
own.

Each fixture in tests/data/nodes/ is the node list llama.cpp 0c1e57098's scheduler ran for one llama_decode
(tools/record_llama_nodes.py: cb_eval, flash attention on, unified KV cache, the last token's logits only) on
a file written by `graphdiag export-gguf --model PRESET --arch ARCH` (seed 0, F16). The qwen3moe-tiny
and gpt-oss-tiny fixtures were recorded on a CPU build of llama-cpp-python 0.3.36 (buffers "CPU", one split;
llama-cpp-python's default swa_full, so gpt-oss's SWA cache has n_ctx cells and the test builds it so); the others on
CUDA (tiny-qwen3 recorded on the CPU build too lists the same nodes). The test writes the same
file, builds graphdiag's graph for the same batch and compares op, type, ne and name of every node, in order.

Allowed differences, each an exact predicate:
- unnamed_upstream: a node upstream's graph code never names is called `node_<its index>` by ggml
  (ggml_visit_parents); graphdiag gives it a label instead (UNNAMED_LABELS: flash attention's result, qwen2's
  and qwen3's attention output mat-mul, the last layer's two output-row GET_ROWS, the ADDs summing the experts
  before the last one, `ffn_moe_out`, where more than two are used; gpt-oss's attention output mat-mul before
  its bias ADD, the softmax of its router's top-k logits, its one output-row GET_ROWS after the last layer;
  Gemma 3's scaled Q, `Qcur_scaled`). Op, type and ne still match. A name ggml derived from such a node
  (`node_9 (view) (permuted)`: build_attn expands Q, so ggml names it, before build_attn_mha views it) is
  graphdiag's label of the same node with the same suffixes.
- The recorded `buffer` and `split` are not compared: a CUDA build puts the embedding's GET_ROWS in a CPU split
  of its own (token_embd stays in host memory), which moves no node (the list is the same on either build).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from graphdiag.ir.dtypes import GGMLType
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.gguf_io import export_config, export_gguf
from graphdiag.model.presets import weight_type
from graphdiag.model.source import build_model
from graphdiag.model.weights import create_model

NODES = Path(__file__).resolve().parent.parent / "data" / "nodes"
FILES = {"tiny-llama": ("tiny", "llama"), "tiny-qwen2": ("tiny", "qwen2"), "tiny-qwen3": ("tiny", "qwen3"),
         "moe-tiny": ("moe-tiny", "llama"), "qwen3moe-tiny": ("qwen3moe-tiny", "qwen3moe"),
         "gpt-oss-tiny": ("gpt-oss-tiny", "gpt-oss"), "gemma3-tiny": ("gemma3-tiny", "gemma3")}
N_KV = 256          # an empty cache's n_kv (llama.cpp pads the cells in use to 256)
# graphdiag's labels for the nodes upstream leaves unnamed, by op (the layer number after the dash)
UNNAMED_LABELS = {"FLASH_ATTN_EXT": re.compile(r"__fattn__-\d+"), "MUL_MAT": re.compile(r"(attn_out|kqv_wo)-\d+"),
                  "GET_ROWS": re.compile(r"(attn_out_rows|inp_rows|l_out_rows)-\d+"),
                  "ADD": re.compile(r"ffn_moe_sum\d+-\d+"), "SOFT_MAX": re.compile(r"ffn_moe_weights_sm-\d+"),
                  "SCALE": re.compile(r"Qcur_scaled-\d+")}
# a name ggml derived from an unnamed node's: "node_<j>" then ggml's view / permute / reshape suffixes
DERIVED = re.compile(r"node_(\d+)((?: \((?:view|permuted|reshaped)\))+)")


def unnamed_upstream(i: int, up: list[dict], ours: list[dict]) -> bool:
    """Node i is one upstream never names (ggml called it node_<i>) and graphdiag's label for it is its own
    label for that op; or upstream's name is derived from such a node j < i (`node_<j> (view) (permuted)`:
    ggml named node j when build_attn expanded it, before the view was made) and graphdiag's is its label of
    node j with the same suffixes."""
    u, o = up[i], ours[i]
    if u["name"] == f"node_{i}":
        label = UNNAMED_LABELS.get(u["op"])
        return label is not None and label.fullmatch(o["name"]) is not None
    m = DERIVED.fullmatch(u["name"])
    if m is None or int(m.group(1)) >= i:
        return False
    j = int(m.group(1))
    return unnamed_upstream(j, up, ours) and o["name"] == ours[j]["name"] + m.group(2)


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """The files the fixtures were recorded on, written again (export-gguf, seed 0, F16)."""
    out = {}
    root = tmp_path_factory.mktemp("nodes")
    for name, (preset, arch) in FILES.items():
        path = root / f"{name}.gguf"
        export_gguf(create_model(export_config(preset, arch), weight_type("f16"), seed=0), str(path), preset)
        out[name] = path
    return out


def graphdiag_nodes(path: Path, n_tokens: int) -> list[dict]:
    """graphdiag's graph for one sequence's n_tokens at positions 0.., the last token's logits only."""
    m = build_model(str(path), "f16", with_data=False, swa_full=True)
    n_kv_swa = N_KV if getattr(m.cfg, "n_swa", 0) > 0 else 0
    b = build_graph(m, GraphParams(n_tokens, 1, 1, DECODE if n_tokens == 1 else PREFILL, N_KV, n_kv_swa))
    return [{"op": t.op.name, "type": GGMLType(t.type).name.lower(), "ne": list(t.ne), "name": t.name}
            for t in b.graph.iter_nodes()]


def assert_upstreams(up: list[dict], ours: list[dict]) -> None:
    """graphdiag's nodes are upstream's: op, type and ne of each in order, its name or an allowed label."""
    assert len(ours) == len(up)
    for i, (u, o) in enumerate(zip(up, ours)):
        assert (o["op"], o["type"], o["ne"]) == (u["op"], u["type"], u["ne"]), f"node {i}: {o} vs upstream {u}"
        assert o["name"] == u["name"] or unnamed_upstream(i, up, ours), f"node {i}: {o['name']!r} vs upstream {u}"


@pytest.mark.parametrize("n_tokens", [1, 3])
@pytest.mark.parametrize("name", list(FILES))
def test_graph_is_upstreams_node_for_node(gguf_files, name, n_tokens):
    fixture = json.loads((NODES / f"{name}-{n_tokens}.json").read_text())
    assert fixture["recorded"]["n_tokens"] == n_tokens and fixture["recorded"]["n_outputs"] == 1
    assert_upstreams(fixture["nodes"], graphdiag_nodes(gguf_files[name], n_tokens))


@pytest.mark.parametrize("n_tokens", [1, 3])
def test_gemma3_file_is_upstreams_node_for_node(gemma3_file, n_tokens):
    """The real Gemma 3 270M file (Q4_K_M; its tensors keep their types) against llama.cpp's nodes on it."""
    fixture = json.loads((NODES / f"gemma3-270m-{n_tokens}.json").read_text())
    assert fixture["recorded"]["model"] == gemma3_file.name and fixture["recorded"]["n_tokens"] == n_tokens
    assert_upstreams(fixture["nodes"], graphdiag_nodes(gemma3_file, n_tokens))


def _at(i: int, up: dict, ours: dict) -> bool:
    """unnamed_upstream on node i alone (the nodes before it unnamed on neither side)."""
    filler = {"op": "NONE", "name": "x"}
    return unnamed_upstream(i, [filler] * i + [up], [filler] * i + [ours])


def test_unnamed_upstream_is_exact():
    """The predicate allows a label only where upstream's name is exactly node_<i> of an op that has one."""
    mm = {"op": "MUL_MAT", "name": "node_26"}
    assert _at(26, mm, {"name": "attn_out-0"})
    assert not _at(27, mm, {"name": "attn_out-0"})               # another index
    assert not _at(26, mm, {"name": "ffn_out-0"})                # not the label of the op
    assert not _at(26, {"op": "ADD", "name": "node_26"}, {"name": "attn_out-0"})
    assert not _at(3, {"op": "MUL_MAT", "name": "Qcur-0"}, {"name": "attn_out-0"})
    add = {"op": "ADD", "name": "node_52"}
    assert _at(52, add, {"name": "ffn_moe_sum1-0"})
    assert not _at(52, add, {"name": "ffn_moe_out-0"})           # upstream names the last sum
    assert not _at(52, add, {"name": "l_out-0"})


def test_derived_names_follow_the_unnamed_node():
    """A name ggml derived from an unnamed node (gemma3's scaled Q: `node_9 (view) (permuted)`) matches only
    graphdiag's label of that same node with the same suffixes."""
    up = [{"op": "NONE", "name": "x"}] * 9 + [{"op": "SCALE", "name": "node_9"},
                                              {"op": "VIEW", "name": "node_9 (view)"},
                                              {"op": "PERMUTE", "name": "node_9 (view) (permuted)"}]
    ours = [{"name": "x"}] * 9 + [{"name": "Qcur_scaled-0"}, {"name": "Qcur_scaled-0 (view)"},
                                  {"name": "Qcur_scaled-0 (view) (permuted)"}]
    assert all(unnamed_upstream(i, up, ours) for i in (9, 10, 11))
    assert not unnamed_upstream(11, up, ours[:11] + [{"name": "Qcur_scaled-0 (permuted)"}])     # a suffix missing
    assert not unnamed_upstream(10, up, ours[:10] + [{"name": "Qcur_scaled-1 (view)"}])         # another node's label
    named = up[:9] + [{"op": "SCALE", "name": "Qcur-0"}] + up[10:]
    assert not unnamed_upstream(10, named, ours)        # node 9 is named upstream: its views are not excused
    assert not unnamed_upstream(10, up[:10] + [{"op": "VIEW", "name": "node_10 (view)"}] + up[11:], ours)   # j < i

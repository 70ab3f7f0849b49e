"""Record the node list of one llama_decode as llama.cpp's own scheduler runs it (a fixture for graphdiag's graphs).

    python tools/record_llama_nodes.py MODEL.gguf --tokens 3 --out tests/data/nodes/NAME.json [--n-ctx N]

One llama_decode of `--tokens` tokens (ids 1, 2, ..., positions 0.., one sequence, the last token's logits
only, as llama_batch_get_one gives) with flash attention on and a unified KV cache. `cb_eval` in the context
params (ggml_backend_sched_eval_callback) is called with ask=True for every node of every split, in the
order the scheduler computes them; the tool reads each node's op, type, ne[4] and name from struct
ggml_tensor and answers False (it never asks for data, so the scheduler computes the splits unchanged).
Each record also names the buffer that holds the node's data (`buffer`: ggml_backend_buffer_name, "CPU",
"CUDA0", "CUDA_Host", ...) and the split it ran in (`split`, numbered from 0): the callback is not told where
a split starts, so a split here is a run of consecutive nodes whose buffers belong to one backend (a host
buffer, "CPU" or "*_Host", is the CPU backend's). A CUDA build puts the embedding's GET_ROWS (token_embd
stays in host memory) in a CPU split of its own; the node list itself is the same.

Runs on a CPU or a CUDA build of llama-cpp-python 0.3.36 (llama.cpp 0c1e57098): n_gpu_layers is 999 either
way (ignored without a GPU backend). n_ctx defaults to graphdiag's for the file (its context_length, at
most graphdiag.model.arch.common.N_CTX_MAX), so the cache views' shapes are the ones graphdiag builds.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

GGML_MAX_DIMS, GGML_MAX_OP_PARAMS, GGML_MAX_SRC, GGML_MAX_NAME = 4, 64, 10, 64   # ggml.h at 0c1e57098


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor (ggml/include/ggml.h at 0c1e57098), up to its name: the fields read here."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
    ]


def _ggml_names():
    """(op name, type name, buffer name) functions from libggml-base (ggml_op_name, ggml_type_name,
    ggml_backend_buffer_name): the names ggml itself prints."""
    from llama_cpp._ggml import libggml
    op_name, type_name, buf_name = libggml.ggml_op_name, libggml.ggml_type_name, libggml.ggml_backend_buffer_name
    op_name.argtypes, op_name.restype = [ctypes.c_int], ctypes.c_char_p
    type_name.argtypes, type_name.restype = [ctypes.c_int], ctypes.c_char_p
    buf_name.argtypes, buf_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    return (lambda op: op_name(op).decode(), lambda t: type_name(t).decode(),
            lambda b: buf_name(b).decode() if b else "")


def graphdiag_n_ctx(path: str) -> int:
    """The KV cells graphdiag gives the file's model: its context_length, at most N_CTX_MAX."""
    import gguf
    from graphdiag.model.arch.common import N_CTX_MAX
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    return min(int(r.fields[f"{arch}.context_length"].parts[-1][0]), N_CTX_MAX)


def record(path: str, n_tokens: int, n_ctx: int) -> list[dict]:
    """The scheduler's nodes of one llama_decode of n_tokens tokens: [{op, type, ne, name, buffer, split}]."""
    from graphdiag.llama.driver import load_llama_cpp
    ll = load_llama_cpp()
    op_name, type_name, buf_name = _ggml_names()
    nodes: list[dict] = []

    def observe(t, ask, _user):
        if ask:
            x = GgmlTensor.from_address(t)
            nodes.append({"op": op_name(x.op), "type": type_name(x.type), "ne": list(x.ne),
                          "name": x.name.decode(errors="replace"), "buffer": buf_name(x.buffer)})
        return False

    callback = ll.ggml_backend_sched_eval_callback(observe)
    ll.llama_backend_init()
    mp = ll.llama_model_default_params()
    mp.n_gpu_layers = 999
    model = ll.llama_model_load_from_file(os.fsencode(path), mp)
    if not model:
        sys.exit(f"{path}: llama.cpp could not load this model")
    p = ll.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, max(512, n_tokens), max(512, n_tokens), 1
    p.flash_attn_type = 1                     # LLAMA_FLASH_ATTN_TYPE_ENABLED
    p.kv_unified, p.cb_eval = True, callback
    ctx = ll.llama_init_from_model(model, p)
    try:
        if not ctx:
            sys.exit(f"{path}: llama.cpp could not create a context (n_ctx {n_ctx})")
        toks = (ll.llama_token * n_tokens)(*range(1, n_tokens + 1))
        nodes.clear()                         # only the decode's graph (a context may reserve graphs first)
        if ll.llama_decode(ctx, ll.llama_batch_get_one(toks, n_tokens)) != 0:
            sys.exit(f"{path}: llama_decode failed")
    finally:
        if ctx:
            ll.llama_free(ctx)
        ll.llama_model_free(model)
    return _number_splits(nodes)


def buffer_backend(buffer: str) -> str:
    """The backend a buffer's memory serves: "CPU" for host buffers ("CPU", "CUDA_Host", ...), else its name."""
    return "CPU" if buffer == "CPU" or buffer.endswith("_Host") or buffer.startswith("CPU") else buffer


def _number_splits(nodes: list[dict]) -> list[dict]:
    """Each node's split: a new one where the backend of the node's buffer changes (buffer_backend)."""
    split, last = -1, None
    for n in nodes:
        backend = buffer_backend(n["buffer"])
        if backend != last:
            split, last = split + 1, backend
        n["split"] = split
    return nodes


def fixture_text(meta: dict, nodes: list[dict]) -> str:
    """The fixture as JSON, one node a line (a diff of two recordings reads node by node)."""
    rows = ",\n".join("  " + json.dumps(n) for n in nodes)
    return f'{{"recorded": {json.dumps(meta)},\n "nodes": [\n{rows}\n]}}\n'


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=1, help="tokens in the one llama_decode (default 1)")
    ap.add_argument("--n-ctx", type=int, default=0, help="KV cells (default: graphdiag's for the file)")
    ap.add_argument("--out", required=True, help="the JSON fixture to write")
    a = ap.parse_args(argv)
    if a.tokens < 1:
        ap.error("--tokens must be at least 1")
    if not Path(a.model).is_file():
        ap.error(f"{a.model}: no such file")
    n_ctx = a.n_ctx or graphdiag_n_ctx(a.model)
    nodes = record(a.model, a.tokens, n_ctx)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": Path(a.model).name, "n_tokens": a.tokens, "n_ctx": n_ctx, "flash_attn": True,
            "kv_unified": True, "n_outputs": 1}
    out.write_text(fixture_text(meta, nodes))
    print(f"wrote {out}: {len(nodes)} nodes, {nodes[-1]['split'] + 1 if nodes else 0} split(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a backend's compute buffer holds before ggml-alloc walks the nodes, as llama.cpp's scheduler hands it
over (ggml 0c1e57098 and d99724f2 alike), and the sizes it plans them at.

llama.cpp keeps every graph input on the CPU: ggml_backend_sched_backend_id_from_cur gives a tensor flagged
INPUT the last backend ("1.inp"), so the token ids, positions, cell indices, KQ masks and output ids live in
its CPU (CUDA_Host) buffer. A GPU split that reads one gets a copy made for it (pass 5 of
ggml_backend_sched_split_graph, in the order the split's nodes first read them), and the graph copy puts
those copies at the split's start (input_dep, input_cpy), so ggml-alloc places them there, one after another,
before the split's first node. With one scheduler copy (no pipeline parallelism) a copy is no graph input and
no output: ggml_gallocr_free_node gives its memory back after its last reader, and a later node of the same
graph may sit there. graphdiag keeps the inputs on the backend that first reads them (no copy) and writes them
once per step, before the first split, so it places them where llama.cpp places its copies when one split
reads them all (one GPU, no offload), at that backend's first split otherwise: `split_inputs`.

The token embedding: llama.cpp reads token_embd on the CPU (the input layer stays there), so its GET_ROWS
runs in a CPU split and the CUDA split starts with a copy of its rows; graphdiag runs that GET_ROWS on its
GPU (report/analysis/known.py's graph-nodes), so its output stands for that copy (first among the split's
inputs: the next node reads it), and its token ids, which llama.cpp keeps in its CPU buffer, are placed
before everything and never given back (`held_inputs`): every other offset is llama.cpp's plus their size.

Sizes (`alloc_sizes`): ggml_backend_buft_get_alloc_size of a float or index tensor is ggml_nbytes, save
graphdiag's I32 cell indices, which stand for llama.cpp's I64 ones (llama_kv_cache::build_input_k_idxs /
build_input_v_idxs make GGML_TYPE_I64 tensors): planned at 8 bytes an index. With them the CUDA0 compute
buffer of the exported tiny F16 (n_ctx 4096, n_ubatch 512, 4 outputs, llama-server -np 4) plans at
16,001,152 bytes, what llama.cpp printed (15.2599 MiB, H200 2026-12-06).
"""

from __future__ import annotations

from ..ir.columns import Columns
from ..ir.dtypes import GGMLType
from ..ir.ops import Op, TensorFlag

_INPUT, _COMPUTE = int(TensorFlag.INPUT), int(TensorFlag.COMPUTE)
_I64_OF_I32 = 2      # an I64 index takes twice an I32's bytes


def embedding_node(col: Columns, nodes: list[int]) -> int:
    """The token embedding's GET_ROWS (the graph's first node, reading a persistent table with INPUT ids),
    or -1."""
    if not nodes:
        return -1
    i = nodes[0]
    src = col.src[i]
    if col.op[i] != Op.GET_ROWS or len(src) < 2 or src[0] < 0 or src[1] < 0:
        return -1
    return i if not col.owned[src[0]] and col.flags[src[1]] & _INPUT else -1


def held_inputs(col: Columns, nodes: list[int], leafs: list[int], embd: int) -> list[int]:
    """Inputs that sit in llama.cpp's CPU buffer only: the embedding's token ids and any input no node reads
    (llama.cpp copies none of them to a GPU). Placed first, never given back."""
    read = {s for i in nodes for s in col.src[i] if s >= 0 and i != embd}
    held = [col.src[embd][1]] if embd >= 0 else []
    return held + [i for i in leafs + nodes if col.flags[i] & _INPUT and col.owned[i] and i not in read
                   and i not in held]


def split_inputs(col: Columns, reads: list[int], split: list[int], backend: int, backend_of: dict[int, int],
                 placed, embd: int) -> list[int]:
    """The tensors placed at this split's start, in the order the nodes `reads` first read them: the inputs
    on its backend not placed yet, the scheduler's copies into this split (CPY nodes without COMPUTE), and
    the embedding's rows. llama.cpp copies an input at the start of the split that first reads it; graphdiag
    writes a step's inputs once, before its first split, so `reads` is every node of the backend at its first
    split (all of its inputs placed there: where llama.cpp places them when one split reads them all, one GPU
    without offload, a few blocks off otherwise) and the split's own nodes after."""
    own = set(split)
    out, seen = [], set()
    op, flags, owned = col.op, col.flags, col.owned
    for i in reads:
        if i == embd:
            continue
        for s in col.src[i]:
            if s < 0 or s in seen or s in placed:
                continue
            copy = s in own and op[s] == Op.CPY and not flags[s] & _COMPUTE
            if copy or s == embd or (flags[s] & _INPUT and owned[s] and backend_of.get(s) == backend):
                seen.add(s)
                out.append(s)
    return out


def alloc_sizes(col: Columns, nodes: list[int]) -> list[int | None]:
    """Bytes each tensor takes in its buffer: ggml_nbytes, the I32 cell indices SET_ROWS reads (inputs) at
    llama.cpp's I64 size."""
    sizes = list(col.nbytes)
    rec_type = col.rec["type"]
    done = set()
    for i in nodes:
        if col.op[i] != Op.SET_ROWS or len(col.src[i]) < 3:
            continue
        idx = col.src[i][2]
        if idx >= 0 and idx not in done and col.flags[idx] & _INPUT and rec_type[idx] == GGMLType.I32:
            done.add(idx)
            sizes[idx] = sizes[idx] * _I64_OF_I32
    return sizes

"""What `graphdiag trace` saw a traced process do that no other event carries: the handles of its graph
launches and executable destroys, its synchronisations, and the batches llama.cpp's llama_decode received (graphdiag/trace/convert.py writes them; the
in-flight-destroy diagnosis in report/analysis/trace_checks.py reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class TracedCall(Event):
    """One observed CUDA call. fn: "cudaGraphLaunch" | "cudaGraphExecDestroy" | "cudaStreamSynchronize" |
    "cudaDeviceSynchronize" | "cuCtxSynchronize" (runtime and driver calls under one name); exec_id: CUPTI's
    graph-exec id (0: none); stream: CUPTI's stream id (-1: none)."""

    kind: ClassVar[str] = "traced_call"
    fn: str = ""
    exec_id: int = 0
    stream: int = -1
    pid: int = 0
    tid: int = 0


@dataclass(frozen=True)
class DecodeBatch(Event):
    """One llama_decode call of the traced process (interposed: a program linked against libllama). tokens:
    the batch's token ids (empty with embd, an embeddings batch); positions / seqs / outputs: as llama.h's
    llama_batch gives them, None where the caller left the array NULL (llama.cpp then fills positions,
    sequence 0 and an output for the last row itself); outputs: the rows whose logits were asked for; ctx:
    the llama_context's address (a draft model's context differs from the target's); ret: llama_decode's
    return; duration_ns: the call's host time. step: the last graph step before it (-1: none yet)."""

    kind: ClassVar[str] = "decode_batch"
    ctx: int = 0
    n_tokens: int = 0
    tokens: tuple = ()
    embd: bool = False
    positions: tuple | None = None
    seqs: tuple | None = None
    outputs: tuple | None = None
    ret: int = 0
    duration_ns: int = 0
    pid: int = 0
    tid: int = 0

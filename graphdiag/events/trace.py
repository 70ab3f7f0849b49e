"""What `graphdiag trace` saw a traced process do that no other event carries: the handles of its graph
launches and executable destroys, and its synchronisations (graphdiag/trace/convert.py writes them; the
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

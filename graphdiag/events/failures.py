"""Failed steps and injected faults: what failed, what was released, how the run went on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class FaultInjected(Event):
    """A fault the scenario asked for (`{ at_step = N, fault = KIND }`) fired: the driver call `call` of this
    step returned `error` (the result the driver would return) instead of running. kind: "launch" |
    "capture" | "instantiate" | "update" | "oom"."""
    kind: ClassVar[str] = "fault_injected"
    fault: str = ""
    call: str = ""                 # "cuGraphLaunch", "cuStreamEndCapture", ...
    error: str = ""                # "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", ...


@dataclass(frozen=True)
class FaultMissed(Event):
    """A fault armed for this step never fired: the step made no driver call of that kind."""
    kind: ClassVar[str] = "fault_missed"
    fault: str = ""
    calls: str = ""                # the calls it waited for ("cuGraphExecUpdate")


@dataclass(frozen=True)
class CellsRemoved(Event):
    """A failed ubatch's KV cells freed, as llama_decode's failure path does (memory->seq_rm(seq, pos_min,
    -1), logged by llama.cpp as "removing memory module entries for seq_id = S, pos = [P, +inf)"); in a replayed
    trace also the cells its caller removed before the step (llama-server's seq_rm when a slot takes a new
    request), inferred from a sequence placed again at positions it held."""
    kind: ClassVar[str] = "cells_removed"
    seq: int = 0
    pos_min: int = 0
    n_cells: int = 0


@dataclass(frozen=True)
class EntryReset(Event):
    """A graph entry released after a step that failed while it computed: its executables destroyed (an
    unfinished capture ended first) and its warmup reset, so the key warms up again."""
    kind: ClassVar[str] = "entry_reset"
    n_executables: int = 0
    capture_ended: bool = False
    reason: str = ""


@dataclass(frozen=True)
class StepFailed(Event):
    """A step that did not finish: `error` is what failed ("cuGraphLaunch: CUDA_ERROR_..."), `fault` the
    injected fault behind it ("" for a real failure), `status` llama_decode's return (-2: allocation failed,
    -3: compute failed). `recoverable`: the run goes on with the next step (the step was rolled back); a
    sticky CUDA error, or anything but a CUDA error, ends the run."""
    kind: ClassVar[str] = "step_failed"
    error: str = ""
    fault: str = ""
    status: int = -3
    recoverable: bool = False
    phase: str = "decode"          # "prefill" | "decode"

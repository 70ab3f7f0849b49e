"""Runs and steps: a step started and finished, the run ended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class StepStarted(Event):
    kind: ClassVar[str] = "step_started"
    phase: str = "decode"          # "prefill" | "decode"
    n_tokens: int = 0
    n_seqs: int = 0
    n_kv: int = 0


@dataclass(frozen=True)
class StepFinished(Event):
    kind: ClassVar[str] = "step_finished"
    duration_ns: int = 0           # host wall time of the step, synchronised
    gpu_ns: int = 0                # GPU time of the step's GPU splits (CUDA events), 0 where unmeasured
    tokens: tuple = ()             # greedy tokens produced, one per sequence
    mode: str = ""                 # worst phase any GPU split took: "eager" | "capture" | "replay" | "cpu"


@dataclass(frozen=True)
class RunEnded(Event):
    """The last event of every run: how it ended. `step` is the step in progress when it stopped (the step
    after the last one when complete); status: "complete" | "interrupted" | "failed"; reason: why it
    stopped ("" when complete): "Ctrl-C", the CUDA error, "output closed (broken pipe)"."""
    kind: ClassVar[str] = "run_ended"
    STATUSES: ClassVar[tuple[str, ...]] = ("complete", "interrupted", "failed")
    status: str = "complete"
    steps_done: int = 0            # steps finished
    reason: str = ""


@dataclass(frozen=True)
class WeightsUploaded(Event):
    """A model file's weights placed on the run's backends (before step 0): the file's name, its tensor
    bytes and the host wall time the load took (every persistent buffer allocated and filled, synchronised)."""
    kind: ClassVar[str] = "weights_uploaded"
    source: str = ""               # the file's name
    n_bytes: int = 0
    duration_ns: int = 0

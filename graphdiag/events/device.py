"""Device activity per step (CUPTI's records or the simulated driver's modelled timeline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class DeviceTime(Event):
    """A step's device activity, from CUPTI's records (source "cupti") or the simulated driver's modelled
    timeline (source "modelled"). busy_ns: time at least one kernel ran; span_ns: first kernel start to
    last kernel end; idle_ns = span_ns - busy_ns (the device waiting between kernels); memcpy_ns: copy time.
    top: (kernel, graphdiag node labels, ns, count) per kernel function of the step, most time first.
    attributed: kernels named by the graphdiag node(s) they compute."""
    kind: ClassVar[str] = "device_time"
    source: str = ""
    n_kernels: int = 0
    busy_ns: int = 0
    span_ns: int = 0
    idle_ns: int = 0
    n_memcpy: int = 0
    memcpy_ns: int = 0
    attributed: int = 0
    top: tuple = ()

"""The context and the scheduler: graph reuse, splits, the device layout and links, reallocs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class ContextDecision(Event):
    kind: ClassVar[str] = "context"
    reused: bool = False
    reason: str = ""               # why not reused: "first graph", "n_tokens 1→2", "reuse disabled", ...


@dataclass(frozen=True)
class GraphSplit(Event):
    kind: ClassVar[str] = "graph_split"
    n_splits: int = 0
    backends: tuple = ()           # backend name per split
    uids: tuple = ()               # uid per split
    n_nodes: tuple = ()            # node count per split
    devices: tuple = ()            # device per split (-1: the CPU backend); () on one device, as older records


@dataclass(frozen=True)
class DeviceLayout(Event):
    """The layer split of a run on several devices (llama.cpp --split-mode layer), once before step 0."""
    kind: ClassVar[str] = "device_layout"
    names: tuple = ()              # device name per device
    layers: tuple = ()             # device of each repeating layer, then of the output layer
    split_points: tuple = ()       # cumulative normalised shares (float32, as llama.cpp's `splits`)
    shares_from: str = ""          # "--tensor-split" | "free memory"
    simulated: bool = False


@dataclass(frozen=True)
class PeerLink(Event):
    """How split inputs go from `device` to `to_device`: "peer" (direct, peer access enabled) or "host"
    (read back to the host, written to the other device); `reason` says why."""
    kind: ClassVar[str] = "peer_link"
    to_device: int = 0
    mode: str = "host"
    reason: str = ""


@dataclass(frozen=True)
class SchedRealloc(Event):
    kind: ClassVar[str] = "sched_realloc"
    same_size: bool = True
    buffer_bytes: int = 0
    backend: str = ""

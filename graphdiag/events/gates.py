"""The six gates of the graph runtime: key lookup and eviction, graphs disabled, compatibility, the uid
test, the node-property ledger, warmup and the phase decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class KeyLookup(Event):
    kind: ClassVar[str] = "key_lookup"
    new_entry: bool = False
    n_nodes: int = 0


@dataclass(frozen=True)
class Evicted(Event):
    kind: ClassVar[str] = "evicted"
    idle_ns: int = 0
    n_chunks: int = 0


@dataclass(frozen=True)
class GraphsDisabled(Event):
    kind: ClassVar[str] = "graphs_disabled"
    reason: str = ""               # "env GGML_CUDA_DISABLE_GRAPHS", "compute capability 6.1 < 7.0"


@dataclass(frozen=True)
class Incompatible(Event):
    kind: ClassVar[str] = "incompatible"
    node: int = -1
    node_name: str = ""
    op: str = ""
    rule: str = ""                 # which needs-sync rule fired


@dataclass(frozen=True)
class UidHit(Event):
    kind: ClassVar[str] = "uid_hit"


@dataclass(frozen=True)
class UidMiss(Event):
    """The graph was not the entry's last one (by uid): its ledger was taken. The digests identify the
    graph offline (thrash detection, whatif): props_digest covers every ledger byte (equal digests: the
    ledger comparison finds no change), shape_digest each node's op, type, ne and sources' ne (no addresses);
    first_ne is the first node's ne (what a key of first node + shape adds)."""
    kind: ClassVar[str] = "uid_miss"
    old_uid: int = 0
    n_nodes: int = 0
    props_digest: str = ""
    shape_digest: str = ""
    first_ne: tuple = ()


@dataclass(frozen=True)
class NodeCountChanged(Event):
    kind: ClassVar[str] = "node_count_changed"
    old: int = 0
    new: int = 0


@dataclass(frozen=True)
class PropertyDiff(Event):
    """The first differing node of a changed graph and the exact field, with old and new values."""
    kind: ClassVar[str] = "property_diff"
    node: int = -1
    node_name: str = ""
    op: str = ""
    field: str = ""                # "ne[1]", "op_params", "data", "src[0].data", "src[1].nb[2]", "name", ...
    old: str = ""
    new: str = ""
    n_changed_nodes: int = 0
    changed: tuple = ()            # indices of every changed node (at most 512)


@dataclass(frozen=True)
class LedgerCaptured(Event):
    """The node-property ledger a capture was taken from, one row per node, for node-level diffs between
    runs or steps. Each row: (index, name, op, type, ne, nb, op_params digest, flags, data, sources), where
    addresses are written as `bN+0xOFF` (N: the backend buffer's allocation order) so runs compare."""
    kind: ClassVar[str] = "ledger_captured"
    nodes: tuple = ()


@dataclass(frozen=True)
class WarmupTransition(Event):
    kind: ClassVar[str] = "warmup"
    from_state: str = ""           # "cold" | "warm"
    to_state: str = ""
    why: str = ""                  # "warmup complete" | "warmup reset: properties changed" | ...


@dataclass(frozen=True)
class PhaseDecided(Event):
    kind: ClassVar[str] = "phase"
    phase: str = ""                # "eager" | "capture" | "replay" | "disabled" | "incompatible"
    why: str = ""
    clock_us: int = 0              # the eviction clock at this key's lookup (µs; modelled on the sim driver)

"""The per-key graph cache (ggml_cuda_graph + the context's map of them) with the time-based sweep."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

SWEEP_EVERY_US = 5_000_000      # sweep at most every 5 s (at lookup time)
EVICT_AFTER_US = 10_000_000     # evict entries unused for >= 10 s


class Clock:
    """Microsecond clock (ggml_time_us); `advance` lets scenarios and tests simulate idle time."""

    def __init__(self, now_us=None):
        self._now = now_us or (lambda: time.monotonic_ns() // 1000)
        self.offset_us = 0

    def now_us(self) -> int:
        return self._now() + self.offset_us

    def advance(self, seconds: float) -> None:
        self.offset_us += int(seconds * 1_000_000)


@dataclass
class GraphEntry:
    """One ggml_cuda_graph: executables per chunk, warmup state, the uid and the property ledger."""

    key: int
    instances: list = field(default_factory=list)
    disable_due_to_gpu_arch: bool = False
    warmup_complete: bool = False
    uid: int = 0
    props: np.ndarray | None = None
    last_used_us: int = 0
    # graphdiag's own bookkeeping (not decisions): lowered ops cache and what was reported already
    lowered_uid: int = -1
    lowered: list | None = None
    plan: dict | None = None
    reported: set = field(default_factory=set)
    compat_uid: int = -1                # the uid the compatibility verdict below was taken for
    compat: object = None

    @property
    def n_nodes(self) -> int:
        return 0 if self.props is None else len(self.props)


class GraphCache:
    """map<key, entry>: lazy entries, lookups stamp last use, a sweep every 5 s evicts entries idle >= 10 s."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.entries: dict[int, GraphEntry] = {}
        self.last_sweep_us = 0          # as ggml's last_graph_eviction_sweep: the first lookup sweeps

    def lookup(self, key: int) -> tuple[GraphEntry, bool, list[tuple[GraphEntry, int]]]:
        """(entry, created, evicted [(entry, idle_us)]). Evicted entries still hold their instances:
        the caller destroys them (the C++ destructor does)."""
        now = self.clock.now_us()
        evicted = []
        if now - self.last_sweep_us >= SWEEP_EVERY_US:
            self.last_sweep_us = now
            for k in [k for k, e in self.entries.items() if now - e.last_used_us >= EVICT_AFTER_US]:
                e = self.entries.pop(k)
                evicted.append((e, now - e.last_used_us))
        entry = self.entries.get(key)
        created = entry is None
        if created:
            entry = self.entries[key] = GraphEntry(key)
        entry.last_used_us = now
        return entry, created, evicted

    def clear(self) -> list[GraphEntry]:
        """Drop every entry (pool invalidation); returns them so their executables can be destroyed."""
        out = list(self.entries.values())
        self.entries.clear()
        return out

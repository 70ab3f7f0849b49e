"""Counters fed from events, with an `expect(**deltas)` helper for tests (after vLLM's counter.py)."""

from __future__ import annotations

import contextlib
from collections import Counter

from . import events as E

COUNTER_NAMES = (
    "eager_runs", "captures", "instantiates", "updates", "update_refusals", "replays", "uid_hits", "uid_misses",
    "warmup_completions", "warmup_resets", "evictions", "invalidations", "graphs_reused", "graphs_rebuilt",
    "reallocs_same", "reallocs_changed", "fusions", "incompatible", "disabled", "chunks_destroyed",
)


class Counters:
    """Subscribe an instance to the bus. `refusals` counts update refusals by reason name."""

    def __init__(self):
        self.c = Counter({n: 0 for n in COUNTER_NAMES})
        self.refusals: Counter = Counter()

    def __getattr__(self, name):
        if name in COUNTER_NAMES:
            return self.c[name]
        raise AttributeError(name)

    def __call__(self, ev: E.Event) -> None:
        c = self.c
        match ev:
            case E.EagerRun():
                c["eager_runs"] += 1
            case E.CaptureRun():
                c["captures"] += 1
            case E.ChunkInstantiated():
                c["instantiates"] += 1
            case E.ChunkUpdated():
                c["updates"] += 1
            case E.UpdateRefused():
                c["update_refusals"] += 1
                self.refusals[ev.reason] += 1
            case E.ReplayLaunched():
                c["replays"] += 1
            case E.UidHit():
                c["uid_hits"] += 1
            case E.UidMiss():
                c["uid_misses"] += 1
            case E.WarmupTransition():
                c["warmup_completions" if ev.to_state == "warm" else "warmup_resets"] += 1
            case E.Evicted():
                c["evictions"] += 1
            case E.PoolInvalidated():
                c["invalidations"] += 1
            case E.ContextDecision():
                c["graphs_reused" if ev.reused else "graphs_rebuilt"] += 1
            case E.SchedRealloc():
                c["reallocs_same" if ev.same_size else "reallocs_changed"] += 1
            case E.FusionApplied():
                c["fusions"] += 1
            case E.Incompatible():
                c["incompatible"] += 1
            case E.GraphsDisabled():
                c["disabled"] += 1
            case E.ChunksDestroyed():
                c["chunks_destroyed"] += ev.count

    def snapshot(self) -> dict[str, int]:
        d = dict(self.c)
        d["refusals_by_reason"] = dict(self.refusals)
        return d

    @contextlib.contextmanager
    def expect(self, **deltas: int):
        """Assert that the block changes the named counters by exactly these amounts (others: any)."""
        unknown = set(deltas) - set(COUNTER_NAMES)
        if unknown:
            raise ValueError(f"unknown counters: {sorted(unknown)}")
        before = dict(self.c)
        yield self
        got = {k: self.c[k] - before[k] for k in deltas}
        if got != deltas:
            diff = ", ".join(f"{k}: expected +{v}, got +{got[k]}" for k, v in deltas.items() if got[k] != v)
            raise AssertionError(f"counter deltas differ: {diff}")

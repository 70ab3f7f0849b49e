"""Counters fed from events, with an `expect(**deltas)` helper for tests (after vLLM's counter.py)."""

from __future__ import annotations

import contextlib
from collections import Counter

from . import events as E

COUNTER_NAMES = (
    "eager_runs", "captures", "instantiates", "updates", "update_refusals", "replays", "uid_hits", "uid_misses",
    "warmup_completions", "warmup_resets", "evictions", "invalidations", "graphs_reused", "graphs_rebuilt",
    "reallocs_same", "reallocs_changed", "fusions", "incompatible", "disabled", "chunks_destroyed",
    "faults_injected", "step_failures",
)


# event classes that always add one to one counter (the others depend on the event's fields), and classes
# seen to count nothing
_ONE: dict[type, str] = {E.EagerRun: "eager_runs", E.CaptureRun: "captures", E.ChunkInstantiated: "instantiates",
                         E.ChunkUpdated: "updates", E.ReplayLaunched: "replays", E.UidHit: "uid_hits",
                         E.UidMiss: "uid_misses", E.Evicted: "evictions", E.PoolInvalidated: "invalidations",
                         E.FusionApplied: "fusions", E.Incompatible: "incompatible", E.GraphsDisabled: "disabled",
                         E.FaultInjected: "faults_injected", E.StepFailed: "step_failures"}
_NONE: set[type] = set()


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
        # most events of a replayed step count nothing, or one counter: a dict lookup by class settles them
        # (the match below tries up to twenty classes in turn); classes are sorted into _ONE / _NONE on sight
        t = type(ev)
        name = _ONE.get(t)
        if name is not None:
            self.c[name] += 1
            return
        if t in _NONE:
            return
        if not self._count(ev):
            _NONE.add(t)

    def _count(self, ev: E.Event) -> bool:
        """Count `ev` by its class (isinstance, as subclasses count too); False when nothing counts it."""
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
            case E.FaultInjected():
                c["faults_injected"] += 1
            case E.StepFailed():
                c["step_failures"] += 1
            case _:
                return False
        return True

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

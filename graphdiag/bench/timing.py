"""Timing helpers shared by the benchmarks: medians and percentiles of host times."""

from __future__ import annotations

import statistics
import time


def median_ns(fn, reps: int, warmup: int = 3) -> float:
    """Median host time of fn() in ns over `reps` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


def host_reference_us(reps: int = 15) -> float:
    """Median µs of a fixed piece of host Python of the kind a replayed step runs (200 decision events made
    and emitted on a held bus, then flushed): how fast this host ran when a row was measured. The lent GPU
    hosts were seen to run the same code 2.3x slower for minutes at a time; a row's host figures (host part,
    time to launch) scale with this one, its GPU time does not."""
    from .. import events as E
    bus = E.EventBus()
    bus.subscribe(lambda ev: None)
    bus.hold()

    def work():
        for i in range(200):
            bus.emit(E.PhaseDecided(step=i, split=0, key=1, uid=2, t_ns=1, phase="replay", why="unchanged",
                                    clock_us=i))
        bus.flush()
    return median_ns(work, reps) / 1e3


def percentile(xs, q: float) -> float:
    """The q-th percentile (0..100) of xs, linear between order statistics; nan for no samples."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

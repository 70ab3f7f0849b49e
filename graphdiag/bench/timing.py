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


def percentile(xs, q: float) -> float:
    """The q-th percentile (0..100) of xs, linear between order statistics; nan for no samples."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

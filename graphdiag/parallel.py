"""Span-parallel host work over big arrays: numpy's ufuncs, casts and copies release the GIL on large
operands, so threads over disjoint spans of one array scale with the cores (the per-span work must write
only its own span, which keeps the result independent of the thread count and of scheduling)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

MAX_THREADS = 16


def threads() -> int:
    """Worker threads for a big array: the cores this process may run on (at most MAX_THREADS)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, n))


def over_spans(n: int, per_span: int, fn: Callable[[int, int], None]) -> None:
    """fn(a, b) for the spans [a, b) of 0..n, per_span long (the last shorter), on a thread pool when there
    are several spans and cores."""
    spans = [(a, min(a + per_span, n)) for a in range(0, n, per_span)]
    workers = min(threads(), len(spans))
    if workers <= 1:
        for a, b in spans:
            fn(a, b)
        return
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(fn, a, b) for a, b in spans]
        try:
            for f in futures:
                f.result()                   # the first failing span's exception, raised here
        except BaseException:                # a failure or Ctrl-C: the spans not yet started never start
            pool.shutdown(wait=True, cancel_futures=True)
            raise

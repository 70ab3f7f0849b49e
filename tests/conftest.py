"""Shared test setup: make tests/support importable as `support` (synthetic runs, golden helpers)."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

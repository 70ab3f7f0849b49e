"""Benchmarks (measured, never asserted in tests): the ledger check, decode/prefill step times with their HBM
roofline and an optional PyTorch peer, and the driver micro benchmark (`python -m graphdiag.bench.driver`)."""

from .ledger import ledger_bench
from .steps import StepsOptions, bench_steps, step_times
from .timing import median_ns, percentile

__all__ = ["StepsOptions", "bench_steps", "ledger_bench", "median_ns", "percentile", "step_times"]

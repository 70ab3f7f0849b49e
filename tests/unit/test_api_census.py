"""tests/gpu/api_census.py's census (the GPU measurement's arithmetic) on made-up records."""

from __future__ import annotations

import pytest

from tests.gpu import api_census as A


def test_calls_go_to_the_step_holding_their_start_and_nested_calls_count_once_in_api_time(monkeypatch):
    monkeypatch.setattr(A, "WARMUP", 0)
    steps = [(0, 1000, "eager"), (2000, 3000, "eager"), (4000, 5000, "replay")]
    calls = [("cudaLaunchKernelExC", 100, 300), ("cuLaunchKernelEx", 120, 280),     # nested in the one above
             ("cudaGetLastError", 400, 410), ("cudaLaunchKernelExC", 2100, 2200),
             ("cudaGraphLaunch", 4100, 4600), ("cudaStreamSynchronize", 1500, 1600),  # between steps: nobody's
             ("cudaGetLastError", 990, 1010)]                                         # starts inside step 0
    out = A.census(calls, steps)
    eager = out["eager"]
    assert eager["steps"] == 2 and eager["wall_us"] == 1.0
    by = {r["function"]: r for r in eager["functions"]}
    assert by["cudaLaunchKernelExC"]["calls"] == 1 and by["cuLaunchKernelEx"]["calls"] == 0.5
    assert by["cudaGetLastError"]["calls"] == 1 and "cudaStreamSynchronize" not in by
    # step 0: 200 + 10 + 20 ns of outermost calls; step 1: 100 ns; medians of the two
    assert eager["api_us"] == pytest.approx((0.23 + 0.1) / 2)
    assert eager["outside_api_us"] == pytest.approx(((1.0 - 0.23) + (1.0 - 0.1)) / 2)
    assert out["replay"]["calls_per_step"] == 1 and out["replay"]["api_us"] == pytest.approx(0.5)


def test_warm_up_steps_are_dropped_where_enough_remain():
    steps = [(i * 100, i * 100 + 50 + (1000 if i < A.WARMUP else 0), "eager") for i in range(A.WARMUP + 3)]
    out = A.census([], steps)
    assert out["eager"]["steps"] == 3 and out["eager"]["wall_us"] == pytest.approx(0.05)

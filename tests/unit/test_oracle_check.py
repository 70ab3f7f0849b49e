"""oracle_check.judge: NaN or inf on either side fails a step's check, whatever its error; the bound of a
run on Q8_1 activations follows the twin's noise (ORACLE_NOISE_FACTOR times it, at least ORACLE_FLOOR)."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag.events.checks import ORACLE_FLOOR, ORACLE_NOISE_FACTOR
from graphdiag.oracle_check import failure_line, judge, rel_err

WANT = np.linspace(-4.0, 4.0, 32000, dtype=np.float32).reshape(1, -1)


def test_nan_in_the_run_fails_and_is_named_with_its_count():
    got = WANT.copy()
    got[0, [3, 70, 900, 5000, 31999]] = np.nan
    ev = judge(3, got, WANT, [], 1e-3)
    assert not ev.ok and (ev.nan, ev.inf, ev.values) == (5, 0, 32000)
    assert ev.rel_err == 0.0                       # the finite values agree: the NaN alone fails it
    assert failure_line(ev) == "step 3: logits hold NaN (5 of 32000)"


def test_inf_in_the_oracle_fails_too():
    want = WANT.copy()
    want[0, :2] = [np.inf, -np.inf]
    got = WANT.copy()
    got[0, 7] = np.nan
    ev = judge(1, got, want, [], 1e-3)
    assert not ev.ok and (ev.ref_inf, ev.nan) == (2, 1)
    assert failure_line(ev) == "step 1: logits hold NaN (1 of 32000); the oracle's logits hold inf (2 of 32000)"


def test_the_bound_follows_the_farther_twin_down_to_the_floor():
    noisy = [WANT * np.float32(1.004), WANT * np.float32(1.01)]   # the farther twin 1 % off: twice that
    ev = judge(0, WANT * np.float32(1.015), WANT, noisy, 1e-3)
    assert ev.noise == pytest.approx(0.01, rel=1e-4) and ev.bound == pytest.approx(ORACLE_NOISE_FACTOR * 0.01)
    assert ev.ok and failure_line(ev) is None
    off = judge(0, WANT * np.float32(1.025), WANT, noisy, 1e-3)    # 2.5 % off where the noise is 1 %
    assert not off.ok and failure_line(off) == "step 0: logits differ from the oracle (rel err 0.025 > 0.02)"
    quiet = judge(0, WANT, WANT, [WANT], 1e-3)     # a twin that rounded nothing differently
    assert quiet.noise == 0.0 and quiet.bound == ORACLE_FLOOR


def test_rel_err_is_relative_to_the_largest_oracle_value():
    a, b = np.array([1.0, 2.0, 100.0]), np.array([1.0, 2.0, 101.0])
    assert rel_err(a, b) == pytest.approx(1 / 101)
    assert rel_err(np.array([np.nan]), np.array([1.0])) == 0.0

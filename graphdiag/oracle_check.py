"""A step's logits judged against the oracle's (--oracle): non-finite values, the relative error, its bound.

Pure: arrays in, an OracleCheck event out (the runner emits it), and the line a failed check is named by.
The relative error is max|a-b| / max|b| over the values both sides hold finite; a NaN or an infinity on
either side fails the check whatever the error (a NaN compares false with every bound, so without the count
it would pass silently). The bound: events/checks.py (ORACLE_BOUND, ORACLE_FLOOR, ORACLE_NOISE_FACTOR).
"""

from __future__ import annotations

import numpy as np

from .events.checks import ORACLE_FLOOR, ORACLE_NOISE_FACTOR, OracleCheck


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max|a-b| / max|b| over the positions where both are finite (0.0 where none is)."""
    keep = np.isfinite(a) & np.isfinite(b)
    if not keep.any():
        return 0.0
    a, b = a[keep].astype(np.float64), b[keep].astype(np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def judge(step: int, logits: np.ndarray, want: np.ndarray, noisy: list[np.ndarray], bound: float,
          followed: int = 0, refused: int = 0) -> OracleCheck:
    """The check of one step: `logits` the run's, `want` the oracle's, `noisy` its jittered twins' (runs on
    Q8_1 activations; none otherwise) and `bound` the fixed one of a run without twins (ORACLE_BOUND).
    With twins the noise is the farthest apart any two of the oracle and its twins land (each pair one more
    sample of how far two correct runs part: Gemma 3 270M's spread 0.13-0.19 on one step), the bound
    ORACLE_NOISE_FACTOR times that, at least ORACLE_FLOOR. followed / refused: the MoE tokens whose expert
    choice the oracle took from the run at a near-tie, and those whose choice lay beyond the noise (any fails:
    oracle_router)."""
    noise = None
    if noisy:
        sides = [want, *noisy]
        noise = max(rel_err(a, b) for i, b in enumerate(sides) for a in sides[i + 1:])
        bound = max(ORACLE_FLOOR, bound, ORACLE_NOISE_FACTOR * noise)
    err = rel_err(logits, want)
    counts = {"nan": int(np.isnan(logits).sum()), "inf": int(np.isinf(logits).sum()),
              "ref_nan": int(np.isnan(want).sum()), "ref_inf": int(np.isinf(want).sum())}
    ok = err <= bound and not any(counts.values()) and not refused
    return OracleCheck(step=step, ok=ok, rel_err=err, bound=bound, noise=noise, values=int(logits.size),
                       followed=followed, refused=refused, **counts)


def _held(nan: int, inf: int, n: int) -> str:
    what = " and ".join(w for w, c in (("NaN", nan), ("inf", inf)) if c)
    return f"{what} ({nan + inf} of {n})"


def failure_line(ev: OracleCheck) -> str | None:
    """The one line naming a failed check ("step 3: logits hold NaN (5 of 32000)"), None where it passed."""
    if ev.ok:
        return None
    held = [f"{who} hold {_held(nan, inf, ev.values)}" for who, nan, inf in
            (("logits", ev.nan, ev.inf), ("the oracle's logits", ev.ref_nan, ev.ref_inf)) if nan or inf]
    if held:
        return f"step {ev.step}: " + "; ".join(held)
    if ev.rel_err <= ev.bound:         # only expert choices beyond the noise failed (oracle_router.refusal_line)
        return f"step {ev.step}: {ev.refused} expert choice(s) beyond the router's noise"
    return f"step {ev.step}: logits differ from the oracle (rel err {ev.rel_err:.3g} > {ev.bound:.3g})"

"""Checks of a step's results: replays recomputed eagerly (--verify), logits against the numpy oracle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class VerifyResult(Event):
    kind: ClassVar[str] = "verify"
    ok: bool = True
    max_abs_diff: float = 0.0


# max|a-b|/max|b| of a step's logits against the oracle. F16: ~1e-4 measured (the F16 KV cache's rounding).
# Q8_0 on a GPU backend: ggml rounds every activation to Q8_1 before the integer dot; the oracle does too,
# but a value on a rounding midpoint (float32 vs float64 apart by 1e-7) sends the two runs 8-bit-noise apart,
# and from then on they differ by the Q8_1 noise itself, 1-2e-2 (measured over 64 seeded runs); the CPU
# backend's plain float products stay within 1e-3.
ORACLE_BOUND = {"f16": 1e-3, "q8_0": 1e-3}
ORACLE_BOUND_Q8_1 = 3e-2
# A model can carry the Q8_1 noise much further than the presets do: Gemma 3 270M (18 layers in its own
# K-quants, embeddings scaled by sqrt(n_embd), a 262k-row tied lm_head) moved 2-8 % when its activations were
# jittered by 1e-7 before rounding, and real llama.cpp on the H200 landed 0.10 from the float64 forward
# (graphdiag 0.048). So a Q8_1 run's bound is also calibrated per step by the model itself: the oracle's
# twin, jittered by ORACLE_JITTER, lands `noise` from it; the run may be ORACLE_NOISE_FACTOR times that.
ORACLE_JITTER = 1e-7
ORACLE_NOISE_FACTOR = 3.0


@dataclass(frozen=True)
class OracleCheck(Event):
    """A step's logits against the independent numpy forward (relative error: max|a-b| / max|b|)."""
    kind: ClassVar[str] = "oracle"
    ok: bool = True
    rel_err: float = 0.0
    bound: float = 0.0
    noise: float | None = None        # Q8_1 runs: the jittered oracle twin's rel err (the bound's calibration)

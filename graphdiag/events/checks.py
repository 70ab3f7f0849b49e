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
# F16 weights on a GPU backend, a step of more than 16 tokens (past MMF's columns: upstream's cuBLAS path, which
# rounds each GEMM's result to F16, as graphdiag's lowering._cublas_f16 does and the oracle's float32 products do
# not): gemma3-tiny's 30-token prompt lands 1.05e-3 from the oracle on the simulator (6.7e-4 before the
# rounding). Decode steps keep ORACLE_BOUND, which a kernel 2 % off must exceed (tests/integration/
# test_oracle_bound.py).
ORACLE_F16_GEMM_BOUND = 2e-3
# A Q8_1 run's bound is calibrated per step by the model itself: two twins of the oracle, their activations
# moved by ORACLE_JITTERS (relative, seeded) before each Q8_1 rounding; `noise` is the farthest apart any two
# of the oracle and its twins land, and the run may be ORACLE_NOISE_FACTOR times that, no less than
# ORACLE_FLOOR. Measured on the simulator (seed 0, 8-token prompt, 3-4 steps; max rel err per step):
# - a twin moved by 1e-7 rounds too few values otherwise to show the whole noise: 0.006 on tiny Q8_0 where the
#   run lands 0.009-0.016 (2.7x). From 1e-6 on a twin's distance saturates at the model's full Q8_1 noise
#   (tiny Q8_0 0.012-0.019 at 1e-5, 0.013-0.024 at 1e-4);
# - against one twin at 1e-5 the runs land 0.53-1.09x of it (tiny q8_0/q4_0/q4_k/q6_k 0.0094-0.018 against
#   0.0127-0.019, small q4_k 0.016-0.021 against 0.019-0.024, gemma3-tiny q8_0 0.0008-0.0012 against
#   0.0011-0.0016), while a kernel a few per cent off lands 2.7-4.1x (tiny q4_k, every Q4_K mat-vec x 1.02:
#   0.047-0.058; every RMS norm x 1.025: 0.051-0.059; Q/K rope x 1.05: 0.036-0.062): a factor of 2;
# - Gemma 3 270M (18 layers in its own K-quants, a 262k-row tied lm_head) carries the noise much further and
#   more widely: one step's run landed 0.28 where the twins landed 0.13 and 0.13 from the oracle but 0.19 from
#   each other (its runs 0.03-0.28 over 5 steps; real llama.cpp on the H200 0.10 from the float64 forward),
#   hence two twins and every pair of the three;
# - the floor covers what float32 accumulation order alone moves, where no twin rounds differently: the F16
#   and BF16 presets, with no Q8_1 rounding, land 3e-5-1.2e-4 (tiny, small) from the float64 oracle; 1e-3 is
#   8x that, the F16 bound (the former floor, 3e-2, let a kernel 2 % off pass where the noise is 1.5e-3).
ORACLE_JITTERS = (1e-5, 1e-4)
# A float MoE run's (F16 / BF16 weights on a GPU backend) twins: every product's x moved by these (relative,
# seeded), the size of the rounding the GPU's kernels apply to it (F16's and TF32's unit roundoff 2^-11 =
# 4.9e-4: MMF and cuBLAS's F16 path convert x to F16, cuBLAS's F32 GEMM of the router runs TF32). Their router
# logits measure a near-tie (oracle_router), their logits the step's noise, as the Q8_1 twins' do: moe-tiny F16
# in moe-sequences-sweep (H100, 2026-12-07) landed 0.074 from the oracle at 32 sequences, where a token's
# experts sat a rounding apart, and the simulator 0.065 at 16; the bound stays at least the fixed one
# (ORACLE_BOUND, ORACLE_F16_GEMM_BOUND).
ORACLE_FLOAT_JITTERS = (1e-4, 2.5e-4)
ORACLE_NOISE_FACTOR = 2.0
ORACLE_FLOOR = 1e-3


@dataclass(frozen=True)
class OracleCheck(Event):
    """A step's logits against the independent numpy forward (relative error: max|a-b| / max|b|)."""
    kind: ClassVar[str] = "oracle"
    ok: bool = True
    rel_err: float = 0.0
    bound: float = 0.0
    noise: float | None = None        # Q8_1 runs: the jittered oracle twin's rel err (the bound's calibration)
    values: int = 0                   # logits compared (outputs x vocabulary)
    nan: int = 0                      # of the run's logits, NaN (any fails the check)
    inf: int = 0                      # of the run's logits, +-inf (any fails the check)
    ref_nan: int = 0                  # of the oracle's logits, NaN (any fails the check)
    ref_inf: int = 0                  # of the oracle's logits, +-inf (any fails the check)
    followed: int = 0                 # MoE: tokens whose near-tie expert choice the oracle took from the run
    refused: int = 0                  # MoE: tokens whose run chose experts beyond the noise (any fails)

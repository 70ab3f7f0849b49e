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


@dataclass(frozen=True)
class OracleCheck(Event):
    """A step's logits against the independent numpy forward (relative error: max|a-b| / max|b|)."""
    kind: ClassVar[str] = "oracle"
    ok: bool = True
    rel_err: float = 0.0
    bound: float = 0.0

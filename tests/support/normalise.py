"""Normalise rendered reports for golden files: no pointers, timestamps or durations."""

from __future__ import annotations

import re
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"

_HEX = re.compile(r"0x[0-9a-f]{6,}")
_TIME = re.compile(r"[+-]?\d+(?:\.\d+)? (?:ns|µs|ms|s)\b")
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?")
_RATIO = re.compile(r"\d+(?:\.\d+)?×")
_PERCENT = re.compile(r"[+-]\d+%")


def normalise(text: str) -> list[str]:
    """Lines with addresses as 0xADDR1, 0xADDR2… (first-seen order), times as <t>, ISO stamps as <when>;
    trailing spaces dropped."""
    seen: dict[str, str] = {}

    def addr(m: re.Match) -> str:
        return seen.setdefault(m.group(0), f"0xADDR{len(seen) + 1}")

    text = _ISO.sub("<when>", text)
    text = _HEX.sub(addr, text)
    text = _TIME.sub("<t>", text)
    text = _RATIO.sub("<x>", text)
    text = _PERCENT.sub("<%>", text)
    return [line.rstrip() for line in text.splitlines()]


def check_golden(name: str, text: str, update: bool = False) -> None:
    """Compare normalised `text` with tests/data/golden/NAME.txt (write it when `update`)."""
    path = GOLDEN / f"{name}.txt"
    lines = normalise(text)
    if update or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        if not update:
            raise AssertionError(f"golden file {path} was missing; written now: review and commit it")
    assert lines == path.read_text(encoding="utf-8").splitlines()

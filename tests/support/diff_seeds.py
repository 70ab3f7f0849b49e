"""The differential test's seeds and their outcomes, read from pytest's reports (tests/gpu/conftest.py's
terminal summary)."""

from __future__ import annotations

import re

_CASE = re.compile(r"test_generated_timeline_decides_as_llama_cpp\[(?P<file>.+)-seed(?P<seed>\d+)\]")


def seed_summary(stats: dict) -> str:
    """"differential seeds: 7 (3 passed), 19 (2 passed, 1 failed: tiny-llama-f16)" from the call reports of
    `stats` (pytest's terminalreporter.stats: outcome -> reports); '' where no differential case ran."""
    per: dict[int, dict[str, list[str]]] = {}
    for outcome in ("passed", "failed", "skipped"):
        for rep in stats.get(outcome, []):
            m = _CASE.search(getattr(rep, "nodeid", ""))
            if m and (getattr(rep, "when", "call") == "call" or outcome == "skipped"):
                per.setdefault(int(m["seed"]), {}).setdefault(outcome, []).append(m["file"])
    if not per:
        return ""
    parts = []
    for seed, got in sorted(per.items()):
        counts = [f"{len(got[o])} {o}" + (f": {', '.join(sorted(got[o]))}" if o == "failed" else "")
                  for o in ("passed", "failed", "skipped") if got.get(o)]
        parts.append(f"{seed} ({', '.join(counts)})")
    return "differential seeds: " + "; ".join(parts)

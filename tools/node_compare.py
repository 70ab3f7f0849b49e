"""Which node of a step computes differently on two backends: every node's value, read back and compared.

    python tools/node_compare.py MODEL [--test cuda] [--ref sim] [--tokens 2,651,...] [--all]

Runs one prefill of the tokens on each backend (graphs and fusion off, every node its own memory; see
tests/support/node_check.py) and prints the nodes that add error over their sources (or every node, --all).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.node_check import compare, culprits, node_values, table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--test", default="cuda")
    ap.add_argument("--ref", default="sim")
    ap.add_argument("--tokens", default="2,651,1000,5000")
    ap.add_argument("--wtype", default=None)
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    tokens = [int(x) for x in a.tokens.split(",")]
    base = {"model": a.model, **({"wtype": a.wtype} if a.wtype else {})}
    got = {}
    for side in (a.test, a.ref):
        t0 = time.perf_counter()
        got[side] = node_values({**base, "backend": side}, tokens)
        print(f"{side}: {len(got[side])} nodes in {time.perf_counter() - t0:.1f} s", flush=True)
    diffs = compare(got[a.test], got[a.ref])
    bad = culprits(diffs)
    print(f"{len(bad)} nodes add error (rel > 1e-3 and 10x their sources'):")
    print(table(diffs, None if a.all else bad[:60]))
    worst = max(diffs, key=lambda d: d.rel)
    print(f"largest: node {worst.node.index} {worst.node.op} {worst.node.name} rel {worst.rel:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

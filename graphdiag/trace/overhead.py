"""`graphdiag bench trace -- CMD`: what tracing costs a program, measured by running it plain and traced in turn.

Each round runs CMD twice, once plain and once under graphdiag's injection library (as `graphdiag trace` runs
it), alternating which goes first so that a host's drift over minutes falls on both. For llama-bench (CMD's
program named llama-bench*) graphdiag asks for its JSON-lines output (`-o jsonl`, appended: llama-bench takes
the last -o) and compares each test's tokens per second (pp512, tg128, ...), as for any other program that
prints such lines (tools/decode_loop_torch.py); for any other program the figure is the whole command's wall
time. The result per test: the median of the rounds' plain and traced
figures, the median (and range) of the rounds' traced ÷ plain ratios, and each side's fastest round compared
(the lent hosts switch speed within seconds: bench steps' FASTEST_PAIRS). The raw stream of each traced run
is counted (lines per kind, and the library's own time in the process's CUDA calls, its "own" line at exit)
and discarded.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from ..errors import TraceError
from .command import resolve_cmd, run_traced
from .convert import read_through


def is_llama_bench(cmd: list[str]) -> bool:
    return os.path.basename(cmd[0]).startswith("llama-bench")


def bench_cmd(cmd: list[str]) -> list[str]:
    """CMD as run: llama-bench with JSON-lines output appended."""
    return [*cmd, "-o", "jsonl"] if is_llama_bench(cmd) else list(cmd)


def parse_llama_bench(out: str) -> dict[str, float]:
    """{test: tokens per second} from llama-bench's JSON lines ("pp512", "tg128", "pp512+tg128")."""
    figures = {}
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
            p, g, ts = int(row["n_prompt"]), int(row["n_gen"]), float(row["avg_ts"])
        except (ValueError, KeyError, TypeError):
            continue
        name = "+".join(x for x in (f"pp{p}" if p else "", f"tg{g}" if g else "") if x)
        figures[name] = ts
    return figures


def _figures(cmd: list[str], out: str, wall_s: float) -> dict[str, float]:
    """llama-bench's tests; any other program's too where it prints llama-bench's JSON lines (a decode loop of
    one's own: tools/decode_loop_torch.py), else its wall time."""
    figures = parse_llama_bench(out)
    if is_llama_bench(cmd) and not figures:
        raise TraceError(f"{cmd[0]} printed no llama-bench results (JSON lines with n_prompt, n_gen, avg_ts)")
    return figures or {"wall_s": wall_s}


def _plain(cmd: list[str]) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return done.returncode, done.stdout, time.perf_counter() - t0


def _traced(cmd: list[str], library: Path, cupti: Path, environ=None) -> tuple[int, str, float, Counter]:
    fd, raw = tempfile.mkstemp(prefix="graphdiag-bench-trace-", suffix=".raw.jsonl")
    os.close(fd)
    out, null = tempfile.TemporaryFile(), open(os.devnull, "wb")
    try:
        t0 = time.perf_counter()
        code = run_traced(cmd, Path(raw), library, cupti, echo=null, stdout=out, environ=environ)
        wall = time.perf_counter() - t0
        out.seek(0)
        kinds = Counter()
        with open(raw, encoding="utf-8", errors="replace") as f:
            next(f, None)
            for line in f:
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    continue
                kinds[obj.get("fn") or obj.get("ev")] += 1
                if obj.get("ev") == "start":      # how the calls were read
                    kinds["read: " + read_through(obj.get("text"))] += 1
                if obj.get("ev") == "own" and isinstance(obj.get("own_ns"), int):
                    kinds["own_ns"] += obj["own_ns"]
        return code, out.read().decode("utf-8", "replace"), wall, kinds
    finally:
        out.close()
        null.close()
        os.unlink(raw)


def bench_trace(cmd: list[str], rounds: int, library: Path, cupti: Path, progress=None, environ=None) -> list[dict]:
    """Rows per test: plain and traced figure (median over rounds), ratio traced ÷ plain (median, min, max),
    the unit ("tokens/s" or "s") and what one traced run recorded (lines per kind, the last round's; how its
    calls were read counted as "read: <how>", one per process). `environ`: the traced runs' (trace_environ); the plain runs take graphdiag's."""
    resolve_cmd(cmd)
    run = bench_cmd(cmd)
    plain: dict[str, list[float]] = {}
    traced: dict[str, list[float]] = {}
    recorded: Counter = Counter()
    for r in range(rounds):
        for which in (("traced", "plain") if r % 2 else ("plain", "traced")):
            if which == "plain":
                code, out, wall = _plain(run)
                into = plain
            else:
                code, out, wall, recorded = _traced(run, library, cupti, environ)
                into = traced
            if code != 0:
                raise TraceError(f"{cmd[0]} exited with {code} in round {r + 1} ({which}): "
                                 "the benchmark needs it to succeed")
            for k, v in _figures(cmd, out, wall).items():
                into.setdefault(k, []).append(v)
            if progress:
                progress(f"round {r + 1}/{rounds} {which}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in into.items()))
    rows = []
    for test in plain:
        p, t = plain[test], traced.get(test, [])
        if len(p) != len(t):
            raise TraceError(f"{test}: {len(p)} plain and {len(t)} traced results (the runs disagree on tests)")
        ratios = [b / a for a, b in zip(p, t) if a > 0]
        wall = test == "wall_s"
        best_p, best_t = (min(p), min(t)) if wall else (max(p), max(t))   # fastest: least time, most tokens/s
        rows.append({"test": test, "unit": "s" if wall else "tokens/s", "rounds": rounds,
                     "plain": statistics.median(p), "traced": statistics.median(t),
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "ratio_fastest": best_t / best_p if best_p > 0 else None, "recorded": dict(recorded)})
    return rows


def render(rows: list[dict], cmd: list[str], echo) -> None:
    echo(f"graphdiag trace overhead: {' '.join(cmd)}  ({rows[0]['rounds']} rounds, plain and traced in turn)")
    echo(f"  {'test':<16} {'plain':>12} {'traced':>12} {'traced/plain':>13}  range          fastest rounds")
    for r in rows:
        unit = " s" if r["unit"] == "s" else " t/s"
        fastest = f"{r['ratio_fastest']:.4f}" if r.get("ratio_fastest") is not None else "-"
        echo(f"  {r['test']:<16} {r['plain']:>10.2f}{unit:<2} {r['traced']:>10.2f}{unit:<2} {r['ratio']:>13.4f}"
             f"  {r['ratio_min']:.4f}-{r['ratio_max']:.4f}  {fastest}")
    rec = dict(rows[0]["recorded"])
    own = rec.pop("own_ns", None)
    rec.pop("own", None)
    reads = sorted(k[len("read: "):] for k in rec if k.startswith("read: "))
    rec = {k: v for k, v in rec.items() if not k.startswith("read: ") and k != "start"}
    echo(f"  calls read through: {', '.join(reads) or 'nothing (CUDA never initialised)'}")
    echo("  one traced run recorded: " + (", ".join(f"{v} {k}" for k, v in sorted(rec.items())) or "nothing"))
    if own is not None:
        launches = rec.get("cudaGraphLaunch", 0)
        per = f", {own / launches / 1e3:.2f} µs per graph launch" if launches else ""
        echo(f"  the library's own time in its CUDA calls: {own / 1e6:.2f} ms{per}")

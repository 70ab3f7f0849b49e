"""What the host does in a decode step, on each side: CUPTI's runtime- and driver-API activity records of real
llama.cpp's step (llama-cpp-python in this process, through `graphdiag llama`'s plan, no CUPTI subscriber: the
log alone) and of graphdiag's (its runner on CUDA), the same file and plan, per decode step.

    PYTHONPATH=. python tests/gpu/api_census.py FILE.gguf [--side llama|graphdiag] [--no-graphs] [--steps 64]
        [--prompt-tokens 200] [--top 15] [--json FILE]

Each API record is given to the decode step whose host span holds its start (llama_decode through
llama_synchronize on llama.cpp's side, graphdiag's step on its own); per step kind (its mode: eager, replay,
capture) the median step's wall time, the API calls it made by function (calls and µs a step) and the host time
outside any API call (the library's own code: ggml's graph walk, graphdiag's Python). Run once per side, each in
its own process (CUPTI's activity buffers and llama.cpp's CUDA context are per process), and compare: what
llama.cpp's graphs-off step spends beyond the launches graphdiag makes (issue 46, point 8). Not a test: a
measurement (needs cupti-python and a GPU; `census` is tested on the CPU).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import time
from collections import defaultdict

WARMUP = 2      # decode steps of each kind dropped, as bench steps drops them


def census(calls: list[tuple[str, int, int]], steps: list[tuple[int, int, str]], top: int = 15) -> dict:
    """Per step kind: `calls` (function, start, end; ns) given to the step (start, end, kind; ns, the same clock)
    whose span holds the call's start; the kind's steps after WARMUP, their median wall time, the median of
    each function's calls and µs a step, the API µs a step and the rest of the step (host code between calls,
    waits inside none). Nested calls (a runtime call's driver calls) are counted by function; the API time
    counts the outermost only."""
    spans = sorted(steps)
    starts = [s[0] for s in spans]
    per: dict[int, list] = defaultdict(list)
    for c in calls:
        i = bisect.bisect_right(starts, c[1]) - 1
        if i >= 0 and c[1] <= spans[i][1]:
            per[i].append(c)
    kinds: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(spans):
        kinds[s[2]].append(i)
    out = {}
    for kind, idx in kinds.items():
        idx = idx[WARMUP:] if len(idx) > WARMUP + 2 else idx
        by: dict[str, list] = defaultdict(lambda: [[], []])
        api_us, wall_us = [], []
        for i in idx:
            mine = sorted(per[i], key=lambda c: c[1])
            counts, times = defaultdict(int), defaultdict(float)
            for fn, t0, t1 in mine:
                counts[fn] += 1
                times[fn] += (t1 - t0) / 1e3
            for fn in set(counts) | set(by):
                by[fn][0].append(counts.get(fn, 0))
                by[fn][1].append(times.get(fn, 0.0))
            outer, end = 0.0, -1
            for _, t0, t1 in mine:              # the union of the calls' spans: nested calls once
                if t1 > end:
                    outer += (t1 - max(t0, end)) / 1e3
                    end = t1
            api_us.append(outer)
            wall_us.append((spans[i][1] - spans[i][0]) / 1e3)
        n = len(idx)
        rows = sorted(({"function": fn, "calls": sum(c) / n, "us": sum(t) / n} for fn, (c, t) in by.items()),
                      key=lambda r: -r["us"])
        out[kind] = {"steps": n, "wall_us": statistics.median(wall_us), "api_us": statistics.median(api_us),
                     "outside_api_us": statistics.median(w - a for w, a in zip(wall_us, api_us)),
                     "calls_per_step": sum(r["calls"] for r in rows), "functions": rows[:top]}
    return out


class _Records:
    """CUPTI's runtime and driver API activity records while enabled, as (function, start, end)."""

    def __init__(self):
        from cupti import cupti
        self.c, self.calls = cupti, []
        self.kinds = (cupti.ActivityKind.RUNTIME, cupti.ActivityKind.DRIVER)

    def _completed(self, acts):
        c = self.c
        for a in acts:
            if a.kind == c.ActivityKind.RUNTIME:
                self.calls.append((c.runtime_api_trace_cbid(a.cbid).name, a.start, a.end))
            elif a.kind == c.ActivityKind.DRIVER:
                self.calls.append((c.driver_api_trace_cbid(a.cbid).name, a.start, a.end))

    def __enter__(self):
        self.c.activity_register_callbacks(lambda: (16 * 1024 * 1024, 0), self._completed)
        for k in self.kinds:
            self.c.activity_enable(k)
        # CUPTI's clock against perf_counter_ns (llama.cpp's steps are stamped with the latter)
        self.offset = self.c.get_timestamp() - time.perf_counter_ns()
        return self

    def __exit__(self, *exc):
        self.c.activity_flush_all(1)
        for k in self.kinds:
            self.c.activity_disable(k)
        self.c.activity_flush_all(1)


def _decode_steps(events, stamp, kind: str | None = None) -> list[tuple[int, int, str]]:
    """(start, end, kind) of each decode step; kind: the step's mode unless given."""
    from graphdiag import events as E
    began, phase, out = {}, {}, []
    for e in events:
        if isinstance(e, E.StepStarted):
            began[e.step], phase[e.step] = e.t_ns, e.phase
        elif isinstance(e, E.StepFinished) and phase.get(e.step) == "decode" and e.step in began:
            out.append((stamp(e.step, "begin", began[e.step]), stamp(e.step, "end", e.t_ns), kind or e.mode))
    return out


def llama_side(model: str, steps: int, prompt: int, graphs: bool) -> tuple[list, list]:
    os.environ["GRAPHDIAG_WATCHER"] = "log"          # no CUPTI subscriber (driver.LeadWatcher)
    from graphdiag.llama.command import resolve_llama
    from graphdiag.llama.run import run_llama
    cfg, sc = resolve_llama(model, {"steps": steps, "prompt_tokens": prompt, "graphs_disabled": not graphs}, None)
    with _Records() as rec:
        res = run_llama(model, cfg, sc)
    # graphs on, unwatched: which steps replayed is not seen (every one reads "eager" in the record)
    return rec.calls, _decode_steps(res.events, lambda step, which, t: t + rec.offset,
                                    "graphs on (replay or capture: unwatched)" if graphs else None)


def graphdiag_side(model: str, steps: int, prompt: int, graphs: bool) -> tuple[list, list]:
    from graphdiag import events as E
    from graphdiag.config import resolve
    from graphdiag.runner import run
    stamps: dict = {}

    def sink(ev):
        if isinstance(ev, (E.StepStarted, E.StepFinished)):
            stamps[(ev.step, "begin" if isinstance(ev, E.StepStarted) else "end")] = rec.c.get_timestamp()
    settings = {"backend": "cuda", "model": model, "steps": steps, "prompt_tokens": prompt, "chunk_size": 0,
                "nvtx": False, "graphs_disabled": not graphs}
    with _Records() as rec:
        r = run(resolve(settings), None, sinks=[sink])
    return rec.calls, _decode_steps(r.events, lambda step, which, t: stamps[(step, which)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a GGUF file (both sides run it)")
    ap.add_argument("--side", choices=("llama", "graphdiag"), required=True)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    side = llama_side if a.side == "llama" else graphdiag_side
    calls, steps = side(a.model, a.steps, a.prompt_tokens, not a.no_graphs)
    out = census(calls, steps, a.top)
    for kind, c in out.items():
        print(f"{a.side} {kind}: {c['steps']} steps, wall {c['wall_us']:.1f} µs, API {c['api_us']:.1f} µs, "
              f"outside API {c['outside_api_us']:.1f} µs, {c['calls_per_step']:.0f} calls a step")
        for r in c["functions"]:
            print(f"    {r['function']:<40} {r['calls']:7.1f} calls {r['us']:9.1f} µs")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"side": a.side, "graphs": not a.no_graphs, "census": out}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

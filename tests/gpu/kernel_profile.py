"""Where a step's GPU time goes: CUPTI kernel records of real runs, summed per kernel (and grid) per step kind.

    PYTHONPATH=. python tests/gpu/kernel_profile.py [--model tiny,1b] [--wtype f16] [--steps 24]
        [--prefill 512] [--json FILE] [--top 12]

For each (model, weight type) it runs a decode run (prompt 200 tokens, then --steps decode steps, graphs on)
and, with --prefill N, the benchmark's prefill run (prefills of N tokens at positions N, 2N, 3N). Every
kernel record (cupti ActivityKind.CONCURRENT_KERNEL, replayed graph nodes included) is assigned to the step
whose host span holds its start (steps are synchronous: a step's kernels finish before the step ends), and
the table gives, per step kind (prefill / eager / capture / replay decode), the median step's wall time, its
kernel-busy time, its first-kernel-to-last-kernel span, memcpy time, and the kernels by total time per step.
Not a test: a measurement for the kernel author (needs cupti-python).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from types import SimpleNamespace


def _profile_run(settings: dict, scenario=None) -> dict:
    from cupti import cupti

    from graphdiag import events as E
    from graphdiag.config import resolve
    from graphdiag.runner import run

    kernels, copies = [], []

    def requested():
        return 16 * 1024 * 1024, 0

    def completed(acts):
        for a in acts:
            if a.kind == cupti.ActivityKind.CONCURRENT_KERNEL:
                kernels.append((a.start, a.end, a.name, (a.grid_x, a.grid_y, a.grid_z)))
            elif a.kind == cupti.ActivityKind.MEMCPY:
                copies.append((a.start, a.end, int(a.bytes)))

    steps: dict[int, dict] = {}

    def sink(ev):
        if isinstance(ev, E.StepStarted):
            steps[ev.step] = {"t0": cupti.get_timestamp(), "phase": ev.phase, "n_tokens": ev.n_tokens,
                              "n_kv": ev.n_kv}
        elif isinstance(ev, E.StepFinished) and ev.step in steps:
            steps[ev.step].update(t1=cupti.get_timestamp(), mode=ev.mode, wall_ms=ev.duration_ns / 1e6,
                                  gpu_ms=ev.gpu_ns / 1e6)

    cupti.activity_register_callbacks(requested, completed)
    cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
    cupti.activity_enable(cupti.ActivityKind.MEMCPY)
    try:
        run(resolve({**settings, "nvtx": False}), scenario, sinks=[sink])
        cupti.activity_flush_all(1)
    finally:
        cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
        cupti.activity_disable(cupti.ActivityKind.MEMCPY)
        cupti.activity_flush_all(1)

    spans = sorted((s["t0"], s.get("t1", 1 << 62), k) for k, s in steps.items())
    per_step = defaultdict(list)
    cp_step = defaultdict(float)
    import bisect
    starts = [s[0] for s in spans]

    def owner(t):
        i = bisect.bisect_right(starts, t) - 1
        return spans[i][2] if i >= 0 and t <= spans[i][1] else None

    for k in kernels:
        o = owner(k[0])
        if o is not None:
            per_step[o].append(k)
    for c in copies:
        o = owner(c[0])
        if o is not None:
            cp_step[o] += (c[1] - c[0]) / 1e3
    groups = defaultdict(list)   # kind -> step ids
    for sid, s in steps.items():
        kind = "prefill" if s["phase"] == "prefill" else f"decode {s.get('mode', '?')}"
        groups[kind].append(sid)
    out = {}
    for kind, sids in groups.items():
        sids = sorted(sids)
        if kind != "prefill" and len(sids) > 3:
            sids = sids[2:]   # warm-up
        elif kind == "prefill" and len(sids) > 1:
            sids = sids[1:]   # the cold first prefill
        n = len(sids)
        busy = [sum(k[1] - k[0] for k in per_step[s]) / 1e3 for s in sids]
        span = [((max(k[1] for k in per_step[s]) - min(k[0] for k in per_step[s])) / 1e3) if per_step[s] else 0.0
                for s in sids]
        by = defaultdict(lambda: [0, 0.0])
        for s in sids:
            for k in per_step[s]:
                key = f"{k[2]} {k[3][0]}x{k[3][1]}x{k[3][2]}"
                by[key][0] += 1
                by[key][1] += (k[1] - k[0]) / 1e3
        table = sorted(({"kernel": key, "per_step": c / n, "us_per_call": t / c, "us_per_step": t / n}
                        for key, (c, t) in by.items()), key=lambda r: -r["us_per_step"])
        byname = defaultdict(float)
        for r in table:
            byname[r["kernel"].split(" ")[0]] += r["us_per_step"]
        out[kind] = {"steps": n, "wall_ms": statistics.median(steps[s]["wall_ms"] for s in sids),
                     "gpu_ms": statistics.median(steps[s].get("gpu_ms", 0) for s in sids),
                     "kernel_busy_us": statistics.median(busy), "kernel_span_us": statistics.median(span),
                     "kernels_per_step": statistics.median(len(per_step[s]) for s in sids),
                     "memcpy_us": statistics.median(cp_step[s] for s in sids),
                     "n_kv": steps[sids[-1]]["n_kv"], "n_tokens": steps[sids[-1]]["n_tokens"],
                     "by_name_us": dict(sorted(byname.items(), key=lambda kv: -kv[1])), "kernels": table}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny,1b")
    ap.add_argument("--wtype", default="f16")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--prefill", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    result = {}
    for model in args.model.split(","):
        for wtype in args.wtype.split(","):
            base = {"backend": args.backend, "model": model, "wtype": wtype}
            runs = {"decode": _profile_run({**base, "steps": args.steps, "prompt_tokens": args.prompt_tokens})}
            if args.prefill:
                p = args.prefill
                sc = SimpleNamespace(name=None, timeline=[{"at_step": k, "prefill": p} for k in (1, 2, 3)])
                runs["prefill"] = _profile_run({**base, "steps": 3, "prompt_tokens": p}, sc)
            for rname, kinds in runs.items():
                for kind, r in kinds.items():
                    if rname == "prefill" and kind != "prefill":
                        continue
                    label = f"{model} {wtype} {kind}"
                    result[label] = r
                    print(f"== {label}: {r['steps']} steps, wall {r['wall_ms']:.3f} ms, gpu {r['gpu_ms']:.3f} ms, "
                          f"kernels busy {r['kernel_busy_us']:.1f} us, span {r['kernel_span_us']:.1f} us, "
                          f"{r['kernels_per_step']} kernels, memcpy {r['memcpy_us']:.1f} us, n_kv {r['n_kv']}, "
                          f"T {r['n_tokens']}", flush=True)
                    if kind not in ("decode replay", "prefill") or (rname == "decode" and kind == "prefill"):
                        continue
                    print("   by kernel: " + ", ".join(f"{k} {v:.1f}" for k, v in list(r["by_name_us"].items())[:10]))
                    for row in r["kernels"][: args.top]:
                        print(f"   {row['us_per_step']:9.1f} us/step {row['per_step']:5.1f}x {row['us_per_call']:8.2f} us"
                              f"  {row['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

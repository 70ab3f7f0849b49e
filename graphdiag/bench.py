"""Benchmarks (measured, never asserted in tests): the full-ledger comparison, and step times by phase."""

from __future__ import annotations

import statistics
import time

import numpy as np

from .backends.gpu.ledger import changed_nodes, snapshot
from .model.build import DECODE, GraphParams, build_graph
from .model.presets import get_preset, weight_type
from .model.weights import create_model


def median_ns(fn, reps: int, warmup: int = 3) -> float:
    """Median host time of fn() in ns over `reps` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


def ledger_bench(model: str = "7b", batch: int = 1, n_kv: int = 4096, reps: int = 50) -> dict:
    """Time the slow path of the identity check on a decode graph built without data: one snapshot gather,
    one vectorised comparison against the stored snapshot, and the two together (what a uid miss costs)."""
    cfg = get_preset(model)
    m = create_model(cfg, weight_type("f16"), with_data=False)
    g = build_graph(m, GraphParams(batch, batch, batch, DECODE, min(n_kv, cfg.n_ctx))).graph
    rng = np.random.default_rng(0)
    m.arena.rec["data"][: m.arena.top] = rng.integers(1, 1 << 40, m.arena.top, dtype=np.uint64)  # real pointers
    stored = snapshot(m.arena, g.nodes)
    scratch = snapshot(m.arena, g.nodes)
    gather = median_ns(lambda: snapshot(m.arena, g.nodes, out=scratch), reps)
    compare = median_ns(lambda: changed_nodes(stored, scratch), reps)
    both = median_ns(lambda: changed_nodes(stored, snapshot(m.arena, g.nodes, out=scratch)), reps)
    return {"model": model, "n_nodes": g.n_nodes, "snapshot_bytes": stored.nbytes, "gather_us": gather / 1e3,
            "compare_us": compare / 1e3, "check_us": both / 1e3, "reps": reps}


def step_times(events) -> dict:
    """Medians of synchronised step wall times and GPU times by the step's mode, and per-chunk update vs
    instantiate times, from a run's events (first step of each mode excluded when there are more)."""
    from . import events as E
    by_mode: dict[str, list] = {}
    for e in events:
        if isinstance(e, E.StepFinished):
            by_mode.setdefault(e.mode, []).append((e.duration_ns, e.gpu_ns))
    out = {}
    for mode, xs in by_mode.items():
        xs = xs[1:] if len(xs) > 2 else xs
        out[mode] = {"steps": len(xs), "wall_ms": statistics.median(x[0] for x in xs) / 1e6,
                     "gpu_ms": statistics.median(x[1] for x in xs) / 1e6}
    for name, cls in (("update", E.ChunkUpdated), ("instantiate", E.ChunkInstantiated), ("refused", E.UpdateRefused)):
        xs = [e.duration_ns for e in events if isinstance(e, cls)]
        if xs:
            out[f"chunk_{name}_ms"] = {"count": len(xs), "median": statistics.median(xs) / 1e6}
    return out

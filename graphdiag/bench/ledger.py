"""The cost of the full node-property comparison (a uid miss) on a decode graph built without data."""

from __future__ import annotations

import numpy as np

from ..backends.gpu.ledger import changed_nodes, snapshot
from ..model.build import DECODE, GraphParams, build_graph
from ..model.source import build_model, model_config
from .timing import median_ns


def ledger_bench(model: str = "7b", batch: int = 1, n_kv: int = 4096, reps: int = 50) -> dict:
    """Time the slow path of the identity check: one snapshot gather, one vectorised comparison against the
    stored snapshot, and the two together (what a uid miss costs). Times in µs. `model`: a preset (F16) or a
    GGUF file (its own types; structure only, no weights read)."""
    cfg = model_config(model)
    m = build_model(model, "f16", with_data=False)
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

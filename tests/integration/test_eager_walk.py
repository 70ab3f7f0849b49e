"""An eager step without concurrent regions runs its ops straight from the node groups (CaptureLoop.run_eager,
without evaluate()'s per-node chunk and fork bookkeeping, host time paid per launch): the same launches, in
the same order, with the same parameters as evaluate()'s walk of every node, and the same tokens."""

from __future__ import annotations

import pytest

from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.gpu import capture
from support.simrun import run_sim


def _launches(monkeypatch, walk: bool, **settings):
    seen, used = [], []
    real = SimDriver.launch

    def launch(self, stream, l):
        seen.append((l.kernel, tuple(l.grid), tuple(l.block), l.params.tobytes()))
        return real(self, stream, l)
    monkeypatch.setattr(SimDriver, "launch", launch)
    fast = capture.CaptureLoop.run_eager

    def run_eager(self, lowered):
        used.append(1)
        return fast(self, lowered)
    monkeypatch.setattr(capture.CaptureLoop, "run_eager", run_eager)
    if walk:   # evaluate()'s general walk: the fast path's guard sees no LoweredOps
        monkeypatch.setattr(capture, "LoweredOps", type("NotLowered", (), {}))
    r = run_sim(steps=6, graphs_disabled=True, sim_mode="compute", **settings)
    monkeypatch.undo()
    return seen, used, r


@pytest.mark.parametrize("model, wtype, pool", [("tiny", "q8_0", {}), ("moe-tiny", "f16", {}),
                                               ("gemma3-tiny", "f16", {}),
                                               ("tiny", "q8_0", {"pool_max_buffers": 0})])
def test_the_eager_fast_path_launches_what_the_walk_launches(monkeypatch, model, wtype, pool):
    """Also with a pool that caches nothing, whose every free releases the buffer: the run held back is
    launched before that (the simulated device refuses a launch on released memory)."""
    fast, used, a = _launches(monkeypatch, False, model=model, wtype=wtype, **pool)
    walked, unused, b = _launches(monkeypatch, True, model=model, wtype=wtype, **pool)
    assert used and not unused          # the first run took the fast path, the second the walk
    assert len(fast) > 50 and fast == walked
    assert a.tokens == b.tokens


def test_concurrent_regions_keep_the_walk(monkeypatch):
    """Forked regions need evaluate()'s fork/join handling: an eager evaluation with regions (the warm-up
    steps of a run with concurrent streams) never takes the fast path; one without does."""
    fast_calls, with_regions = [], []
    fast, evaluate = capture.CaptureLoop.run_eager, capture.CaptureLoop.evaluate

    def run_eager(self, lowered):
        fast_calls.append(1)
        return fast(self, lowered)

    def watched(self, entry, graph, split, use_graph, update, lowered, plan, regions):
        before = len(fast_calls)
        out = evaluate(self, entry, graph, split, use_graph, update, lowered, plan, regions)
        if regions and not (use_graph and update):
            with_regions.append(len(fast_calls) - before)
        return out
    monkeypatch.setattr(capture.CaptureLoop, "run_eager", run_eager)
    monkeypatch.setattr(capture.CaptureLoop, "evaluate", watched)
    run_sim(steps=6, model="small", concurrent_streams=True)
    assert with_regions and not any(with_regions) and fast_calls


def test_eager_launches_reach_the_driver_in_runs_before_the_rest_is_lowered(monkeypatch):
    """run_eager hands its launches to launch_batch in runs: on a graph not yet lowered, the first run goes
    out while later node groups are still unlowered (the GPU starts while the host lowers); a graph lowered
    before (reused) goes out in fewer runs; every launch goes out once, in order."""
    from graphdiag.backends.drivers.base import Driver
    state = {"lowered": None, "first": True}
    fresh, early, runs_of, counted = [], [], [], []
    fast = capture.CaptureLoop.run_eager

    def run_eager(self, lowered):
        state["lowered"], state["first"] = lowered, True
        fresh.append(not lowered.is_lowered(lowered.group_starts()[-1]))
        runs_of.append([])
        n = fast(self, lowered)
        counted.append(n)
        return n

    def launch_batch(self, stream, launches):
        if state["first"]:
            lw = state["lowered"]
            early.append(not lw.is_lowered(lw.group_starts()[-1]))
            state["first"] = False
        runs_of[-1].append(len(launches))
        return Driver.launch_batch(self, stream, launches)
    monkeypatch.setattr(capture.CaptureLoop, "run_eager", run_eager)
    monkeypatch.setattr(SimDriver, "launch_batch", launch_batch)
    run_sim(steps=4, graphs_disabled=True, model="tiny", wtype="q8_0")
    assert any(fresh) and early == fresh          # first run early exactly where there was lowering left
    first, most = capture.CaptureLoop.FIRST_RUN, capture.CaptureLoop.MAX_RUN
    for new, runs, n in zip(fresh, runs_of, counted):
        assert sum(runs) == n                     # plain and scratch launches alike (no sorted MUL_MAT_ID here)
        # a step's first run is short (a scratch op adds its two launches at once), none is long
        assert runs[0] <= first + 1 and max(runs) <= most + 1 and len(runs) > 2


def test_steps_after_a_graphs_first_take_its_prepared_ops(monkeypatch):
    """Once a graph's ops are all lowered and prepared (its first eager step), later steps on it run them from
    LoweredOps.ready_ops without asking per group whether it is lowered: a step on a fresh graph never does,
    every later decode step does, and the launches stay the walk's (the first test compares them)."""
    took, fresh = [], []
    fast, walk = capture.CaptureLoop.run_eager, capture.CaptureLoop._lowering

    def run_eager(self, lowered):
        fresh.append(lowered.ready_ops() is None)
        took.append(True)
        return fast(self, lowered)

    def lowering(lowered, drv):        # the per-group walk: the prepared ops were not taken
        took[-1] = False
        return walk(lowered, drv)
    monkeypatch.setattr(capture.CaptureLoop, "run_eager", run_eager)
    monkeypatch.setattr(capture.CaptureLoop, "_lowering", staticmethod(lowering))
    run_sim(steps=6, graphs_disabled=True, model="tiny", wtype="q8_0")
    assert took == [not f for f in fresh]
    assert fresh[:2] == [True, True] and not any(fresh[2:]) and len(took) >= 7   # prefill, first decode, rest

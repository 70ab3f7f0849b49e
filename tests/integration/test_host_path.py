"""The replay path's host work (issue 9.2) and the per-stream pools: fewer copies and walks, same decisions."""

import numpy as np

from graphdiag import events as E
from graphdiag.backends.gpu import runtime as rt_mod
from graphdiag.config import resolve
from graphdiag.counters import Counters
from graphdiag.plan import StepPlan
from graphdiag.runner import RunResult, Session, Stepper


def _session(**kw):
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, **kw}, environ={})
    s = Session(cfg, E.EventBus())
    return s, Stepper(s, RunResult({}, [], Counters()))


def test_a_replayed_step_writes_its_inputs_in_one_copy():
    s, st = _session()
    try:
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        copies, written = [], []
        real = s.driver.memcpy_htod
        s.driver.memcpy_htod = lambda dst, src, stream=None: copies.append(src.nbytes) or real(dst, src, stream)
        real_many = s.gpu.tensor_set_many
        s.gpu.tensor_set_many = lambda items: written.extend((a, np.array(d)) for a, d in items) or real_many(items)
        st.step(StepPlan("decode", batch=1))
        assert len(copies) == 1                         # tokens, pos, mask, k/v idxs, out ids: one block run
        assert len(written) == 6
        for addr, want in written:                      # and each input landed where it belongs
            raw = want.view(np.uint8).reshape(-1)
            assert np.array_equal(s.gpu.tensor_get(addr, raw.nbytes), raw)
    finally:
        s.close()


def test_the_compatibility_walk_runs_only_when_the_uid_changes(monkeypatch):
    calls = []
    real = rt_mod.check_compatibility
    monkeypatch.setattr(rt_mod, "check_compatibility", lambda g, cc: calls.append(g.uid) or real(g, cc))
    s, st = _session()
    try:
        for _ in range(6):
            st.step(StepPlan("decode", batch=1))
        assert len(calls) == len(set(calls)) == 1       # decode graph reused: one uid, one walk
    finally:
        s.close()


def test_each_stream_has_its_own_pool_and_any_pool_invalidates_everything():
    s, st = _session(concurrent_streams=True, wtype="q8_0")
    seen = []
    s.bus.subscribe(seen.append)
    try:
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        assert len(s.gpu.pools) >= 2                     # Q8_1 scratch taken on the branch streams too
        branch = next(p for k, p in s.gpu.pools.items() if p is not s.gpu.pool)
        assert branch.n_device_allocs >= 1
        branch.invalidate("alloc failure", 0)
        assert any(isinstance(e, E.PoolInvalidated) for e in seen)
        assert not s.gpu.runtime.cache.entries
    finally:
        s.close()
    assert not s.gpu.pools


def test_the_oracle_rounds_activations_to_q8_1_only_for_the_gpu_backend():
    from support.simrun import of, run_sim
    sim = run_sim(wtype="q8_0", steps=2, prompt_tokens=1, oracle=True)
    assert max(c.rel_err for c in of(sim, E.OracleCheck)) < 1e-5      # the GPU path's own arithmetic
    cpu = run_sim(wtype="q8_0", steps=2, prompt_tokens=1, oracle=True, backend="cpu")
    assert max(c.rel_err for c in of(cpu, E.OracleCheck)) < 1e-3      # plain float products
    assert {c.bound for c in of(cpu, E.OracleCheck)} == {1e-3}


def test_a_q8_0_gpu_run_is_checked_within_the_q8_1_noise():
    """8 prompt tokens: one activation on a Q8_1 rounding midpoint sends the run ~1e-2 from the oracle
    (the quantisation noise itself); the bound says so and the run passes."""
    from support.simrun import of, run_sim
    r = run_sim(wtype="q8_0", steps=2, prompt_tokens=8, oracle=True)
    checks = of(r, E.OracleCheck)
    assert {c.bound for c in checks} == {3e-2} and all(c.ok for c in checks) and not r.failures
    assert max(c.rel_err for c in checks) > 1e-3


def test_the_input_copy_grouping_is_worked_out_once_per_placement(monkeypatch):
    from graphdiag.backends.gpu import backend as be_mod
    from graphdiag.backends.gpu.backend import _copy_runs
    calls = []
    monkeypatch.setattr(be_mod, "_copy_runs", lambda layout: calls.append(layout) or _copy_runs(layout))
    s, st = _session()
    try:
        for _ in range(6):
            st.step(StepPlan("decode", batch=1))
        assert len(calls) == len(set(calls)) == 1        # one reused decode graph: one layout
    finally:
        s.close()
    # adjacent aligned blocks join one run, a gap starts another; offsets are from the run's start
    assert _copy_runs(((0x1100, 8), (0x1000, 4), (0x2000, 4))) == [
        (0x1000, 0x108, [(1, 0), (0, 0x100)]), (0x2000, 4, [(2, 0)])]

"""Lifetimes under faults (issue 8.6): nothing destroyed stays in an entry, nothing captured leaks, and the
--verify recompute hides no pool event."""

import pytest

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.counters import Counters
from graphdiag.errors import CudaError
from graphdiag.plan import StepPlan
from graphdiag.runner import RunResult, Session, Stepper


def _session(**kw):
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, **kw}, environ={})
    bus = E.EventBus()
    s = Session(cfg, bus)
    return s, bus, Stepper(s, RunResult({}, [], Counters()))


def test_a_refused_update_whose_reinstantiate_fails_leaves_no_destroyed_executable():
    s, bus, st = _session(chunk_size=8)
    refused, seen = [], []
    bus.subscribe(lambda e: refused.append(e) if isinstance(e, E.UpdateRefused) else None)
    bus.subscribe(seen.append)
    try:
        for _ in range(3):                                   # eager, capture, replay at 1 token
            st.step(StepPlan("decode", batch=1))
        entry = next(iter(s.gpu.runtime.cache.entries.values()))
        assert len(entry.instances) > 2
        real = s.driver.instantiate

        def failing(graph):
            raise CudaError("CUDA_ERROR_OUT_OF_MEMORY", "instantiate", "injected")
        s.driver.instantiate = failing
        st.step(StepPlan("decode", batch=2))                 # 2 sequences: eager (properties changed)
        with pytest.raises(CudaError):
            st.step(StepPlan("decode", batch=2))             # capture: chunk 0 refused, re-instantiate fails
        s.driver.instantiate = real
        assert refused
        # the failed step releases the entry: the chunks before the refused one (alive until then) are
        # destroyed with it, the destroyed one was never kept, and the key warms up again
        reset = [e for e in seen if isinstance(e, E.EntryReset)]
        assert len(reset) == 1 and reset[0].n_executables == refused[0].chunk
        assert entry.instances == [] and not entry.warmup_complete and not s.driver.is_capturing(s.gpu.stream0)
    finally:
        s.close()


def test_a_pool_invalidation_during_a_capture_ends_it_and_the_run_goes_on_correctly():
    """A free into a full pool during the capture step invalidates every graph: the capture in progress is
    ended and dropped, the split finishes eagerly (the oracle checks what it computed) and the key warms
    up again: eager, capture, replay."""
    s, bus, st = _session(oracle=True, pool_invalidation=True)   # the article's rule
    seen = []
    bus.subscribe(lambda e: seen.append(e))
    try:
        st.step(StepPlan("decode", batch=1))                 # eager: the pool caches its buffers
        s.gpu.pool.max_buffers = 0                           # the capture step's frees cannot be cached
        st.step(StepPlan("decode", batch=1))
        s.gpu.pool.max_buffers = 256
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        ab = [e for e in seen if isinstance(e, E.CaptureAbandoned)]
        assert len(ab) == 1 and ab[0].reason == "pool invalidated during capture"
        step = ab[0].step
        assert any(isinstance(e, E.PoolInvalidated) and e.step == step for e in seen)
        assert any(isinstance(e, E.EagerRun) and e.step == step for e in seen)
        assert not any(isinstance(e, E.CaptureRun) and e.step == step for e in seen)
        phases = [e.phase for e in seen if isinstance(e, E.PhaseDecided) and e.step > step]
        assert phases == ["eager", "capture", "replay"]
        checks = [e for e in seen if isinstance(e, E.OracleCheck)]
        assert len(checks) == 5 and all(c.ok for c in checks)
        assert not s.driver._captures and not s.driver.is_capturing(s.gpu.stream0)
    finally:
        s.close()


def test_the_verify_recompute_reports_a_pool_invalidation():
    s, bus, st = _session(pool_invalidation=True)          # the article's rule
    seen = []
    bus.subscribe(lambda e: seen.append(e))
    try:
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        pool = s.gpu.pool
        real = pool.alloc

        def flushing(size):
            pool.invalidate("alloc failure", 0)
            return real(size)
        pool.alloc = flushing
        with s.gpu.verifying():
            s.ctx.recompute()
        assert any(isinstance(e, E.PoolInvalidated) for e in seen)
    finally:
        s.close()


def test_close_releases_everything_after_a_step_failed_mid_capture():
    s, bus, st = _session(chunk_size=8)
    execs, streams = [], []
    real_inst, real_stream, real_launch = s.driver.instantiate, s.driver.stream_create, s.driver.launch
    s.driver.instantiate = lambda g: execs.append(real_inst(g)) or execs[-1]
    n = {"launches": 0}

    def launch(stream, l):
        if s.driver.is_capturing(stream):
            n["launches"] += 1
            if n["launches"] == 40:                     # well into the capture, after some chunks
                raise CudaError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "launch", "injected")
        return real_launch(stream, l)
    s.driver.launch = launch
    streams = list(s.gpu.streams)
    try:
        st.step(StepPlan("decode", batch=1))
        with pytest.raises(CudaError):
            st.step(StepPlan("decode", batch=1))
        assert execs                                     # chunks before the failure were instantiated
    finally:
        s.close()
    assert all(not x.alive for x in execs)
    assert all(not x.alive for x in streams)
    assert not s.driver._allocs and not s.driver._captures


def test_a_failed_step_is_reported_as_itself_when_the_timers_of_the_step_before_fail_too():
    """A step's GPU time is read once the next step is queued. When that next step fails, and the device
    errs from then on (a sticky CUDA error), the run still ends with the step's own error, not one from
    reading the timers; the step before keeps its StepFinished, its GPU time unmeasured (0)."""
    s, bus, st = _session()
    rec = bus.subscribe(E.Recorder())
    try:
        st.run([StepPlan("decode", batch=1)] * 4)
        real_launch = s.driver.graph_launch

        def sticky(*a):
            raise CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "cuEventElapsedTime", "injected")

        calls = []

        def launch(*a):
            calls.append(1)
            if len(calls) == 1:                          # step 4 replays; step 5's launch fails
                return real_launch(*a)
            s.driver.event_elapsed_ms = sticky          # every later call fails, as after an illegal address
            raise CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "cuGraphLaunch", "injected")
        s.driver.graph_launch = launch
        with pytest.raises(CudaError, match="cuGraphLaunch"):
            st.run([StepPlan("decode", batch=1)] * 3)
        s.driver.graph_launch = real_launch
    finally:
        s.driver.event_elapsed_ms = lambda *a: 0.0
        s.close()
    finished = rec.of(E.StepFinished)
    assert [e.step for e in finished] == [0, 1, 2, 3, 4] and finished[-1].gpu_ns == 0
    assert all(e.gpu_ns > 0 for e in finished[:-1])

"""Issue 25 points 1-2: a failed step is rolled back as llama_decode's failure path (its KV cells removed,
the step counted, the graph released) and the run goes on; faults a user can rehearse from a scenario."""

from types import SimpleNamespace

import numpy as np
import pytest
from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.counters import Counters
from graphdiag.errors import CudaError
from graphdiag.plan import StepPlan
from graphdiag.report.analysis.summary import summarize
from graphdiag.runner import RunResult, Session, Stepper, run
from graphdiag.sched.kv_cells import KvCells

FAULT_SCENARIOS = ("fault-launch", "fault-capture", "fault-instantiate", "fault-update")


def of(events, *kinds):
    return [e for e in events if isinstance(e, kinds)]


def test_seq_rm_frees_the_positions_from_p0_and_the_next_placement_takes_them_again():
    kv = KvCells(512)
    for p in range(3):                                   # seq 0 at 0..2 and seq 1 at 0..2, interleaved
        kv.place(np.array([0, 1], np.int32), np.array([p, p], np.int32))
    n_kv = kv.n_kv()
    assert kv.seq_rm(0, 1) == 2
    assert kv.next_pos(0) == 1 and kv.next_pos(1) == 3
    assert kv.seq.tolist()[:6] == [0, 1, -1, 1, -1, 1]
    cells = kv.place(np.array([0], np.int32), np.array([1], np.int32))
    assert cells.tolist() == [2] and kv.n_kv() == n_kv
    assert kv.seq_rm(1, 0) == 3 and kv.next_pos(1) == 0


def _stepper(**kw):
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, "oracle": True, **kw}, environ={})
    bus, seen = E.EventBus(), []
    bus.subscribe(seen.append)
    s = Session(cfg, bus)
    return s, seen, Stepper(s, RunResult({}, [], Counters()))


def test_a_failed_replay_is_rolled_back_and_every_later_step_matches_the_oracle():
    """Before the rollback, every step after a failed one was 0.12-0.15 off the oracle (its KV cell stayed
    placed, so the next token took the position after it)."""
    s, seen, st = _stepper()
    try:
        st.step(StepPlan("prefill", n_tokens=4))
        for _ in range(3):
            st.step(StepPlan("decode"))
        pos_before = s.ctx.kv.next_pos(0)

        def failing(*a):
            raise CudaError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cuGraphLaunch", "test")
        s.driver.graph_launch = failing
        with pytest.raises(CudaError):
            st.step(StepPlan("decode"))
        del s.driver.graph_launch
        assert s.ctx.kv.next_pos(0) == pos_before and s.ctx.step == 5      # the failed step counted
        removed = of(seen, E.CellsRemoved)
        assert [(e.step, e.seq, e.pos_min, e.n_cells) for e in removed] == [(4, 0, pos_before, 1)]
        reset = of(seen, E.EntryReset)
        assert len(reset) == 1 and reset[0].n_executables == 1 and not s.gpu.runtime.cache.entries[reset[0].key].instances
        failed = of(seen, E.StepFailed)
        assert len(failed) == 1 and failed[0].recoverable and failed[0].status == -3 and not failed[0].fault
        for _ in range(4):
            st.step(StepPlan("decode"))
        checks = of(seen, E.OracleCheck)
        assert len(checks) == 8 and all(c.ok for c in checks), [(c.step, c.rel_err) for c in checks]
        assert [e.phase for e in of(seen, E.PhaseDecided) if e.step > 4][:2] == ["capture", "replay"]
    finally:
        s.close()


def test_a_failed_allocation_keeps_no_graph_and_the_next_step_allocates_again():
    """ggml_backend_sched_alloc_graph failing (GGML_STATUS_ALLOC_FAILED, llama_decode -2): no graph is kept,
    the allocator's buffer is gone with its plans; the next step builds, plans and allocates again. The
    context's reserve covers every ubatch llama.cpp makes; a 64-token step past a 16-token n_ubatch (a step
    handed over directly: plan.py would split it) outgrows it, so the compute buffer must grow."""
    s, seen, st = _stepper(ubatch_size=16)
    try:
        st.step(StepPlan("prefill", n_tokens=4))
        st.step(StepPlan("decode"))
        s.faults.arm("oom")
        with pytest.raises(CudaError, match="OUT_OF_MEMORY"):
            st.step(StepPlan("prefill", n_tokens=64))
        s.faults.disarm()
        assert s.ctx.res is None and s.ctx.sched.galloc.nodes == []
        assert of(seen, E.StepFailed)[0].status == -2
        for _ in range(3):
            st.step(StepPlan("decode"))
        assert all(c.ok for c in of(seen, E.OracleCheck))
    finally:
        s.close()


@pytest.mark.parametrize("name", FAULT_SCENARIOS)
def test_each_fault_scenario_recovers_with_oracle_verify_and_strict(name, tmp_path, capsys):
    rec = tmp_path / "run.jsonl"
    rc = main(["run", "--backend", "sim", "--scenario", name, "--oracle", "--verify", "--strict", "--events", str(rec)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"scenario {name}: every expectation holds" in out
    assert "failed: fault" in out and "recovered: step" in out
    from graphdiag.report.record import read_record
    header, events = read_record(rec)
    s = summarize(header, events)
    (f,) = s.faults.failures
    assert f.fault == name.removeprefix("fault-") and f.recovered and f.released
    assert s.oracle_failures == 0 and s.oracle_checks == s.steps and s.verify_mismatches == 0


def test_the_oom_scenarios_fault_is_absorbed_by_the_pool(tmp_path, capsys):
    """fault-oom: the compute buffer never grows after the context's reserve; the 64-token prefill's one device
    allocation is the CUDA pool's growth, which flushes its cache and allocates again (ggml_cuda_pool_leg)."""
    rc = main(["run", "--backend", "sim", "--scenario", "fault-oom", "--oracle", "--verify", "--strict"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "scenario fault-oom: every expectation holds" in out
    assert "fault absorbed: step 18: fault 'oom' (cuMemAlloc CUDA_ERROR_OUT_OF_MEMORY)" in out


def _scenario(*timeline, **run):
    return SimpleNamespace(name="t", path="t.toml", timeline=list(timeline), expect={}, run=run)


def test_a_recovered_decode_fault_generates_the_tokens_of_the_run_without_it():
    cfg = resolve({"backend": "sim", "steps": 14, "prompt_tokens": 8}, environ={})
    clean = run(cfg, _scenario())
    for kind, step in (("launch", 6), ("capture", 2), ("instantiate", 2)):
        faulted = run(cfg, _scenario({"at_step": step, "fault": kind}))
        assert len(of(faulted.events, E.StepFailed)) == 1
        assert sum(faulted.tokens, []) == sum(clean.tokens, [])[: len(sum(faulted.tokens, []))]
        assert len(faulted.tokens) == len(clean.tokens) - 1


def test_a_fault_at_the_last_step_is_not_recovered_and_fails_strict():
    cfg = resolve({"backend": "sim", "steps": 6, "prompt_tokens": 4}, environ={})
    r = run(cfg, _scenario({"at_step": 6, "fault": "launch"}))
    s = summarize(r.header, r.events)
    assert [f.step for f in s.faults.unrecovered] == [6]
    assert any(x.startswith("unrecovered failure: step 6") and "NOT RECOVERED" in x for x in s.strict)
    assert r.failures == []                     # an injected fault is not a failure of the run by itself


def test_a_fault_that_never_fires_is_reported_and_fails_strict():
    cfg = resolve({"backend": "sim", "steps": 8, "prompt_tokens": 4}, environ={})
    r = run(cfg, _scenario({"at_step": 5, "fault": "update"}))      # a replayed step updates nothing
    s = summarize(r.header, r.events)
    assert not of(r.events, E.StepFailed) and s.faults.missed
    assert any(x.startswith("fault missed: step 5") and "cuGraphExecUpdate" in x for x in s.strict)


def _third_graph_launch_fails(monkeypatch, result: str) -> None:
    """The simulated driver's third cuGraphLaunch returns `result` (a real failure: no fault armed)."""
    from graphdiag.backends.drivers.sim import SimDriver
    real = SimDriver.graph_launch
    calls = {"n": 0}

    def launch(self, exec_, stream):
        calls["n"] += 1
        if calls["n"] == 3:
            raise CudaError(result, "cuGraphLaunch", "test")
        return real(self, exec_, stream)
    monkeypatch.setattr(SimDriver, "graph_launch", launch)


def test_a_sticky_error_ends_the_run_after_rolling_back(monkeypatch):
    _third_graph_launch_fails(monkeypatch, "CUDA_ERROR_ILLEGAL_ADDRESS")
    cfg = resolve({"backend": "sim", "steps": 10, "prompt_tokens": 4}, environ={})
    bus_events = []
    with pytest.raises(CudaError, match="ILLEGAL_ADDRESS"):
        run(cfg, _scenario(), sinks=[bus_events.append])
    (f,) = of(bus_events, E.StepFailed)
    assert not f.recoverable and of(bus_events, E.CellsRemoved)
    assert of(bus_events, E.RunEnded)[0].status == "failed"


def test_a_real_recoverable_failure_goes_on_and_fails_the_run(monkeypatch):
    _third_graph_launch_fails(monkeypatch, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
    cfg = resolve({"backend": "sim", "steps": 10, "prompt_tokens": 4}, environ={})
    r = run(cfg, _scenario())
    assert of(r.events, E.RunEnded)[0].status == "complete" and len(r.tokens) == 1 + 10 - 1
    assert len(r.failures) == 1 and "rolled back" in r.failures[0]


def test_a_fault_on_the_cpu_backend_is_refused_up_front(tmp_path, capsys):
    f = tmp_path / "cpu-fault.toml"
    f.write_text('name = "cpu-fault"\ndescription = "x"\ntimeline = [{ at_step = 2, fault = "launch" }]\n'
                 '[run]\nsteps = 4\n[expect]\nstep_failures = 1\n')
    rc = main(["run", "--backend", "cpu", "--scenario", str(f)])
    err = capsys.readouterr().err
    assert rc == 2 and "cpu backend has no driver" in err and len(err.strip().splitlines()) == 1


def test_an_unknown_fault_kind_is_refused_at_load(tmp_path):
    from graphdiag.errors import ScenarioError
    from graphdiag.scenario import load_file
    f = tmp_path / "bad-fault.toml"
    f.write_text('name = "bad-fault"\ndescription = "x"\ntimeline = [{ at_step = 2, fault = "segfault" }]\n'
                 '[expect]\nstep_failures = 1\n')
    with pytest.raises(ScenarioError, match=r"bad-fault.toml:3: fault must be one of launch, capture"):
        load_file(f)

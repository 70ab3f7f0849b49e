"""Gates tested in isolation: the uid assertion, and --verify catching a replay that computes something else."""

import pytest

from graphdiag import events as E
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.gpu.runtime import GraphRuntime, RuntimeOptions
from graphdiag.cli.main import main
from graphdiag.errors import InternalError
from graphdiag.ir import Arena, GGMLType, Graph
from graphdiag.ir.build import Ctx


def _graph(arena, n_layers):
    ctx = Ctx(arena)
    x = ctx.new_input(GGMLType.F32, (64, 1), "x")
    for i in range(n_layers):
        x = ctx.rms_norm(x, 1e-5, f"norm-{i}")
    g = Graph(arena)
    g.build_forward_expand(x)
    return g


def test_same_uid_with_another_node_count_is_an_internal_error():
    bus = E.EventBus()
    rt = GraphRuntime(SimDriver(), bus, RuntimeOptions())
    arena = Arena()
    g = _graph(arena, 3)
    g.uid = 41
    entry = rt.lookup(g, 0)
    assert rt.update_required(entry, g, 0) is True      # first sight: recorded
    assert rt.update_required(entry, g, 0) is False     # uid hit
    arena.reset()
    g2 = _graph(arena, 4)
    g2.uid = 41
    with pytest.raises(InternalError, match="uid 41 reused with 4 nodes but 3 recorded"):
        rt.update_required(entry, g2, 0)


def test_verify_reports_a_replay_that_differs_from_eager(monkeypatch, capsys):
    """A driver whose replay skips the last kernel node computes stale logits: --verify must say so."""
    real_launch = SimDriver.graph_launch

    def lossy_launch(self, exec_, stream):
        order = exec_.order
        exec_.order = order[:-1]
        try:
            real_launch(self, exec_, stream)
        finally:
            exec_.order = order

    monkeypatch.setattr(SimDriver, "graph_launch", lossy_launch)
    rc = main(["run", "--backend", "sim", "--steps", "4", "--prompt-tokens", "4", "--verify"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAILED: step 3: replay differs from eager (max |diff|" in out


def test_verify_keeps_the_step_timers_and_close_destroys_every_event(monkeypatch):
    """--verify's eager recompute must neither drop the timing events (leaked: never destroyed) nor the splits
    timed since the last collect."""
    from graphdiag.config import resolve
    from graphdiag.counters import Counters
    from graphdiag.plan import StepPlan
    from graphdiag.runner import RunResult, Session, Stepper

    made = []
    real_create = SimDriver.event_create

    def tracked_create(self, timing=False):
        ev = real_create(self, timing)
        made.append(ev)
        return ev

    monkeypatch.setattr(SimDriver, "event_create", tracked_create)
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, "verify": True}, environ={})
    s = Session(cfg, E.EventBus())
    try:
        st = Stepper(s, RunResult({}, [], Counters()))
        for _ in range(4):                      # eager, eager, capture, replay (verified)
            st.step(StepPlan("decode", batch=1))
        timers = list(s.gpu._timers)
        assert timers
        with s.gpu.verifying():
            s.ctx.recompute()
        assert s.gpu._timers == timers
        s.ctx.recompute()                       # the inputs sent again: the graph may have reused them
        with s.gpu.verifying():
            pass
        assert len(s.gpu._timed) == 1 and s.gpu.collect_gpu_ns() > 0
    finally:
        s.close()
    assert made and not [ev for ev in made if ev.alive]


def test_a_failure_mid_capture_ends_the_capture_and_the_key_warms_up_again(monkeypatch):
    """A kernel launch that fails while capturing: the half-captured graph is dropped (the stream is not
    left capturing), the entry must warm up again, and later steps work."""
    from graphdiag.config import resolve
    from graphdiag.counters import Counters
    from graphdiag.errors import CudaError
    from graphdiag.plan import StepPlan
    from graphdiag.runner import RunResult, Session, Stepper
    real_launch = SimDriver.launch
    fail = {"on": True}

    def failing_launch(self, stream, launch):
        if fail["on"] and self.is_capturing(stream):
            raise CudaError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cuLaunchKernelEx(" + launch.kernel + ")")
        return real_launch(self, stream, launch)

    monkeypatch.setattr(SimDriver, "launch", failing_launch)
    s = Session(resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4}, environ={}), E.EventBus())
    try:
        rec = E.Recorder()
        s.bus.subscribe(rec)
        st = Stepper(s, RunResult({}, [], Counters()))
        st.step(StepPlan("decode", batch=1))            # eager (first call for the key)
        with pytest.raises(CudaError, match="LAUNCH_OUT_OF_RESOURCES"):
            st.step(StepPlan("decode", batch=1))        # capture fails
        assert not s.driver.is_capturing(s.gpu.stream0)
        fail["on"] = False
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        phases = [e.phase for e in rec.of(E.PhaseDecided)][-3:]
        assert phases == ["capture", "replay", "replay"]     # properties unchanged: warm again at once
    finally:
        s.close()


def test_eager_steps_prepare_each_op_at_first_use_and_captures_before_they_begin(monkeypatch):
    """Lowered ops are prepared by the evaluation: eagerly, each right before its first launch (so the GPU
    starts on the first nodes while the host packs the rest); before a capture, every op not yet prepared,
    ahead of begin_capture. Either way no launch is issued unprepared."""
    from graphdiag.config import resolve
    from graphdiag.counters import Counters
    from graphdiag.plan import StepPlan
    from graphdiag.runner import RunResult, Session, Stepper

    log = []
    real = {n: getattr(SimDriver, n) for n in ("prepare", "launch", "begin_capture")}

    def prepare(self, launch):
        log.append(("prepare", id(launch)))
        return real["prepare"](self, launch)

    def launch(self, stream, la):
        log.append(("launch", id(la)))
        return real["launch"](self, stream, la)

    def begin_capture(self, stream):
        log.append(("begin", 0))
        return real["begin_capture"](self, stream)

    for name, fn in (("prepare", prepare), ("launch", launch), ("begin_capture", begin_capture)):
        monkeypatch.setattr(SimDriver, name, fn)
    # a launch rebuilt from the LaunchMemo with the bytes of the one before it takes that one's prepared
    # handle (launch_memo._take_prepared): prepared too, when it gets it
    from graphdiag.backends.gpu import launch_memo
    from graphdiag.backends.gpu.lowering import op_launches
    take = launch_memo._take_prepared

    def took(op, last):
        take(op, last)
        if op.ready:
            log.extend(("prepare", id(la)) for la in op_launches(op))

    monkeypatch.setattr(launch_memo, "_take_prepared", took)
    s = Session(resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4}, environ={}), E.EventBus())
    try:
        rec = E.Recorder()
        s.bus.subscribe(rec)
        st = Stepper(s, RunResult({}, [], Counters()))
        steps = []
        for k, plan in enumerate([StepPlan("prefill", n_tokens=40)] + [StepPlan("decode", batch=1)] * 3):
            if k == 2:   # the capture: as if its ops had been lowered but never run (none prepared yet)
                for entry in s.gpu.runtime.cache.entries.values():
                    for op in entry.lowered or ():
                        if op is not None and hasattr(op, "__slots__"):
                            op.ready = False
            start = len(log)
            st.step(plan)
            steps.append((rec.of(E.PhaseDecided)[-1].phase, start, len(log)))
    finally:
        s.close()
    assert [p for p, _, _ in steps] == ["eager", "eager", "capture", "replay"]
    prepared = set()
    for c, k in log:
        if c == "prepare":
            prepared.add(k)
        elif c == "launch":
            assert k in prepared, "a launch issued before it was prepared"
    # the prefill (lowered afresh): launches go out while later ops are still being prepared for the first
    # time (a scratch op's re-pack of a launch prepared before does not count)
    calls = log[steps[0][1]:steps[0][2]]
    firsts = {}
    for i, (c, k) in enumerate(calls):
        if c == "prepare":
            firsts.setdefault(k, i)
    assert next(i for i, (c, _) in enumerate(calls) if c == "launch") < max(firsts.values())
    # the capture: every op prepared before begin_capture (a scratch op's re-pack when the pool hands out
    # another buffer may still come inside it)
    calls = log[steps[2][1]:steps[2][2]]
    begin = next(i for i, (c, _) in enumerate(calls) if c == "begin")
    launched = {k for c, k in calls[begin:] if c == "launch"}
    assert launched
    before = {k for c, k in calls[:begin] if c == "prepare"}
    assert launched <= before


def test_an_eager_step_launches_its_first_kernels_before_the_rest_is_lowered(monkeypatch):
    """A graph new to the backend is lowered as the eager loop reaches its nodes (LoweredOps blocks), so
    the GPU starts on the first kernels while the host lowers the rest, as ggml's loop launches node by
    node; the next step of the same graph lowers nothing."""
    from graphdiag.backends.gpu.capture import LoweredOps
    from graphdiag.config import resolve
    from graphdiag.counters import Counters
    from graphdiag.plan import StepPlan
    from graphdiag.runner import RunResult, Session, Stepper

    log = []
    real_block, real_launch = LoweredOps._lower_block, SimDriver.launch

    def lower_block(self):
        log.append("lower")
        return real_block(self)

    def launch(self, stream, la):
        log.append("launch")
        return real_launch(self, stream, la)

    monkeypatch.setattr(LoweredOps, "_lower_block", lower_block)
    monkeypatch.setattr(SimDriver, "launch", launch)
    s = Session(resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4}, environ={}), E.EventBus())
    try:
        st = Stepper(s, RunResult({}, [], Counters()))
        steps = []
        for plan in [StepPlan("prefill", n_tokens=40)] + [StepPlan("decode", batch=1)] * 2:
            log.clear()
            st.step(plan)
            steps.append(list(log))
    finally:
        s.close()
    prefill, first_decode, second_decode = steps
    assert prefill.count("lower") > 1
    # the first launch goes out before the last block is lowered
    assert prefill.index("launch") < len(prefill) - 1 - prefill[::-1].index("lower")
    assert first_decode.count("lower") >= 1 and first_decode[0] == "lower"
    # the decode graph is reused: its ops are lowered already
    assert "lower" not in second_decode and second_decode.count("launch") == first_decode.count("launch")

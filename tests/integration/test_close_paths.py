"""Issue 25, point 3: close paths release everything even when one release fails; each release is tried
and the first error raised once all were (simulated driver, a release made to fail)."""

import pytest

from graphdiag import events as E
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.counters import Counters
from graphdiag.errors import CudaError
from graphdiag.plan import StepPlan
from graphdiag.runner import RunResult, Session, Stepper


def _injected(call):
    return CudaError("CUDA_ERROR_INVALID_HANDLE", call, "injected")


def _session(**kw):
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, **kw}, environ={})
    s = Session(cfg, E.EventBus())
    return s, Stepper(s, RunResult({}, [], Counters()))


def _fail_first(driver, name):
    """driver.<name> raises on its first call (releasing nothing), then works."""
    real, calls = getattr(driver, name), []

    def once(*a):
        calls.append(a)
        if len(calls) == 1:
            raise _injected(name)
        return real(*a)
    setattr(driver, name, once)
    return calls


def _track(driver, make):
    made, real = [], getattr(driver, make)
    setattr(driver, make, lambda *a: made.append(real(*a)) or made[-1])
    return made


def test_session_close_releases_every_executable_stream_and_buffer_when_one_destroy_fails():
    s, st = _session(chunk_size=8)
    execs = _track(s.driver, "instantiate")
    for _ in range(4):                                   # eager, capture (several chunks), replay
        st.step(StepPlan("decode", batch=1))
    streams = list(s.gpu.streams)
    assert len(execs) > 1 and streams
    _fail_first(s.driver, "exec_destroy")
    with pytest.raises(CudaError, match="exec_destroy"):
        s.close()
    assert [x.alive for x in execs] == [True] + [False] * (len(execs) - 1)   # only the one that failed
    assert all(not x.alive for x in streams)
    assert not s.driver._allocs                          # the driver closed too: every buffer freed


def test_device_set_close_closes_every_device_when_the_first_fails():
    s, st = _session(devices=2, tensor_split=(1, 1))
    st.step(StepPlan("decode", batch=1))
    d0, d1 = s.devices.drivers
    streams = [list(g.streams) for g in s.devices.gpus]
    _fail_first(d1, "stream_destroy")                    # the DeviceSet closes device 1 first
    with pytest.raises(CudaError, match="stream_destroy"):
        s.close()
    assert all(not x.alive for x in streams[0]) and all(not x.alive for x in streams[1][1:])
    assert not d0._allocs and not d1._allocs


def test_the_sim_driver_frees_every_allocation_when_one_free_fails():
    d = SimDriver()
    addrs = [d.mem_alloc(256) for _ in range(4)]
    real, tried = d.space.free, []

    def free(addr):
        tried.append(addr)
        if len(tried) == 1:
            raise _injected("mem_free")
        return real(addr)
    d.space.free = free
    with pytest.raises(CudaError):
        d.close()
    assert sorted(tried) == sorted(addrs) and not d._allocs


def test_a_failed_run_reports_its_own_error_not_a_release_after_it(capsys, monkeypatch):
    from graphdiag.runner import Stepper as S
    real_step = S.step

    def sticky_at_3(self, p):             # a sticky error ends the run (an OOM is rolled back and goes on)
        if self.s.ctx.step == 3:
            raise CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "cuGraphLaunch")
        return real_step(self, p)
    monkeypatch.setattr(S, "step", sticky_at_3)
    real_destroy = SimDriver.stream_destroy
    monkeypatch.setattr(SimDriver, "stream_destroy", lambda self, s: (_ for _ in ()).throw(_injected("stream_destroy")))
    assert main(["run", "--backend", "sim", "--prompt-tokens", "4", "--steps", "6"]) == 2
    err = capsys.readouterr().err
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in err and "INVALID_HANDLE" not in err, err
    monkeypatch.setattr(SimDriver, "stream_destroy", real_destroy)


def test_a_release_that_fails_after_a_complete_run_is_reported(capsys, monkeypatch):
    monkeypatch.setattr(SimDriver, "event_destroy", lambda self, e: (_ for _ in ()).throw(_injected("event_destroy")))
    assert main(["run", "--backend", "sim", "--prompt-tokens", "4", "--steps", "2"]) == 2
    assert "event_destroy: CUDA_ERROR_INVALID_HANDLE" in capsys.readouterr().err

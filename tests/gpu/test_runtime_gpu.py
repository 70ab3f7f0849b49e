"""The whole decode workload on the GPU: eager, captured and replayed steps against the numpy oracle, and the
real driver's decisions (update, refusal -> re-instantiate, a really synchronising MUL_MAT_ID, pool
invalidation)."""

from types import SimpleNamespace

import pytest

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.runner import run

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]


def run_gpu(timeline=(), env=None, **settings):
    settings.setdefault("backend", "cuda")
    settings.setdefault("prompt_tokens", 8)
    cfg = resolve(settings, environ=env or {})
    r = run(cfg, SimpleNamespace(name="gpu-test", timeline=list(timeline)))
    assert r.header["backend"] == "cuda" and not r.header["simulated"]
    return r


def of(r, *kinds):
    return [e for e in r.events if isinstance(e, kinds)]


def phases(r, split=0):
    return {e.step: e.phase for e in of(r, E.PhaseDecided) if e.split == split}


def assert_oracle(r):
    checks = of(r, E.OracleCheck)
    assert checks and all(c.ok for c in checks), [(c.step, c.rel_err) for c in checks if not c.ok]
    return max(c.rel_err for c in checks)


@pytest.mark.parametrize("model,wtype,batch,n_cpu_moe", [
    ("tiny", "f16", 1, 0), ("tiny", "q8_0", 4, 0), ("moe-tiny", "q8_0", 1, 0), ("moe-tiny", "f16", 4, 0),
    ("moe-tiny", "q8_0", 1, 2), ("1b", "f16", 1, 0), ("1b", "q8_0", 4, 0),
])
def test_decode_matches_oracle_eager_capture_replay(model, wtype, batch, n_cpu_moe):
    r = run_gpu(model=model, wtype=wtype, batch=batch, n_cpu_moe=n_cpu_moe, steps=6, oracle=True, verify=True)
    assert_oracle(r)
    modes = {e.mode for e in of(r, E.StepFinished)}
    assert {"eager", "capture", "replay"} <= modes
    assert all(v.ok for v in of(r, E.VerifyResult))


def test_n_kv_boundary_on_gpu_updates_and_matches_oracle():
    r = run_gpu(prompt_tokens=250, steps=12, oracle=True)
    assert_oracle(r)
    step = [c.step for c in of(r, E.ContextDecision) if "n_kv" in c.reason][0]
    upd = [e for e in of(r, E.ChunkUpdated, E.UpdateRefused) if e.step == step + 1]
    assert upd and all(isinstance(e, E.ChunkUpdated) for e in upd)


def test_real_driver_refuses_topology_change_and_reinstantiates():
    r = run_gpu(batch=8, prompt_tokens=2, steps=8, oracle=True, timeline=[{"at_step": 12, "batch": 9}])
    assert_oracle(r)
    refused = of(r, E.UpdateRefused)
    assert refused and refused[0].reason == "TOPOLOGY_CHANGED"
    assert any(e.after_refusal for e in of(r, E.ChunkInstantiated))


def test_moe_f16_prefill_really_synchronises_and_is_ineligible():
    r = run_gpu(model="moe-tiny", wtype="f16", prompt_tokens=600, steps=3, oracle=True, ubatch_size=600)   # > MMF's 512 columns, one ubatch
    assert_oracle(r)                      # the sorted fallback computes the right thing
    inc = of(r, E.Incompatible)
    assert inc and inc[0].op == "MUL_MAT_ID"
    assert phases(r)[3] == "replay"


def test_capped_pool_invalidates_and_rewarms_on_gpu():
    # the design article's rule (a pool flush invalidates the graphs): upstream's default invalidates none
    r = run_gpu(prompt_tokens=4, steps=10, pool_cap=280_000, oracle=True, timeline=[{"at_step": 5, "prefill": 32}],
                pool_invalidation=True)
    assert_oracle(r)
    inv = of(r, E.PoolInvalidated)
    assert inv and inv[0].reason == "alloc failure"
    p = phases(r)
    assert p[7] == "capture" and p[8] == "replay"


def test_concurrent_streams_and_small_chunks_on_gpu():
    """Regions on their streams inside chunks of 8 nodes. tiny's regions race as llama.cpp's do (ggml-alloc
    puts Q's rope over the fork's output while the other streams' mat-muls may still read it; the validity
    check passes them): the race is named, and the logits are not checked (they come out wrong on the H200,
    as llama.cpp's tokens do with GGML_CUDA_GRAPH_OPT=1)."""
    r = run_gpu(steps=5, chunk_size=8, concurrent_streams=True)
    assert of(r, E.ConcurrentRegion) and max(e.n_chunks for e in of(r, E.CaptureRun)) > 4
    assert {(e.writer, e.other) for e in of(r, E.ConcurrentRace)} >= {("Qcur-0", "attn_norm-0")}   # Q's rope (named as its mat-mul)


def test_failure_mid_capture_on_the_gpu_ends_the_capture_and_recovers(monkeypatch):
    from graphdiag.backends.drivers.cuda import CudaDriver
    from graphdiag.counters import Counters
    from graphdiag.errors import CudaError
    from graphdiag.plan import StepPlan
    from graphdiag.runner import RunResult, Session, Stepper
    real_launch = CudaDriver.launch
    fail = {"on": True}

    def failing_launch(self, stream, launch):
        if fail["on"] and self.is_capturing(stream):
            raise CudaError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "injected")
        return real_launch(self, stream, launch)

    monkeypatch.setattr(CudaDriver, "launch", failing_launch)
    bus, seen = E.EventBus(), []
    bus.subscribe(seen.append)
    s = Session(resolve({"backend": "cuda", "steps": 0, "prompt_tokens": 4, "oracle": True}, environ={}), bus)
    try:
        st = Stepper(s, RunResult({}, [], Counters()))
        st.step(StepPlan("decode", batch=1))
        pos = s.ctx.kv.next_pos(0)
        with pytest.raises(CudaError, match="injected"):
            st.step(StepPlan("decode", batch=1))
        assert not s.driver.is_capturing(s.gpu.stream0)
        assert s.ctx.kv.next_pos(0) == pos                  # the failed step's KV cell was removed
        fail["on"] = False
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        checks = [e for e in seen if isinstance(e, E.OracleCheck)]
        assert [c.step for c in checks] == [0, 2, 3, 4]       # step 1 failed; every other step checked
        assert all(c.ok for c in checks), [(c.step, c.rel_err) for c in checks]
        assert [e.phase for e in seen if isinstance(e, E.PhaseDecided) and e.step > 1] == ["capture", "replay", "replay"]
    finally:
        s.close()


def test_batch_1_to_2_on_the_gpu_is_refused_and_reinstantiated():
    """1 -> 2 tokens drops the one-column fusions: the real driver refuses the update (TOPOLOGY_CHANGED)."""
    r = run_gpu(steps=10, oracle=True, timeline=[{"at_step": 5, "batch": 2}])
    assert_oracle(r)
    outcome = [e for e in of(r, E.ChunkUpdated, E.UpdateRefused, E.ChunkInstantiated) if e.step == 6]
    assert [type(e) for e in outcome] == [E.UpdateRefused, E.ChunkInstantiated]
    assert outcome[0].reason == "TOPOLOGY_CHANGED" and outcome[1].after_refusal


@pytest.mark.parametrize("kind,step", [("launch", 6), ("capture", 2), ("instantiate", 2)])
def test_an_injected_fault_on_the_gpu_fails_at_the_driver_call_and_recovers(kind, step):
    """The fault fails the real driver call's boundary (cuGraphLaunch / cuStreamEndCapture after a real
    end of capture / cuGraphInstantiate): the step is rolled back and later steps match the oracle and
    generate the tokens of the run without the fault."""
    clean = run_gpu(steps=10, oracle=True)
    r = run_gpu(steps=10, oracle=True, verify=True, timeline=[{"at_step": step, "fault": kind}])
    (f,) = of(r, E.StepFailed)
    assert f.step == step and f.fault == kind and f.recoverable
    assert assert_oracle(r) < 1e-3 and all(v.ok for v in of(r, E.VerifyResult))
    assert sum(r.tokens, []) == sum(clean.tokens, [])[: len(sum(r.tokens, []))]


def test_programmatic_dependent_launch_changes_timing_only(monkeypatch):
    """GGML_CUDA_PDL (on by default on 9.0+): kernels go through cuLaunchKernelEx with the programmatic
    stream serialisation attribute, and the run's tokens, logits checks and decisions are those of plain
    launches (every kernel waits for its predecessors before reading)."""
    from graphdiag.backends.drivers.cuda import CudaDriver
    from support.decisions import decision_stream
    ex = []
    real = CudaDriver.launch
    monkeypatch.setattr(CudaDriver, "launch", lambda self, s, l: ex.append(l.handle.pdl) or real(self, s, l))
    on = run_gpu(steps=8, oracle=True, verify=True)
    n_on, ex[:] = list(ex), []
    off = run_gpu(steps=8, oracle=True, verify=True, env={"GGML_CUDA_PDL": "0"})
    # on: PDL exactly where upstream launches through ggml_cuda_kernel_launch (gpu/pdl.py: the mat-vecs, norms,
    # ropes, ...; its MMF / MMQ / cuBLAS mat-muls and soft_max plainly); off: none
    assert any(n_on) and ex and not any(ex)
    assert on.header["settings"]["pdl"] is True and off.header["settings"]["pdl"] is False
    assert on.tokens == off.tokens and decision_stream(on.events) == decision_stream(off.events)
    assert_oracle(on)
    assert all(v.ok for v in of(on, E.VerifyResult))
    rep = lambda r: sorted(e.gpu_ns for e in of(r, E.StepFinished) if e.mode == "replay")
    print(f"tiny replay GPU µs, PDL on {rep(on)[len(rep(on)) // 2] / 1e3:.1f} vs off {rep(off)[len(rep(off)) // 2] / 1e3:.1f}")

"""Issue 10 point 5: a short soak in CI (the benchmark: `python tests/support/soak.py`, 10 000 decode steps):
graph entries, live executables and device bytes stay flat over the decode steps, and the process does not grow."""

from support.soak import soak


def test_short_soak_keeps_entries_executables_and_memory_flat():
    samples = soak(90, sample_every=30)
    assert len(samples) == 3
    first, *rest = samples
    for s in rest:
        assert (s.entries, s.executables, s.device_bytes) == (first.entries, first.executables, first.device_bytes)
        assert s.rss_bytes - first.rss_bytes < 16 << 20
    assert first.entries == 1 and first.executables >= 1


def test_a_soak_with_faults_recovers_every_one_and_stays_flat_and_correct():
    """Issue 25: a pair of faults every 25 decode steps (a replay's launch, then the re-capture's capture,
    instantiate or launch): every one fires, every failed step is rolled back, the oracle holds on every
    finished step, and entries, executables and device bytes are the same at every sample."""
    from graphdiag import events as E
    seen: list = []
    samples = soak(100, sample_every=25, fault_every=25, oracle=True, seen=seen)
    fired = [e for e in seen if isinstance(e, E.FaultInjected)]
    failed = [e for e in seen if isinstance(e, E.StepFailed)]
    assert len(fired) == 8 and {e.fault for e in fired} == {"launch", "capture", "instantiate"}
    assert len(failed) == 8 and all(f.recoverable for f in failed)
    assert not any(isinstance(e, E.FaultMissed) for e in seen)
    checks = [e for e in seen if isinstance(e, E.OracleCheck)]
    assert len(checks) == 100 + 1 - 8 and all(c.ok for c in checks), max(c.rel_err for c in checks)
    first, *rest = samples
    assert first.executables >= 1
    for s in rest:
        assert (s.entries, s.executables, s.device_bytes) == (first.entries, first.executables, first.device_bytes)

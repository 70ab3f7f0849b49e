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

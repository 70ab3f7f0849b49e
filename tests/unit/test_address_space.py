"""memory.AddressSpace: the host's increasing addresses, and the simulated device's reuse of freed ranges
as cuMemAlloc (the decision that matters: a reallocated buffer keeps its address or moves)."""

from __future__ import annotations

import pytest

from graphdiag.backends.drivers.sim import DEVICE_GRANULE, SimDriver
from graphdiag.memory import ALIGN, AddressSpace

MIB = 1 << 20


def test_a_larger_buffer_after_a_free_comes_back_at_the_freed_base_as_cumemalloc_on_the_h200():
    """Measured on the H200 (driver 580): cuMemAlloc(500 KiB), cuMemFree, cuMemAlloc(545 KiB) -> the same base."""
    d = SimDriver(compute=False)
    a = d.mem_alloc(500 << 10)
    d.mem_free(a)
    assert d.mem_alloc(545 << 10) == a


def test_granules_are_reused_lowest_first_and_coalesced():
    s = AddressSpace(base=1 << 40, granule=2 * MIB, materialised=False)
    a, b, c = s.alloc(MIB), s.alloc(3 * MIB), s.alloc(MIB)
    assert (b - a, c - b) == (2 * MIB, 4 * MIB)          # each takes whole granules (bytes and the gap)
    s.free(b)
    assert s.alloc(MIB) == b                             # the lowest hole that fits
    assert s.alloc(MIB) == b + 2 * MIB                   # the rest of it
    s.free(a), s.free(b), s.free(b + 2 * MIB)
    assert s.alloc(6 * MIB - ALIGN) == a                 # three freed neighbours make one hole
    assert s.alloc(10 * MIB) > c                         # nothing fits: new addresses


def test_a_buffer_that_outgrows_its_granules_moves():
    s = AddressSpace(base=1 << 40, granule=2 * MIB, materialised=False)
    a = s.alloc(MIB)
    s.alloc(MIB)                                         # a neighbour right behind it
    s.free(a)
    assert s.alloc(3 * MIB) != a


def test_the_host_never_hands_an_address_out_twice():
    s = AddressSpace(base=1 << 40)
    a = s.alloc(100)
    s.free(a)
    b = s.alloc(100)
    assert b > a and b - a >= ALIGN


def test_live_allocations_never_overlap_under_churn():
    import random
    rng = random.Random(3)
    s = AddressSpace(base=1 << 40, granule=DEVICE_GRANULE, materialised=False)
    live: dict[int, int] = {}
    for _ in range(400):
        if live and rng.random() < 0.45:
            a = rng.choice(sorted(live))
            s.free(a)
            del live[a]
        else:
            n = rng.choice([1, 300, 70_000, MIB, 5 * MIB])
            live[s.alloc(n)] = n
        spans = sorted((a, a + n + ALIGN) for a, n in live.items())
        assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))


def test_freeing_an_unknown_address_is_an_error():
    s = AddressSpace(base=1 << 40, granule=2 * MIB)
    with pytest.raises(ValueError, match="unknown address"):
        s.free(1 << 40)

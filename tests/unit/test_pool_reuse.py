"""TempPool.reuse(size) is alloc(size) and free() of what it returns in one call where a cached buffer fits,
and touches nothing where alloc would go to the device: checked against the two calls on random histories
of allocations, frees and staged scratch buffers, with caps and cache limits that make the pool flush."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from graphdiag.backends.gpu.pool import TempPool
from graphdiag.errors import OutOfDeviceMemory


class _Device:
    """Device memory as a counter of addresses; records every allocation and free."""

    def __init__(self):
        self.next, self.calls = 0x1000, []

    def mem_alloc(self, size):
        self.next += 0x100000
        self.calls.append(("alloc", self.next, size))
        return self.next

    def mem_free(self, addr):
        self.calls.append(("free", addr))

    def synchronize(self):
        self.calls.append(("synchronize",))


def _pool(cap, max_buffers):
    dev, said = _Device(), []
    pool = TempPool(dev, lambda reason, n: said.append(("invalidate", reason, n)), cap, max_buffers)
    pool.before_flush = lambda: said.append(("flush",))
    return pool, dev, said


def _state(pool, dev, said):
    return list(pool.cached), pool.pool_size, pool.n_device_allocs, list(dev.calls), list(said)


ops = st.lists(st.tuples(st.sampled_from(["alloc", "free", "stage"]), st.integers(1, 9000)), max_size=40)


@settings(max_examples=400, deadline=None)
@given(ops, st.sampled_from([None, 20000, 60000]), st.sampled_from([0, 1, 2, 4, 256]))
def test_reuse_leaves_the_pool_as_alloc_then_free_does(history, cap, max_buffers):
    two, one = _pool(cap, max_buffers), _pool(cap, max_buffers)
    held_two, held_one = [], []
    for what, size in history:
        if what == "free":
            if held_two:
                two[0].free(*held_two.pop())
                one[0].free(*held_one.pop())
            continue
        try:
            got_two = two[0].alloc(size)
        except OutOfDeviceMemory:
            got_two = None
        if what == "alloc" or got_two is None:
            try:
                got_one = one[0].alloc(size)
            except OutOfDeviceMemory:
                got_one = None
            assert got_one == got_two
            if got_two is not None:
                held_two.append(got_two)
                held_one.append(got_one)
            continue
        two[0].free(*got_two)                        # stage: alloc, then free at once
        addr = one[0].reuse(size)
        if addr is None:                             # reuse would go to the device: the caller's two calls
            got_one = one[0].alloc(size)
            one[0].free(*got_one)
            addr = got_one[0]
        assert addr == got_two[0]
        assert _state(*one) == _state(*two)
    assert _state(*one) == _state(*two)


def test_reuse_takes_the_smallest_fitting_buffer_and_nothing_where_none_fits():
    pool, dev, said = _pool(None, 8)
    a, b, c = pool.alloc(4000), pool.alloc(1000), pool.alloc(2000)
    for got in (a, b, c):
        pool.free(*got)
    assert pool.reuse(1500) == c[0]                  # best fit: 2000 over 4000
    assert pool.cached[-1] == c                      # handed back: at the end, as free() puts it
    assert pool.reuse(5000) is None                  # alloc would go to the device: nothing touched
    assert pool.cached == [a, b, c] and len(dev.calls) == 3

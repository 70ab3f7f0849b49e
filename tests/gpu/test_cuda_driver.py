"""CudaDriver on a real GPU: capture/replay equals eager, exec-update accepted and refused (with the
driver's reason), capture invalidation, OOM mapping, events, prepared launches."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.drivers.base import Launch, UpdateResult
from graphdiag.backends.geometry import launch_geometry
from graphdiag.errors import CaptureError, OutOfDeviceMemory
from graphdiag.ir.dtypes import GGMLType as G

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(7)


def _put(driver, a: np.ndarray) -> int:
    addr = driver.mem_alloc(a.nbytes)
    driver.memcpy_htod(addr, np.ascontiguousarray(a))
    return addr


def _get(driver, addr: int, n: int) -> np.ndarray:
    out = np.empty(n, np.float32)
    driver.memcpy_dtoh(out, addr)
    return out


def _launch(driver, name, slots, fp=()) -> Launch:
    """A prepared launch over 1-D F32 vectors: slots = [(addr, n), ...]."""
    p = new_params()
    for i, (addr, n) in enumerate(slots):
        set_desc(p, i, addr, G.F32, (n, 1, 1, 1), (4, 4 * n, 4 * n, 4 * n))
    p["fp"][: len(fp)] = fp
    grid, block, shmem = launch_geometry(name, p)
    return driver.prepare(Launch(name, grid, block, p, shmem))


class Chain:
    """y = rms_norm(x) * w + x on n floats: three kernels, buffers allocated once."""

    def __init__(self, driver, n: int):
        self.drv, self.n = driver, n
        self.x = RNG.standard_normal(n).astype(np.float32)
        self.w = RNG.standard_normal(n).astype(np.float32)
        self.bx, self.bw = _put(driver, self.x), _put(driver, self.w)
        self.bt, self.by = driver.mem_alloc(4 * n), driver.mem_alloc(4 * n)
        self.launches = [
            _launch(driver, "rms_norm_f32", [(self.bt, n), (self.bx, n)], fp=(1e-5,)),
            _launch(driver, "mul_f32", [(self.bt, n), (self.bt, n), (self.bw, n)]),
            _launch(driver, "add_f32", [(self.by, n), (self.bt, n), (self.bx, n)]),
        ]

    def record(self, stream, extra: int = 0):
        for launch in self.launches + self.launches[-1:] * extra:
            self.drv.launch(stream, launch)

    def expected(self) -> np.ndarray:
        x = self.x.astype(np.float64)
        return (x / np.sqrt(np.mean(x * x) + 1e-5) * self.w + x).astype(np.float32)

    def result(self) -> np.ndarray:
        return _get(self.drv, self.by, self.n)

    def free(self):
        for b in (self.bx, self.bw, self.bt, self.by):
            self.drv.mem_free(b)


def _capture(driver, stream, record) -> object:
    driver.begin_capture(stream)
    try:
        record(stream)
    finally:
        graph = driver.end_capture(stream)
    return graph


def _replayed(driver, stream, chain: Chain, record) -> np.ndarray:
    """The chain's output poisoned, then computed by a graph captured from `record` (its three kernels) and
    replayed once; the graph and its executable destroyed."""
    driver.memcpy_htod(chain.by, np.full(chain.n, np.nan, np.float32))
    graph = _capture(driver, stream, record)
    assert driver.graph_num_nodes(graph) == 3
    exec_ = driver.instantiate(graph)
    driver.graph_launch(exec_, stream)
    driver.stream_synchronize(stream)
    out = chain.result()
    driver.exec_destroy(exec_)
    driver.graph_destroy(graph)
    return out


def test_device_info(driver):
    info = driver.info
    assert info.name and info.total_memory > 0 and not info.simulated
    assert info.compute_capability >= (7, 0)


def test_captured_graph_replays_what_eager_computes(driver, stream):
    c = Chain(driver, 3000)
    c.record(stream)
    driver.stream_synchronize(stream)
    eager = c.result()
    np.testing.assert_allclose(eager, c.expected(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(_replayed(driver, stream, c, c.record), eager)
    c.free()


def test_exec_update_accepts_new_params_and_grid_with_the_same_topology(driver, stream):
    a, b = Chain(driver, 1000), Chain(driver, 70000)   # other pointers, other sizes -> other grids
    assert a.launches[2].grid != b.launches[2].grid
    ga = _capture(driver, stream, a.record)
    exec_ = driver.instantiate(ga)
    gb = _capture(driver, stream, b.record)
    outcome = driver.exec_update(exec_, gb)
    assert outcome.ok and outcome.result == UpdateResult.SUCCESS
    driver.graph_launch(exec_, stream)
    driver.stream_synchronize(stream)
    np.testing.assert_allclose(b.result(), b.expected(), rtol=1e-5, atol=1e-5)
    for g in (ga, gb):
        driver.graph_destroy(g)
    driver.exec_destroy(exec_)
    a.free()
    b.free()


def test_exec_update_refuses_an_added_kernel_with_topology_changed(driver, stream):
    c = Chain(driver, 512)
    g1 = _capture(driver, stream, c.record)
    exec_ = driver.instantiate(g1)
    g2 = _capture(driver, stream, lambda s: c.record(s, extra=1))
    assert driver.graph_num_nodes(g2) == 4
    outcome = driver.exec_update(exec_, g2)
    assert not outcome.ok
    assert outcome.result == UpdateResult.TOPOLOGY_CHANGED   # the reason, read through ctypes
    # the exec is left as it was, and the context stays usable
    driver.memcpy_htod(c.by, np.zeros(c.n, np.float32))
    driver.graph_launch(exec_, stream)
    driver.synchronize()
    np.testing.assert_allclose(c.result(), c.expected(), rtol=1e-5, atol=1e-5)
    exec2 = driver.instantiate(g2)
    driver.graph_launch(exec2, stream)
    driver.synchronize()
    for e in (exec_, exec2):
        driver.exec_destroy(e)
    for g in (g1, g2):
        driver.graph_destroy(g)
    c.free()


def test_exec_update_refuses_changed_dependencies_and_describes_the_node(driver, stream):
    """Same three kernels, but the third forked onto a second stream (fork/join through events): the node
    count is equal, the edges are not."""
    c = Chain(driver, 256)
    g1 = _capture(driver, stream, c.record)
    exec_ = driver.instantiate(g1)
    side = driver.stream_create()
    fork, join = driver.event_create(), driver.event_create()

    def forked(s):
        driver.launch(s, c.launches[0])
        driver.event_record(fork, s)
        driver.stream_wait_event(side, fork)
        driver.launch(side, c.launches[1])
        driver.launch(s, c.launches[2])
        driver.event_record(join, side)
        driver.stream_wait_event(s, join)

    g2 = _capture(driver, stream, forked)
    assert driver.graph_num_nodes(g2) == 3
    outcome = driver.exec_update(exec_, g2)
    assert not outcome.ok and outcome.result == UpdateResult.TOPOLOGY_CHANGED
    if outcome.error_node is not None:   # CUDA names a node when a dependency, not the count, differs
        assert "kernel" in outcome.error_node
    print("refusal:", outcome)
    driver.exec_destroy(exec_)
    for g in (g1, g2):
        driver.graph_destroy(g)
    for e in (fork, join):
        driver.event_destroy(e)
    driver.stream_destroy(side)
    c.free()


def test_synchronising_a_capturing_stream_raises_capture_error(driver, stream):
    c = Chain(driver, 128)
    driver.begin_capture(stream)
    c.record(stream)
    assert driver.is_capturing(stream)
    with pytest.raises(CaptureError):
        driver.stream_synchronize(stream)
    with pytest.raises(CaptureError):
        driver.end_capture(stream)   # the invalidated capture still has to be ended
    assert not driver.is_capturing(stream)
    c.record(stream)                 # the stream works again
    driver.stream_synchronize(stream)
    np.testing.assert_allclose(c.result(), c.expected(), rtol=1e-5, atol=1e-5)
    c.free()


def test_out_of_memory_maps_to_out_of_device_memory(driver):
    with pytest.raises(OutOfDeviceMemory) as exc:
        driver.mem_alloc(1 << 50)   # 1 PiB
    assert exc.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    addr = driver.mem_alloc(1 << 20)   # the allocator still works
    driver.mem_free(addr)


def test_timing_events_measure_elapsed_time(driver, stream):
    c = Chain(driver, 1 << 16)
    start, end = driver.event_create(timing=True), driver.event_create(timing=True)
    driver.event_record(start, stream)
    c.record(stream)
    driver.event_record(end, stream)
    ms = driver.event_elapsed_ms(start, end)
    assert 0.0 <= ms < 1000.0
    for e in (start, end):
        driver.event_destroy(e)
    c.free()


def test_prepare_snapshots_params_until_prepared_again(driver, stream):
    a = _put(driver, np.full(64, 1.0, np.float32))
    b = _put(driver, np.full(64, 2.0, np.float32))
    d = driver.mem_alloc(256)
    launch = _launch(driver, "add_f32", [(d, 64), (a, 64), (a, 64)])
    launch.params["t"][2]["data"] = b   # not seen until re-prepared
    driver.launch(stream, launch)
    driver.stream_synchronize(stream)
    assert _get(driver, d, 64)[0] == 2.0
    driver.prepare(launch)
    driver.launch(stream, launch)
    driver.stream_synchronize(stream)
    assert _get(driver, d, 64)[0] == 3.0
    for x in (a, b, d):
        driver.mem_free(x)


def test_a_second_driver_closes_cleanly_beside_the_first(driver):
    from graphdiag.backends.drivers.cuda import CudaDriver
    other = CudaDriver.open()
    s = other.stream_create()
    other.event_create()
    other.mem_alloc(4096)
    c = Chain(other, 64)
    c.record(s)
    other.close()      # releases its stream, event, memory, modules and its primary-context reference
    other.close()      # idempotent
    driver.synchronize()   # the first driver's context is untouched


def test_page_locked_buffers_and_batched_copies_land_where_they_belong(driver, stream):
    """The input path: page-locked host memory (cuMemHostAlloc), several scattered host-to-device copies
    issued as one cuMemcpyBatchAsync, read back through page-locked memory on the stream."""
    host = driver.host_alloc(4096)
    assert host.dtype == np.uint8 and host.nbytes == 4096
    dev = driver.mem_alloc(1 << 16)
    offsets, sizes = (0, 1024, 5000, 40000), (4, 1000, 256, 1024)
    srcs, start = [], 0
    for off, n in zip(offsets, sizes):
        host[start:start + n] = RNG.integers(0, 255, n, dtype=np.uint8)
        srcs.append((dev + off, host[start:start + n]))
        start += n
    batch = driver.copies_prepare(srcs)
    driver.copies_issue(batch, stream)
    driver.stream_synchronize(stream)
    assert driver.batch_copies_error is None                 # the H200 / driver 580 takes batches
    back = driver.host_alloc(1 << 16)
    driver.memcpy_dtoh(back, dev, stream)
    driver.stream_synchronize(stream)
    for (addr, src), off in zip(srcs, offsets):
        assert np.array_equal(back[off:off + src.nbytes], src)
    driver.mem_free(dev)


def test_single_and_one_by_one_copies_land_where_they_belong(driver, stream):
    """A stage's one copy, and every copy one by one where the driver refuses batches: prepared once (host
    addresses read then), issued every step, each landing at its own device address."""
    host = driver.host_alloc(4096)
    dev = driver.mem_alloc(1 << 16)
    offsets, sizes = (0, 1024, 5000), (4, 1000, 256)
    srcs, start = [], 0
    for off, n in zip(offsets, sizes):
        srcs.append((dev + off, host[start:start + n]))
        start += n
    back = driver.host_alloc(1 << 16)
    try:
        for items, refused in ((srcs[:1], None), (srcs, "refused here")):
            driver.batch_copies_error = refused
            prepared = driver.copies_prepare(items)
            for _ in range(2):                           # issued again with new bytes in the same memory
                host[:start] = RNG.integers(0, 255, start, dtype=np.uint8)
                driver.copies_issue(prepared, stream)
                driver.memcpy_dtoh(back, dev, stream)
                driver.stream_synchronize(stream)
                for (addr, src), off in zip(items, offsets):
                    assert np.array_equal(back[off:off + src.nbytes], src)
    finally:
        driver.batch_copies_error = None
        driver.mem_free(dev)


def test_launch_batch_through_the_c_loop_computes_what_launch_does_and_names_a_failing_launch(driver, stream):
    """launch_batch issues a run of launches from launch_loop.c (where the host has a C compiler, as the lent
    machine does): the same results as launching one by one, also captured into a graph, and a launch the
    driver refuses raises with cuLaunchKernelEx and the kernel named, the launches before it made."""
    from graphdiag.errors import CudaError
    assert driver.launcher == "C loop", driver.launcher
    c = Chain(driver, 5000)
    driver.launch_batch(stream, c.launches)
    driver.stream_synchronize(stream)
    np.testing.assert_allclose(c.result(), c.expected(), rtol=1e-5, atol=1e-5)
    batched = c.result()
    np.testing.assert_array_equal(_replayed(driver, stream, c, lambda s: driver.launch_batch(s, c.launches)),
                                  batched)
    bad = Launch("add_f32", (1, 1, 1), (4096, 1, 1), c.launches[2].params.copy(), 0)   # > 1024 threads
    driver.prepare(bad)
    driver.memcpy_htod(c.by, np.full(c.n, np.nan, np.float32))
    with pytest.raises(CudaError) as err:
        driver.launch_batch(stream, c.launches + [bad, c.launches[0]])
    assert err.value.call == "cuLaunchKernelEx(add_f32)" and err.value.name == "CUDA_ERROR_INVALID_VALUE"
    driver.stream_synchronize(stream)
    np.testing.assert_array_equal(c.result(), batched)          # the three before it ran
    c.free()

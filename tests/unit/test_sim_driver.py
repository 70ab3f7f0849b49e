"""SimDriver: CUDA's capture, instantiate, update and launch rules on simulated memory."""

import numpy as np
import pytest

from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.drivers.base import Launch, UpdateResult
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.errors import CaptureError, CudaError, OutOfDeviceMemory
from graphdiag.ir.dtypes import GGMLType as G

N = 8
NE, NB = (N, 1, 1, 1), (4, 4 * N, 4 * N, 4 * N)


@pytest.fixture
def drv():
    d = SimDriver(memory_bytes=1 << 20)
    yield d
    d.close()


def buf(drv, values) -> int:
    addr = drv.mem_alloc(4 * N)
    drv.memcpy_htod(addr, np.asarray(values, np.float32))
    return addr


def read(drv, addr) -> np.ndarray:
    out = np.zeros(N, np.float32)
    drv.memcpy_dtoh(out, addr)
    return out


def add_launch(drv, dst, a, b, kernel="add_f32", grid=(1, 1, 1)) -> Launch:
    p = new_params()
    for slot, addr in enumerate((dst, a, b)):
        set_desc(p, slot, addr, G.F32, NE, NB)
    return drv.prepare(Launch(kernel, grid, (32, 1, 1), p))


def capture(drv, stream, *launches):
    drv.begin_capture(stream)
    for la in launches:
        drv.launch(stream, la)
    return drv.end_capture(stream)


@pytest.fixture
def abc(drv):
    """Buffers a = 1, b = 2, c = 0 and a stream."""
    return buf(drv, np.ones(N)), buf(drv, np.full(N, 2)), buf(drv, np.zeros(N)), drv.stream_create()


def test_info_and_cc(drv):
    assert drv.simulated and "simulated" in drv.info.name and drv.cc == 900
    assert SimDriver(compute_capability=(6, 1)).cc == 610


def test_eager_launch_runs_at_once(drv, abc):
    a, b, c, s = abc
    drv.launch(s, add_launch(drv, c, a, b))
    np.testing.assert_array_equal(read(drv, c), 3)


def test_capture_records_and_does_not_execute_then_launch_executes(drv, abc):
    a, b, c, s = abc
    g = capture(drv, s, add_launch(drv, c, a, b), add_launch(drv, c, c, b))
    assert drv.graph_num_nodes(g) == 2 and g.edges == [(0, 1)]
    assert drv.counters.kernels_run == 0 and drv.counters.captured_launches == 2
    np.testing.assert_array_equal(read(drv, c), 0)
    x = drv.instantiate(g)
    drv.graph_destroy(g)
    drv.graph_launch(x, s)
    np.testing.assert_array_equal(read(drv, c), 5)
    assert drv.counters.graph_launches == 1 and drv.counters.instantiates == 1


def test_captured_params_are_a_copy(drv, abc):
    a, b, c, s = abc
    la = add_launch(drv, c, a, b)
    g = capture(drv, s, la)
    la.params["t"][2]["data"] = a  # changed after capture: the graph keeps what it saw
    drv.graph_launch(drv.instantiate(g), s)
    np.testing.assert_array_equal(read(drv, c), 3)


def test_update_succeeds_with_new_params_grid_and_kernel(drv, abc):
    a, b, c, s = abc
    x = drv.instantiate(capture(drv, s, add_launch(drv, c, a, b)))
    g2 = capture(drv, s, add_launch(drv, c, b, b, kernel="mul_f32", grid=(4, 1, 1)))
    out = drv.exec_update(x, g2)
    assert out.ok and drv.counters.updates == 1
    assert x.nodes[0].name == "mul_f32" and x.nodes[0].grid == (4, 1, 1)
    drv.graph_launch(x, s)
    np.testing.assert_array_equal(read(drv, c), 4)


def test_update_refused_when_a_node_is_added(drv, abc):
    a, b, c, s = abc
    x = drv.instantiate(capture(drv, s, add_launch(drv, c, a, b)))
    out = drv.exec_update(x, capture(drv, s, add_launch(drv, c, a, b), add_launch(drv, c, c, b)))
    assert not out.ok and out.result == UpdateResult.TOPOLOGY_CHANGED
    assert out.error_node is None          # CUDA names no node when the node count differs
    drv.graph_launch(x, s)  # the executable is left as it was
    np.testing.assert_array_equal(read(drv, c), 3)
    assert drv.counters.update_refusals == 1 and drv.counters.updates == 0


def test_update_refused_when_a_kernel_node_becomes_a_memcpy(drv, abc):
    a, b, c, s = abc
    x = drv.instantiate(capture(drv, s, add_launch(drv, c, a, b)))
    drv.begin_capture(s)
    drv.memcpy_dtod(c, a, 4 * N, s)
    out = drv.exec_update(x, drv.end_capture(s))
    assert not out.ok and out.result == UpdateResult.NODE_TYPE_CHANGED
    assert out.error_node.startswith("node 0 of 1: memcpy")


def test_update_refused_when_dependencies_differ(drv, abc):
    a, b, c, s = abc
    s1, fork, join = drv.stream_create(), drv.event_create(), drv.event_create()
    x = drv.instantiate(capture(drv, s, add_launch(drv, c, a, b), add_launch(drv, c, a, b)))
    drv.begin_capture(s)
    drv.launch(s, add_launch(drv, c, a, b))
    drv.event_record(fork, s)
    drv.stream_wait_event(s1, fork)
    drv.launch(s1, add_launch(drv, c, a, b))
    drv.event_record(join, s1)
    drv.stream_wait_event(s, join)
    g = drv.end_capture(s)
    assert g.edges == [(0, 1)]  # same count and types as x, but node 1 hangs off s1 — still the same edges
    assert drv.exec_update(x, g).ok
    drv.begin_capture(s)
    drv.event_record(fork, s)
    drv.stream_wait_event(s1, fork)
    drv.launch(s, add_launch(drv, c, a, b))
    drv.launch(s1, add_launch(drv, c, a, b))
    drv.event_record(join, s1)
    drv.stream_wait_event(s, join)
    out = drv.exec_update(x, drv.end_capture(s))  # two independent nodes: node 1 lost its edge
    assert out.result == UpdateResult.TOPOLOGY_CHANGED        # two exit nodes where there was one: named one
    assert out.error_node.startswith("node 1 of 2: kernel add_f32; 2 exit nodes")


def test_fork_join_with_its_branches_joined_in_the_other_order_updates(drv, abc):
    """Edges have no order in CUDA: the same fork/join captured joining s2 before s1 updates."""
    a, b, c, s0 = abc
    s1, s2 = drv.stream_create(), drv.stream_create()
    fork, j1, j2 = drv.event_create(), drv.event_create(), drv.event_create()

    def fork_join(order):
        drv.begin_capture(s0)
        drv.launch(s0, add_launch(drv, c, a, b))
        drv.event_record(fork, s0)
        for s in (s1, s2):
            drv.stream_wait_event(s, fork)
            drv.launch(s, add_launch(drv, c, a, b))
        drv.event_record(j1, s1)
        drv.event_record(j2, s2)
        for e in order:
            drv.stream_wait_event(s0, e)
        drv.launch(s0, add_launch(drv, c, a, b))
        return drv.end_capture(s0)

    x = drv.instantiate(fork_join((j1, j2)))
    g = fork_join((j2, j1))
    assert g.nodes[3].deps == (0, 2, 1)     # s0 kept its own position, then the waits in order
    assert drv.exec_update(x, g).ok


def test_fork_join_on_two_streams_yields_the_right_edges(drv, abc):
    a, b, c, s0 = abc
    s1, fork, join = drv.stream_create(), drv.event_create(), drv.event_create()
    d = buf(drv, np.zeros(N))
    drv.begin_capture(s0)
    drv.launch(s0, add_launch(drv, c, a, b))       # 0: c = 3
    drv.event_record(fork, s0)
    drv.stream_wait_event(s1, fork)                 # s1 joins the capture
    assert drv.is_capturing(s1)
    drv.launch(s1, add_launch(drv, d, c, c))        # 1: d = 6 (after 0)
    drv.launch(s0, add_launch(drv, c, c, a))        # 2: c = 4 (after 0)
    drv.event_record(join, s1)
    drv.stream_wait_event(s0, join)
    drv.launch(s0, add_launch(drv, a, c, d))        # 3: a = c + d (after 2 and 1)
    g = drv.end_capture(s0)
    assert g.edges == [(0, 1), (0, 2), (2, 3), (1, 3)]
    assert not drv.is_capturing(s0) and not drv.is_capturing(s1)
    drv.graph_launch(drv.instantiate(g), s0)
    np.testing.assert_array_equal(read(drv, d), 6)
    np.testing.assert_array_equal(read(drv, a), 10)


def test_unjoined_fork_fails_at_end_capture(drv, abc):
    a, b, c, s0 = abc
    s1, fork = drv.stream_create(), drv.event_create()
    drv.begin_capture(s0)
    drv.event_record(fork, s0)
    drv.stream_wait_event(s1, fork)
    drv.launch(s1, add_launch(drv, c, a, b))
    with pytest.raises(CaptureError, match="CUDA_ERROR_STREAM_CAPTURE_UNJOINED"):
        drv.end_capture(s0)
    assert not drv.is_capturing(s1)


def test_work_after_the_join_point_is_unjoined(drv, abc):
    a, b, c, s = abc
    s1, fork, join = drv.stream_create(), drv.event_create(), drv.event_create()
    drv.begin_capture(s)
    drv.launch(s, add_launch(drv, c, a, b))
    drv.event_record(fork, s)
    drv.stream_wait_event(s1, fork)
    drv.event_record(join, s1)
    drv.stream_wait_event(s, join)
    drv.launch(s1, add_launch(drv, c, a, b))
    with pytest.raises(CaptureError, match="UNJOINED"):
        drv.end_capture(s)


def test_synchronising_a_capturing_stream_invalidates_the_capture(drv, abc):
    a, b, c, s = abc
    drv.begin_capture(s)
    drv.launch(s, add_launch(drv, c, a, b))
    with pytest.raises(CaptureError, match="CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"):
        drv.stream_synchronize(s)
    assert drv.is_capturing(s)    # as CUDA: still in capture mode (invalidated) until EndCapture
    with pytest.raises(CaptureError, match="CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"):
        drv.launch(s, add_launch(drv, c, a, b))
    with pytest.raises(CaptureError, match="CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"):
        drv.end_capture(s)
    assert not drv.is_capturing(s)
    drv.stream_synchronize(s)  # out of capture again: legal
    np.testing.assert_array_equal(read(drv, c), 0)


@pytest.mark.parametrize("illegal", ["dtoh on the stream", "synchronous htod"])
def test_host_copies_during_capture_invalidate_it(drv, abc, illegal):
    a, b, c, s = abc
    drv.begin_capture(s)
    with pytest.raises(CaptureError, match="UNSUPPORTED"):
        if illegal == "dtoh on the stream":
            drv.memcpy_dtoh(np.zeros(N, np.float32), a, s)
        else:
            drv.memcpy_htod(a, np.zeros(N, np.float32))
    with pytest.raises(CaptureError, match="INVALIDATED"):
        drv.end_capture(s)


def test_captured_htod_reads_the_host_array_at_each_replay(drv, abc):
    a, b, c, s = abc
    host = np.full(N, 7, np.float32)
    drv.begin_capture(s)
    drv.memcpy_htod(c, host, s)
    x = drv.instantiate(drv.end_capture(s))
    np.testing.assert_array_equal(read(drv, c), 0)
    drv.graph_launch(x, s)
    np.testing.assert_array_equal(read(drv, c), 7)
    host[:] = 9
    drv.graph_launch(x, s)
    np.testing.assert_array_equal(read(drv, c), 9)


def test_destroyed_handles_are_refused(drv, abc):
    a, b, c, s = abc
    g = capture(drv, s, add_launch(drv, c, a, b))
    x = drv.instantiate(g)
    drv.graph_destroy(g)
    drv.exec_destroy(x)
    for call in (lambda: drv.graph_launch(x, s), lambda: drv.instantiate(g), lambda: drv.graph_num_nodes(g),
                 lambda: drv.exec_destroy(x)):
        with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
            call()
    drv.stream_destroy(s)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        drv.launch(s, add_launch(drv, c, a, b))


def test_unknown_or_unprepared_kernels(drv, abc):
    a, b, c, s = abc
    with pytest.raises(CudaError, match="CUDA_ERROR_NOT_FOUND.*no_such_kernel"):
        drv.prepare(Launch("no_such_kernel", (1, 1, 1), (1, 1, 1), new_params()))
    with pytest.raises(CudaError, match="not prepared"):
        drv.launch(s, Launch("add_f32", (1, 1, 1), (1, 1, 1), new_params()))


def test_out_of_device_memory(drv):
    drv.mem_alloc(1 << 19)
    with pytest.raises(OutOfDeviceMemory) as e:
        drv.mem_alloc((1 << 19) + 1)
    assert e.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    drv.mem_alloc((1 << 19) - 64)  # what is left still fits


def test_event_elapsed_is_host_time(drv, abc):
    s = abc[3]
    e0, e1 = drv.event_create(timing=True), drv.event_create(timing=True)
    drv.event_record(e0, s)
    drv.event_record(e1, s)
    assert drv.event_elapsed_ms(e0, e1) >= 0
    with pytest.raises(CudaError, match="INVALID_HANDLE"):
        drv.event_elapsed_ms(drv.event_create(), e1)


def _pdl(launch: Launch, on: bool) -> Launch:
    launch.pdl = on
    return launch


def test_update_refused_when_a_launch_changes_between_pdl_and_plain(drv, abc):
    """A PDL launch after a kernel is a programmatic edge: the same two kernels with the second launched
    plainly the next time is TOPOLOGY_CHANGED at that node (llama.cpp's mmvf -> mmf refusal at 1 -> 2
    tokens on F16 with fusion off, H100 2026-12-06); the same PDL both times updates."""
    a, b, c, s = abc
    assert drv.set_pdl(True)                     # the simulated device is 9.0
    first = capture(drv, s, add_launch(drv, c, a, b), _pdl(add_launch(drv, c, c, b), True))
    x = drv.instantiate(first)
    same = capture(drv, s, add_launch(drv, c, a, b), _pdl(add_launch(drv, c, c, b, kernel="mul_f32"), True))
    assert drv.exec_update(x, same).ok
    plain = capture(drv, s, add_launch(drv, c, a, b), _pdl(add_launch(drv, c, c, b), False))
    out = drv.exec_update(x, plain)
    assert not out.ok and out.result == UpdateResult.TOPOLOGY_CHANGED
    assert "node 1" in out.error_node and "ordinary" in out.error_node


def test_pdl_off_makes_every_edge_ordinary(drv, abc):
    a, b, c, s = abc
    drv.set_pdl(False)                           # GGML_CUDA_PDL=0: no launch carries the attribute
    x = drv.instantiate(capture(drv, s, add_launch(drv, c, a, b), _pdl(add_launch(drv, c, c, b), True)))
    assert drv.exec_update(x, capture(drv, s, add_launch(drv, c, a, b), _pdl(add_launch(drv, c, c, b), False))).ok

"""The simulated CUDA driver: numpy kernels on simulated device memory, with CUDA's capture and update rules.

Work runs synchronously at the call, except on a capturing stream, where it is recorded as graph nodes.
Capture is relaxed-mode: an event recorded on a capturing stream and waited on by another stream forks that
stream into the capture; the fork must be joined back (an event recorded on it, waited on by a stream of the
capture that the origin ends up depending on) before end_capture. Each node depends, in this order, on the
previous position of its stream and on the positions of the events its stream waited on.
Timings (event_elapsed_ms) are host wall-clock differences: simulated, not device time.

Decisions-only mode (`compute=False`, for models too big to compute in numpy): device memory is reserved,
not materialised (the same addresses, capacity and free-memory figures, no bytes), kernels and copies are
modelled, not run (the same counters, captured nodes and modelled clock), and a copy to the host reads
zeros. Every decision is the same as in compute mode; results (logits) are not computed.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass

import numpy as np

from ...errors import CaptureError, CudaError
from ...memory import AddressSpace, UnmappedAccess
from ...release import releasing
from ..sim_kernels import SIM_KERNELS
from .base import DeviceInfo, Driver, Launch, UpdateOutcome
from .sim_graph import Capture, Node, SimExec, SimGraph, SimHandle
from .sim_update import match_graphs

DEVICE_BASE = 0x7000_0000_0000
DEVICE_STRIDE = 0x100_0000_0000        # 1 TiB between simulated devices: addresses are unique in the process (UVA)
DEVICE_GRANULE = 2 << 20                # cuMemAlloc's address granule: a freed range is reused (memory.AddressSpace)
_node_ids = itertools.count(1)         # graph node ids, unique in the process (as CUDA's tools ids)


@dataclass
class SimCounters:
    """Calls seen by the driver. `launches` counts every launch() call, captured or not; `kernels_run` counts
    kernel bodies executed, or modelled in decisions-only mode (eager launches plus graph replays)."""

    launches: int = 0
    captured_launches: int = 0
    kernels_run: int = 0
    graph_launches: int = 0
    captures: int = 0
    instantiates: int = 0
    updates: int = 0
    update_refusals: int = 0


class SimStream(SimHandle):
    kind = "stream"

    def __init__(self):
        super().__init__()
        self.capture: Capture | None = None
        self.deps: tuple[int, ...] = ()  # the stream's position in its capture: what its next node depends on


class SimEvent(SimHandle):
    kind = "event"

    def __init__(self, timing: bool):
        super().__init__()
        self.timing = timing
        self.time_ns: int | None = None
        self.capture: Capture | None = None  # set when recorded on a capturing stream
        self.deps: tuple[int, ...] = ()


class SimDriver(Driver):
    """A CUDA driver over numpy. `space` is the device memory (memory_bytes=None: unbounded, reported as
    total_memory 0); `counters` the calls seen; `null_stream` stands for stream=None (never captures);
    `computes`: kernels run and memory holds bytes (False: decisions-only, see the module docstring)."""

    # Modelled time (ns) each operation takes: the simulated clock that drives the graph cache's eviction
    # sweep advances by these, never by the host's speed, so identical runs decide identically.
    LAUNCH_NS = 5_000                 # a kernel launched eagerly, or recorded into a capture
    GRAPH_NODE_NS = 2_000             # a kernel node run by a graph launch
    MEMCPY_NS = 5_000
    INSTANTIATE_NS, INSTANTIATE_NODE_NS = 100_000, 1_000
    UPDATE_NS, UPDATE_NODE_NS = 20_000, 500
    EPOCH_US = 100_000_000            # CLOCK_MONOTONIC counts from boot: a process starts long after it
    # Modelled device memory an executable holds (mem_get_info sees it): CUDA keeps ~10 KiB of device
    # memory per kernel node of an instantiated graph (a MODEL, labelled so in reports; CUDA is measured)
    EXEC_KERNEL_NODE_BYTES = 10 << 10

    def __init__(self, compute_capability=(9, 0), memory_bytes: int | None = 8 << 30, name="simulated GPU",
                 device: int = 0, peer: bool = True, compute: bool = True):
        """`device`: the ordinal of one of several simulated devices (its memory lies DEVICE_STRIDE further
        on); `peer`: whether it can reach the others' memory (modelled peer access); `compute`: False for
        decisions-only."""
        self.info = DeviceInfo(name if "simulated" in name else f"{name} (simulated)", tuple(compute_capability),
                               memory_bytes or 0, True)
        self.device, self.peer, self.computes = device, peer, bool(compute)
        self.space = AddressSpace(base=DEVICE_BASE + device * DEVICE_STRIDE, capacity=memory_bytes,
                                  name=self.info.name, materialised=self.computes, granule=DEVICE_GRANULE)
        self.counters = SimCounters()
        self.null_stream = SimStream()
        self._captures: list[Capture] = []  # captures in progress
        self._allocs: set[int] = set()
        self.modelled_ns = 0                # simulated time spent so far (see LAUNCH_NS ...)
        self.activity = None                # a SimActivity: the modelled device timeline (report/sources/simulated.py)
        # called as (kernel, label, space, params) after each kernel computed, eager or replayed: the oracle's
        # read of the run's expert choices (backends/sim_router_tap.py); None: nothing watches
        self.kernel_observer = None
        self.exec_bytes = 0                 # modelled device memory held by live executables

    def now_us(self) -> int:
        """The simulated clock (µs), ggml_time_us's stand-in on this driver."""
        return self.EPOCH_US + self.modelled_ns // 1000

    # -- handles ---------------------------------------------------------------------------------------
    def _stream(self, stream, call: str) -> SimStream:
        return self.null_stream if stream is None else SimHandle.check(stream, SimStream, call)

    def stream_create(self) -> SimStream:
        return SimStream()

    def stream_destroy(self, stream) -> None:
        SimHandle.check(stream, SimStream, "stream_destroy").alive = False

    def event_create(self, timing: bool = False) -> SimEvent:
        return SimEvent(timing)

    def event_destroy(self, event) -> None:
        SimHandle.check(event, SimEvent, "event_destroy").alive = False

    # -- capture state ---------------------------------------------------------------------------------
    def _fail_capture(self, caps, call: str) -> None:
        """Invalidate the capture(s) and raise CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, as an illegal call does."""
        for cap in caps if isinstance(caps, list) else [caps]:
            cap.invalidated = True
        raise CaptureError("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", call, "illegal while the stream is capturing")

    def _capturing(self, s: SimStream, call: str) -> bool:
        """Whether work on `s` is to be recorded; raises INVALIDATED on an invalidated capture."""
        if s.capture is None:
            return False
        if s.capture.invalidated:
            raise CaptureError("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", call, "a previous error invalidated it")
        return True

    def _record(self, s: SimStream, node: Node) -> None:
        s.deps = (s.capture.add(node, s.deps),)

    def is_capturing(self, stream) -> bool:
        """As cuStreamIsCapturing: an invalidated capture still counts (the stream stays in capture mode
        until EndCapture, which then fails)."""
        s = self._stream(stream, "is_capturing")
        return s.capture is not None

    def begin_capture(self, stream) -> None:
        s = self._stream(stream, "begin_capture")
        if s.capture is not None or s is self.null_stream:
            raise CudaError("CUDA_ERROR_ILLEGAL_STATE", "begin_capture", "stream already capturing or null stream")
        s.capture, s.deps = Capture(origin=s), ()
        self._captures.append(s.capture)
        self.counters.captures += 1
        if self.tracer is not None:
            self.tracer.on_begin_capture()

    def end_capture(self, stream) -> SimGraph:
        s = self._stream(stream, "end_capture")
        cap = s.capture
        if cap is None:
            raise CudaError("CUDA_ERROR_ILLEGAL_STATE", "end_capture", "stream is not capturing")
        if cap.origin is not s:
            raise CaptureError("CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "end_capture", "not the origin stream")
        unjoined = cap.unjoined()
        for t in cap.streams:  # every stream leaves the capture, whatever the outcome
            t.capture, t.deps = None, ()
        cap.ended = True
        self._captures.remove(cap)
        if cap.invalidated:
            raise CaptureError("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "end_capture")
        if unjoined:
            raise CaptureError("CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "end_capture",
                               f"{len(unjoined)} forked stream(s) not joined back")
        g = SimGraph(cap.nodes)
        if self.tracer is not None:
            self.tracer.on_end_capture(g.id, self.graph_kernel_nodes(g))
        return g

    def graph_kernel_nodes(self, graph) -> list[tuple[int, int]]:
        """(node id, node id) per kernel node, in capture order (CUDA: handle and tools id)."""
        g = SimHandle.check(graph, SimGraph, "graph_kernel_nodes")
        return [(n.node_id, n.node_id) for n in g.nodes if n.type == "kernel"]

    # -- streams and events ----------------------------------------------------------------------------
    def stream_synchronize(self, stream) -> None:
        s = self._stream(stream, "stream_synchronize")
        if s.capture is not None:
            self._fail_capture(s.capture, "stream_synchronize")

    def synchronize(self) -> None:
        """Device-wide sync: illegal while any capture is active (it would wait on a capturing stream)."""
        if self._captures:
            self._fail_capture(list(self._captures), "synchronize")

    def event_record(self, event, stream) -> None:
        e = SimHandle.check(event, SimEvent, "event_record")
        s = self._stream(stream, "event_record")
        if self._capturing(s, "event_record"):
            e.capture, e.deps, e.time_ns = s.capture, s.deps, None
        else:
            e.capture, e.deps, e.time_ns = None, (), time.perf_counter_ns()

    def stream_wait_event(self, stream, event) -> None:
        """Waiting on an event recorded in a capture forks `stream` into it (or adds the event's position)."""
        s = self._stream(stream, "stream_wait_event")
        e = SimHandle.check(event, SimEvent, "stream_wait_event")
        if e.capture is None or e.capture.ended:
            return  # work outside capture is already done: the sim is synchronous
        if e.capture.invalidated:
            raise CaptureError("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "stream_wait_event")
        if s.capture is None:
            if s is self.null_stream:
                self._fail_capture(e.capture, "stream_wait_event")
            s.capture, s.deps = e.capture, ()
            e.capture.streams.append(s)
        elif s.capture is not e.capture:
            raise CaptureError("CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "stream_wait_event", "event of another capture")
        s.deps = tuple(dict.fromkeys(s.deps + e.deps))

    def event_elapsed_ms(self, start, end) -> float:
        """Host-time difference of the two records in ms (simulated timing)."""
        a = SimHandle.check(start, SimEvent, "event_elapsed_ms")
        b = SimHandle.check(end, SimEvent, "event_elapsed_ms")
        if not (a.timing and b.timing):
            raise CudaError("CUDA_ERROR_INVALID_HANDLE", "event_elapsed_ms", "event created without timing")
        if a.time_ns is None or b.time_ns is None:
            raise CudaError("CUDA_ERROR_NOT_READY", "event_elapsed_ms", "event not recorded outside capture")
        return (b.time_ns - a.time_ns) / 1e6

    # -- graphs ----------------------------------------------------------------------------------------
    def graph_destroy(self, graph) -> None:
        SimHandle.check(graph, SimGraph, "graph_destroy").alive = False

    def graph_num_nodes(self, graph) -> int:
        return len(SimHandle.check(graph, SimGraph, "graph_num_nodes").nodes)

    def instantiate(self, graph) -> SimExec:
        g = SimHandle.check(graph, SimGraph, "instantiate")
        self.counters.instantiates += 1
        self.modelled_ns += self.INSTANTIATE_NS + self.INSTANTIATE_NODE_NS * len(g.nodes)
        x = SimExec([n.copy() for n in g.nodes])
        if self.tracer is not None:
            self.tracer.on_instantiate(g.id, x.id)
        x.mem_bytes = self.EXEC_KERNEL_NODE_BYTES * sum(n.type == "kernel" for n in g.nodes)
        self.exec_bytes += x.mem_bytes
        return x

    def exec_update(self, exec_, graph) -> UpdateOutcome:
        """cuGraphExecUpdate (CUDA 12+): the graphs matched as the driver matches them (sim_update.py), then each
        executable node takes its partner's parameters, keeping its own edges and id."""
        x = SimHandle.check(exec_, SimExec, "exec_update")
        g = SimHandle.check(graph, SimGraph, "exec_update")
        m = match_graphs(x.nodes, g.nodes)
        outcome = m.outcome
        self.modelled_ns += self.UPDATE_NS + self.UPDATE_NODE_NS * len(g.nodes)
        if not outcome.ok:
            self.counters.update_refusals += 1
            return outcome
        x.nodes = [dataclasses.replace(g.nodes[j].copy(), deps=o.deps, node_id=o.node_id)
                   for o, j in zip(x.nodes, m.partner)]
        self.counters.updates += 1
        if self.tracer is not None:
            self.tracer.on_update(x.id, g.id)
        return outcome

    def exec_destroy(self, exec_) -> None:
        x = SimHandle.check(exec_, SimExec, "exec_destroy")
        x.alive = False
        self.exec_bytes -= getattr(x, "mem_bytes", 0)

    def graph_launch(self, exec_, stream) -> None:
        """Run the executable's nodes in a topological order of its edges (ties: capture order)."""
        x = SimHandle.check(exec_, SimExec, "graph_launch")
        s = self._stream(stream, "graph_launch")
        if self._capturing(s, "graph_launch"):
            raise CudaError("CUDA_ERROR_NOT_SUPPORTED", "graph_launch", "child graphs are not simulated")
        self.counters.graph_launches += 1
        if self.tracer is not None:
            self.tracer.on_graph_launch(x.id)
        if self.activity is not None:
            self.activity.graph(x.nodes, x.order, x.id, s.id, self.modelled_ns)
        self.modelled_ns += self.GRAPH_NODE_NS * len(x.order)
        try:
            for i in x.order:
                self._run_node(x.nodes[i])
        except UnmappedAccess as e:         # a captured address freed since (upstream's pool frees with graphs alive)
            raise CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "graph_launch", str(e)) from None

    def _run_node(self, n: Node) -> None:
        if n.type == "kernel":
            if self.computes:
                n.fn(self.space, n.params)
                if self.kernel_observer is not None:
                    self.kernel_observer(n.name, n.label, self.space, n.params)
            self.counters.kernels_run += 1
        else:
            self._copy(n.dst, n.src, n.nbytes)

    # -- kernels ---------------------------------------------------------------------------------------
    def prepare(self, launch: Launch) -> Launch:
        fn = SIM_KERNELS.get(launch.kernel)
        if fn is None:
            raise CudaError("CUDA_ERROR_NOT_FOUND", "prepare", f"no kernel named {launch.kernel!r}")
        launch.handle = fn
        return launch

    def launch(self, stream, launch: Launch) -> None:
        s = self._stream(stream, "launch")
        if launch.handle is None or launch.handle is not SIM_KERNELS.get(launch.kernel):
            raise CudaError("CUDA_ERROR_INVALID_HANDLE", "launch", f"{launch.kernel!r} is not prepared")
        self.counters.launches += 1
        self.modelled_ns += self.LAUNCH_NS
        if self.tracer is not None:
            self.tracer.on_launch(launch.kernel, launch.label)
        if self._capturing(s, "launch"):
            self.counters.captured_launches += 1
            self._record(s, Node("kernel", launch.kernel, tuple(launch.grid), tuple(launch.block),
                                 launch.params.copy(), fn=launch.handle, label=launch.label,
                                 node_id=next(_node_ids), programmatic=self.pdl and launch.pdl))
            return
        if self.computes:
            launch.handle(self.space, launch.params)
            if self.kernel_observer is not None:
                self.kernel_observer(launch.kernel, launch.label, self.space, launch.params)
        self.counters.kernels_run += 1
        if self.activity is not None:
            self.activity.kernel(launch.kernel, launch.grid, s.id, self.modelled_ns)

    # -- memory ----------------------------------------------------------------------------------------
    def mem_alloc(self, nbytes: int) -> int:
        addr = self.space.alloc(nbytes)
        self._allocs.add(addr)
        return addr

    def mem_free(self, addr: int) -> None:
        if addr not in self._allocs:
            raise CudaError("CUDA_ERROR_INVALID_VALUE", "mem_free", f"{addr:#x} is not an allocation")
        self._allocs.discard(addr)
        self.space.free(addr)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total): allocations plus the executables' modelled memory are in use; an unbounded
        device reports 1 TiB total."""
        total = self.space.capacity if self.space.capacity is not None else 1 << 40
        return max(total - self.space.used - self.exec_bytes, 0), total

    def _copy(self, dst, src, nbytes: int) -> None:
        """Copy nbytes; dst/src are device addresses (int) or host uint8 arrays. Decisions-only: a host
        destination reads zeros, a device one keeps nothing."""
        if not self.computes:
            if not isinstance(dst, int):
                dst[:nbytes] = 0
            return
        s = self.space.bytes(src, nbytes) if isinstance(src, int) else src[:nbytes]
        if isinstance(dst, int):
            self.space.bytes(dst, nbytes)[:] = s
        else:
            dst[:nbytes] = s

    def _memcpy(self, call: str, dst, src, nbytes: int, stream, recordable: bool) -> None:
        if stream is None and self._captures:  # a synchronous copy waits on every stream, capturing ones too
            self._fail_capture(list(self._captures), call)
        s = self._stream(stream, call)
        self.modelled_ns += self.MEMCPY_NS
        if self._capturing(s, call):
            if not recordable:
                self._fail_capture(s.capture, call)
            self._record(s, Node("memcpy", call, dst=dst, src=src, nbytes=nbytes, node_id=next(_node_ids)))
            return
        self._copy(dst, src, nbytes)
        if self.activity is not None:
            self.activity.memcpy(call, nbytes, s.id, self.modelled_ns)

    def memcpy_htod(self, dst: int, src: np.ndarray, stream=None) -> None:
        """A captured copy reads `src` at each replay (the host pointer is baked into the graph)."""
        self._memcpy("memcpy_htod", int(dst), _host_bytes(src, "memcpy_htod"), src.nbytes, stream, True)

    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream=None) -> None:
        """Illegal during capture (the host must wait for it): the capture is invalidated."""
        self._memcpy("memcpy_dtoh", _host_bytes(dst, "memcpy_dtoh"), int(src), dst.nbytes, stream, False)

    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        self._memcpy("memcpy_dtod", int(dst), int(src), int(nbytes), stream, True)

    def memset_d8(self, dst: int, value: int, nbytes: int, stream=None) -> None:
        """Outside capture only (nothing captures a memset here)."""
        if self._captures:
            self._fail_capture(list(self._captures), "memset_d8")
        if self.computes:
            self.space.bytes(int(dst), int(nbytes))[:] = value

    # -- several devices: modelled peer access and copies between simulated devices ----------------------
    def make_current(self) -> None:
        """Nothing to switch: every simulated device is reachable from the host at once."""

    def can_access_peer(self, other: "SimDriver") -> bool:
        return self.peer and other.peer

    def enable_peer_access(self, other: "SimDriver") -> None:
        if not self.can_access_peer(other):
            raise CudaError("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "enable_peer_access")

    def memcpy_peer(self, dst: int, src_driver: "SimDriver", src: int, nbytes: int, stream=None) -> None:
        """Copy nbytes from `src` on src_driver's device to `dst` here (outside capture, as the scheduler
        copies split inputs before computing a split)."""
        if self._captures:
            self._fail_capture(list(self._captures), "memcpy_peer")
        s = self._stream(stream, "memcpy_peer")
        self.modelled_ns += self.MEMCPY_NS
        if self.computes and src_driver.computes:
            self.space.bytes(int(dst), int(nbytes))[:] = src_driver.space.bytes(int(src), int(nbytes))
        if self.activity is not None:
            self.activity.memcpy("memcpy_peer", nbytes, s.id, self.modelled_ns)

    def reserve(self, nbytes: int) -> None:
        """Size the simulated device so `nbytes` more fit (it is sized for the model it is given); an
        unbounded device stays unbounded. Host memory is the caller's to check (it backs this device)."""
        cap = self.space.capacity
        if cap is not None and self.space.used + nbytes > cap:
            self.space.capacity = self.space.used + int(nbytes)
            self.info = dataclasses.replace(self.info, total_memory=self.space.capacity)

    def close(self) -> None:
        """Free all device memory still allocated (each tried: the first error raised once all were)."""
        with releasing() as release:
            for addr in sorted(self._allocs):
                release(self.space.free, addr)
            self._allocs.clear()


def _host_bytes(a: np.ndarray, call: str) -> np.ndarray:
    """A flat uint8 view of a C-contiguous host array (no copy: writes reach the caller's array)."""
    if not a.flags.c_contiguous:
        raise CudaError("CUDA_ERROR_INVALID_VALUE", call, "host array is not contiguous")
    return a.reshape(-1).view(np.uint8)

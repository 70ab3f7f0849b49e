"""The driver interface the graph runtime runs over.

Two implementations: `CudaDriver` (real GPU through cuda.bindings) and `SimDriver` (numpy kernels on
simulated device memory, with CUDA's capture and update rules). Handles are opaque objects owned by the
driver; every one has an explicit destroy. Kernels are named by string and launched from a `Launch` prepared
once (parameters packed once, reused on every launch).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field

import numpy as np


class UpdateResult(enum.IntEnum):
    """CUgraphExecUpdateResult, with the driver's values."""

    SUCCESS = 0
    ERROR = 1
    TOPOLOGY_CHANGED = 2
    NODE_TYPE_CHANGED = 3
    FUNCTION_CHANGED = 4
    PARAMETERS_CHANGED = 5
    NOT_SUPPORTED = 6
    UNSUPPORTED_FUNCTION_CHANGE = 7
    ATTRIBUTES_CHANGED = 8

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


@dataclass(frozen=True)
class UpdateOutcome:
    """What exec-update returned: `ok`, else the refusal `result` and the node the driver blamed (if any)."""

    ok: bool
    result: UpdateResult = UpdateResult.SUCCESS
    error_node: str | None = None


@dataclass
class Launch:
    """One prepared kernel launch. `params` is a 0-d abi.KPARAMS record; `handle` is driver-private."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: np.ndarray
    shmem: int = 0
    handle: object = field(default=None, repr=False)
    label: str = ""       # the graphdiag node(s) this launch computes ("attn_norm-0+attn_norm_mul-0")
    pdl: bool = True      # upstream launches this kernel with PDL (gpu/pdl.py), where the driver's PDL is on


# the H200's streaming multiprocessors: the simulated driver's, so its stream-k decisions are the H200's
H200_MULTIPROCESSORS = 132


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    total_memory: int
    simulated: bool
    # streaming multiprocessors (ggml_cuda_info().devices[id].nsm: the stream-k MMQ's block count)
    multiprocessors: int = H200_MULTIPROCESSORS


class Driver(abc.ABC):
    """Streams, events, capture, graphs, kernel launches and device memory."""

    info: DeviceInfo
    # a LaunchLog (launch_log.py) told what the host issues, for naming device records by graph node;
    # None (the default) costs one attribute test per call
    tracer = None
    # whether kernels compute results and device memory holds bytes; False: the simulated driver's
    # decisions-only mode (every call decided and timed as usual, nothing computed or stored)
    computes = True
    # host ns spent making kernels loadable (NVRTC compile or cache read, module load): graphdiag's own
    # cost, which a precompiled llama.cpp never pays, so the eviction clock leaves it out
    kernel_load_ns = 0

    def graph_kernel_nodes(self, graph) -> list[tuple[int, int]]:
        """(node handle, tools id) of each kernel node of a captured graph, in the graph's node order."""
        return []

    n_visible = 1      # devices the process sees, when the driver cannot ask (a simulated set sets it)

    def visible_devices(self) -> int:
        """CUDA devices visible to the process (ggml_backend_cuda_get_device_count): all of them, used or not."""
        return self.n_visible

    @property
    def simulated(self) -> bool:
        return self.info.simulated

    @property
    def nsm(self) -> int:
        """Streaming multiprocessors of the device (upstream's nsm)."""
        return self.info.multiprocessors

    @property
    def cc(self) -> int:
        """Compute capability as ggml encodes it (major*100 + minor*10: 9.0 -> 900)."""
        major, minor = self.info.compute_capability
        return major * 100 + minor * 10

    # streams and events
    @abc.abstractmethod
    def stream_create(self) -> object: ...
    @abc.abstractmethod
    def stream_destroy(self, stream) -> None: ...
    @abc.abstractmethod
    def stream_synchronize(self, stream) -> None:
        """Waits for the stream. On a capturing stream this is illegal: the capture is invalidated and
        CaptureError raised, as CUDA does."""
    @abc.abstractmethod
    def event_create(self, timing: bool = False) -> object: ...
    @abc.abstractmethod
    def event_destroy(self, event) -> None: ...
    @abc.abstractmethod
    def event_record(self, event, stream) -> None: ...
    @abc.abstractmethod
    def stream_wait_event(self, stream, event) -> None: ...
    @abc.abstractmethod
    def event_elapsed_ms(self, start, end) -> float: ...
    @abc.abstractmethod
    def synchronize(self) -> None: ...

    # capture and graphs
    @abc.abstractmethod
    def begin_capture(self, stream) -> None:
        """Begin relaxed-mode stream capture."""
    @abc.abstractmethod
    def end_capture(self, stream) -> object:
        """End capture and return the captured graph; raises CaptureError if the capture was invalidated
        or a forked stream was not joined back."""
    @abc.abstractmethod
    def is_capturing(self, stream) -> bool: ...
    @abc.abstractmethod
    def graph_destroy(self, graph) -> None: ...
    @abc.abstractmethod
    def graph_num_nodes(self, graph) -> int: ...
    @abc.abstractmethod
    def instantiate(self, graph) -> object: ...
    @abc.abstractmethod
    def exec_update(self, exec_, graph) -> UpdateOutcome:
        """cuGraphExecUpdate: on refusal returns ok=False with the driver's reason; the sticky error is
        already cleared and `exec_` is left as it was (the caller destroys and re-instantiates)."""
    @abc.abstractmethod
    def exec_destroy(self, exec_) -> None: ...
    @abc.abstractmethod
    def graph_launch(self, exec_, stream) -> None: ...

    # kernels
    pdl = False       # launches carry programmatic stream serialisation (set_pdl)
    launcher = "one by one"   # how launch_batch issues its launches

    def set_pdl(self, on: bool) -> bool:
        """GGML_CUDA_PDL: launch kernels prepared from now on with programmatic dependent launch, where the
        GPU has it (compute capability 9.0+; kernels wait for their predecessors first, so results are the
        same). Returns whether it applies. On a graph it changes only edge types, never a decision."""
        self.pdl = bool(on) and self.cc >= 900
        return self.pdl

    @abc.abstractmethod
    def prepare(self, launch: Launch) -> Launch:
        """Resolve the kernel and pack the parameters once; returns the same Launch with `handle` set.
        Call again after changing launch.params in place."""
    @abc.abstractmethod
    def launch(self, stream, launch: Launch) -> None:
        """Launch a prepared kernel (recorded as a graph node when the stream is capturing)."""

    def launch_batch(self, stream, launches: list[Launch]) -> None:
        """Prepared launches in order on `stream`, as launch() makes them one by one (which is what this
        does; the CUDA driver issues them from C). A failing launch raises, the ones before it made."""
        for launch in launches:
            self.launch(stream, launch)

    # memory
    @abc.abstractmethod
    def mem_alloc(self, nbytes: int) -> int:
        """Device allocation; raises OutOfDeviceMemory."""
    @abc.abstractmethod
    def mem_free(self, addr: int) -> None: ...
    @abc.abstractmethod
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes (cuMemGetInfo). The graph runtime reads it around each
        instantiate to see what an executable holds."""
    @abc.abstractmethod
    def memcpy_htod(self, dst: int, src: np.ndarray, stream=None) -> None:
        """Synchronous when stream is None; else ordered on `stream` (src must stay alive until done)."""
    @abc.abstractmethod
    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream=None) -> None: ...
    @abc.abstractmethod
    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream=None) -> None: ...

    def copies_prepare(self, items: list[tuple[int, np.ndarray]]) -> object:
        """A fixed set of host-to-device copies (device address, host array the caller keeps alive), issued
        together by copies_issue, every step, in stream order. This default issues them one by one."""
        return list(items)

    def copies_issue(self, prepared, stream) -> None:
        for dst, src in prepared:
            self.memcpy_htod(dst, src, stream)

    def host_alloc(self, nbytes: int) -> np.ndarray:
        """`nbytes` of page-locked host memory as a uint8 array, alive until close(). Copies to and from it
        go straight to the device (no bounce through the driver's own staging), as those of ggml's CUDA host
        buffer type (cudaMallocHost), which llama.cpp's output and input buffers use. This default is plain
        host memory: the simulated driver copies between arrays anyway."""
        return np.zeros(max(int(nbytes), 1), np.uint8)

    def memset_d8(self, dst: int, value: int, nbytes: int, stream=None) -> None:
        """Set nbytes at `dst` to the byte `value` (synchronous when stream is None). This default copies a
        host buffer; drivers override it with a device memset."""
        chunk = np.full(min(int(nbytes), 64 << 20), value, np.uint8)
        for off in range(0, int(nbytes), len(chunk)):
            self.memcpy_htod(dst + off, chunk[: min(len(chunk), int(nbytes) - off)])

    def preload(self) -> None:
        """Compile/load every catalogue kernel now, so no step pays for it (timings stay clean)."""

    def close(self) -> None:
        """Release everything the driver still holds."""

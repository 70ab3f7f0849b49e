"""CudaDriver: the Driver interface on cuda.bindings.driver (the only module importing cuda-python, with
backends/nvrtc.py).

Every CUDA return code is checked and raised as CudaError(result name, call name); capture-related codes
raise CaptureError, CUDA_ERROR_OUT_OF_MEMORY from cuMemAlloc raises OutOfDeviceMemory. Every handle this
driver creates is tracked and released by close(). Kernels are compiled lazily, one kernels/*.cu file at a
time (NVRTC -> CUBIN, disk-cached), on the first prepare() of a kernel the file defines.
"""

from __future__ import annotations

import ctypes
import struct
import time
from pathlib import Path
from dataclasses import dataclass

import numpy as np

from ...errors import CaptureError, CudaError, NoDeviceError, OutOfDeviceMemory
from ..abi import KPARAMS
from ..nvrtc import KernelCompiler, arch_for
from . import launch_loop
from .base import DeviceInfo, Driver, Launch, UpdateOutcome, UpdateResult

try:
    from cuda.bindings import driver as D
except ImportError:   # cuda-python absent: open() says so in one line
    D = None

_SHMEM_DEFAULT_MAX = 48 * 1024   # above this a kernel must opt in (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
_CAPTURE_ERRORS = frozenset({
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    "CUDA_ERROR_STREAM_CAPTURE_MERGE", "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
    "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "CUDA_ERROR_CAPTURED_EVENT",
    "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
})


def _err_name(err) -> str:
    try:
        rc, name = D.cuGetErrorName(err)
        if not rc and name:
            return name.decode()
    except Exception:   # an unknown code: fall back to the enum's own name
        pass
    return getattr(err, "name", f"CUresult({int(err)})")


def _error(err, call: str) -> CudaError:
    name = _err_name(err)
    return (CaptureError if name in _CAPTURE_ERRORS else CudaError)(name, call)


def _check(result: tuple, call: str):
    """`result` is a binding's (status, *outputs); returns None, the output, or the outputs."""
    if result[0]:
        raise _error(result[0], call)
    return None if len(result) == 1 else result[1] if len(result) == 2 else result[1:]


class _UpdateResultInfo(ctypes.Structure):
    """CUgraphExecUpdateResultInfo (cuda.h): cuda.bindings returns None for it on refusal, hence ctypes."""

    _fields_ = [("result", ctypes.c_int), ("errorNode", ctypes.c_void_p), ("errorFromNode", ctypes.c_void_p)]


def _load_exec_update():
    """libcuda's cuGraphExecUpdate_v2 (the same library the bindings loaded, so the same contexts)."""
    fn = ctypes.CDLL("libcuda.so.1").cuGraphExecUpdate_v2
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_UpdateResultInfo)]
    fn.restype = ctypes.c_int
    return fn


@dataclass(eq=False)
class _Prepared:
    """A launch packed once: its function, the kernelParams pointer array, and the launch configs of its
    geometry by stream (shared by every launch of that geometry)."""

    args: tuple           # (CUfunction, grid x, y, z, block x, y, z, shmem bytes)
    buf: object           # ctypes buffer: void*[1] = {&record}, 8 bytes of padding, then a private copy of
                          # the KPARAMS record (576 bytes)
    argv_addr: int
    configs: dict         # stream (None: the null stream) -> CUlaunchConfig with that hStream
    pdl: bool             # the configs carry programmatic stream serialisation (GGML_CUDA_PDL)
    rows: dict            # stream -> the launch loop's row (config address, CUfunction, kernelParams)


_ARGV_HEAD = 16   # bytes before the record in a _Prepared buffer (the pointer, padded to 16)


def _pack_argv(record: bytes):
    """(buffer, address) of kernelParams for one launch: a pointer to the record copied right after it.
    One ctypes allocation (about 1 µs) where two numpy arrays of a structured dtype took about 7 µs."""
    buf = ctypes.create_string_buffer(bytes(_ARGV_HEAD) + record)
    addr = ctypes.addressof(buf)
    ctypes.c_uint64.from_address(addr).value = addr + _ARGV_HEAD
    return buf, addr


def _launch_config(args: tuple, stream, pdl: bool):
    """A CUlaunchConfig for cuLaunchKernelEx: the grid, block and shared memory of `args` on `stream`, with
    the programmatic stream serialisation attribute where `pdl` (ggml_cuda_pdl_config). Every launch goes
    through cuLaunchKernelEx with a config built once per geometry and stream: the bindings convert
    cuLaunchKernel's eleven arguments on every call, and setting a config's hStream costs about 1 µs. On two
    lent H200s (2026-12-04, each pair in one process): cuLaunchKernel 5.1 µs bare against cuLaunchKernelEx
    3.8 µs bare and 4.9 µs through the old launch() (hStream set per call); cuLaunchKernelEx 3.3 µs bare
    against 3.5 µs through this launch()."""
    cfg = D.CUlaunchConfig()
    _, cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ, cfg.sharedMemBytes = args
    cfg.hStream = stream
    if pdl:
        attr = D.CUlaunchAttribute()
        attr.id = D.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
    return cfg


@dataclass
class _CopyBatch:
    args: tuple        # cuMemcpyBatchAsync's arguments but the stream
    items: list        # the same copies, for the one-by-one fallback


@dataclass
class _Copies:
    """Copies issued one by one, their host addresses read once: ndarray.ctypes.data costs ~2 µs a call on
    the lent H200's host, as much as the copy call itself."""
    calls: list        # (device address, host address, bytes)
    arrays: list       # the host arrays, kept alive with the calls


class CudaDriver(Driver):
    """A real GPU through the driver API, on the device's primary context."""

    def __init__(self, device: int, dev, ctx, info: DeviceInfo, compiler: KernelCompiler):
        self.device, self._dev, self._ctx, self.info, self.compiler = device, dev, ctx, info, compiler
        self._null_stream = D.CUstream(0)
        self._owned: dict[str, dict[int, object]] = {k: {} for k in ("stream", "event", "graph", "exec", "mem", "host")}
        self._modules: dict[str, object] = {}
        self._functions: dict[str, object] = {}
        self._exec_update = _load_exec_update()
        self.batch_copies_error: str | None = None    # why cuMemcpyBatchAsync was refused (then: one by one)
        self._configs: dict[tuple, dict] = {}          # (launch geometry, PDL) -> {stream: CUlaunchConfig}
        self._shmem_opt_in: dict[str, int] = {}       # kernel -> dynamic shared memory it was allowed
        self._loop: launch_loop.LaunchLoop | None = None
        self._loop_tried = False
        self.launch_loop_error = ""                    # why launch_batch launches one by one ("": it does not)
        self._launch_ex = 0                            # libcuda's cuLaunchKernelEx, for the loop
        self._closed = False

    def visible_devices(self) -> int:
        """CUDA devices visible to the process (CUDA_VISIBLE_DEVICES), used or not."""
        return device_count()

    @classmethod
    def open(cls, device: int = 0, compiler: KernelCompiler | None = None,
             cache_dir: Path | None = None) -> "CudaDriver":
        """Retain `device`'s primary context; NoDeviceError (one line) without cuda-python, driver or GPU.
        Kernels compile with `compiler`, else with one caching CUBINs in `cache_dir` (the runner hands down
        config.kernel_cache_dir(); None: no disk cache)."""
        count = device_count()
        if not 0 <= device < count:
            raise NoDeviceError(f"no CUDA device {device}: the driver reports {count}")
        dev = _check(D.cuDeviceGet(device), "cuDeviceGet")
        ctx = _check(D.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(D.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        info = _device_info(dev)
        return cls(device, dev, ctx, info, compiler or KernelCompiler(arch_for(info.compute_capability), cache_dir=cache_dir))

    # streams and events
    def stream_create(self):
        s = _check(D.cuStreamCreate(D.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
        return self._own("stream", s)

    def stream_destroy(self, stream) -> None:
        _check(D.cuStreamDestroy(self._disown("stream", stream)), "cuStreamDestroy")

    def stream_synchronize(self, stream) -> None:
        _check(D.cuStreamSynchronize(self._s(stream)), "cuStreamSynchronize")

    def event_create(self, timing: bool = False):
        flags = D.CUevent_flags.CU_EVENT_DEFAULT if timing else D.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return self._own("event", _check(D.cuEventCreate(flags.value), "cuEventCreate"))

    def event_destroy(self, event) -> None:
        _check(D.cuEventDestroy(self._disown("event", event)), "cuEventDestroy")

    def event_record(self, event, stream) -> None:
        _check(D.cuEventRecord(event, self._s(stream)), "cuEventRecord")

    def stream_wait_event(self, stream, event) -> None:
        _check(D.cuStreamWaitEvent(self._s(stream), event, 0), "cuStreamWaitEvent")

    def event_elapsed_ms(self, start, end) -> float:
        """Milliseconds between two recorded timing events (waits for `end`)."""
        _check(D.cuEventSynchronize(end), "cuEventSynchronize")
        return float(_check(D.cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    def synchronize(self) -> None:
        _check(D.cuCtxSynchronize(), "cuCtxSynchronize")

    # capture and graphs
    def begin_capture(self, stream) -> None:
        mode = D.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        _check(D.cuStreamBeginCapture(self._s(stream), mode), "cuStreamBeginCapture")
        if self.tracer is not None:
            self.tracer.on_begin_capture()

    def end_capture(self, stream):
        graph = self._own("graph", _check(D.cuStreamEndCapture(self._s(stream)), "cuStreamEndCapture"))
        if self.tracer is not None:
            self.tracer.on_end_capture(int(graph), self.graph_kernel_nodes(graph))
        return graph

    def graph_kernel_nodes(self, graph) -> list[tuple[int, int]]:
        """(node handle, tools id) per kernel node, in cuGraphGetNodes order (the capture's order); the
        tools id is cuGraphNodeGetToolsId's, or cuGraphNodeGetLocalId's, or 0 where the driver has neither."""
        _, nodes, n = D.cuGraphGetNodes(graph, self.graph_num_nodes(graph))
        out = []
        for node in nodes[:n]:
            if _check(D.cuGraphNodeGetType(node), "cuGraphNodeGetType") != D.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                continue
            out.append((int(node), self._node_tools_id(node)))
        return out

    _NODE_ID_FUNCTIONS = ("cuGraphNodeGetToolsId", "cuGraphNodeGetLocalId")

    def _node_tools_id(self, node) -> int:
        """The node's id as CUPTI reports it, through the first of _NODE_ID_FUNCTIONS this driver has: the
        bindings may name a function the installed driver lacks (cuGraphNodeGetToolsId on 580 raises
        "Function not found"), so a missing one is dropped for the session."""
        fns = getattr(self, "_node_id_fns", None)
        if fns is None:
            fns = self._node_id_fns = [getattr(D, n) for n in self._NODE_ID_FUNCTIONS if hasattr(D, n)]
        while fns:
            try:
                err, value = fns[0](node)
            except RuntimeError:            # not exported by this driver
                fns.pop(0)
                continue
            return int(value) if not err else 0
        return 0

    def is_capturing(self, stream) -> bool:
        status = _check(D.cuStreamIsCapturing(self._s(stream)), "cuStreamIsCapturing")
        return status != D.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE   # invalidated counts: end it

    def graph_destroy(self, graph) -> None:
        _check(D.cuGraphDestroy(self._disown("graph", graph)), "cuGraphDestroy")

    def graph_num_nodes(self, graph) -> int:
        return int(_check(D.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1])

    def instantiate(self, graph):
        x = self._own("exec", _check(D.cuGraphInstantiate(graph, 0), "cuGraphInstantiate"))
        if self.tracer is not None:
            self.tracer.on_instantiate(int(graph), int(x))
        return x

    def exec_update(self, exec_, graph) -> UpdateOutcome:
        """cuGraphExecUpdate_v2 through ctypes, to read the refusal reason. The driver API keeps no sticky
        "last error" (that is the runtime's cudaGetLastError, which llama.cpp clears), and a refused
        update leaves `exec_` untouched, so there is nothing to undo here."""
        info = _UpdateResultInfo()
        rc = self._exec_update(int(exec_), int(graph), ctypes.byref(info))
        if rc == 0:
            if self.tracer is not None:
                self.tracer.on_update(int(exec_), int(graph))
            return UpdateOutcome(True)
        if rc != D.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
            raise _error(D.CUresult(rc), "cuGraphExecUpdate")
        try:
            result = UpdateResult(info.result)
        except ValueError:   # a reason newer than this enum
            result = UpdateResult.ERROR
        node = self._describe_node(graph, info.errorNode) if info.errorNode else None
        return UpdateOutcome(False, result, node)

    def exec_destroy(self, exec_) -> None:
        _check(D.cuGraphExecDestroy(self._disown("exec", exec_)), "cuGraphExecDestroy")

    def graph_launch(self, exec_, stream) -> None:
        _check(D.cuGraphLaunch(exec_, self._s(stream)), "cuGraphLaunch")
        if self.tracer is not None:
            self.tracer.on_graph_launch(int(exec_))

    # kernels
    def prepare(self, launch: Launch) -> Launch:
        if launch.params.dtype != KPARAMS:
            raise TypeError(f"{launch.kernel}: params must be an abi.KPARAMS record, not {launch.params.dtype}")
        fn = self._function(launch.kernel)
        shmem = int(launch.shmem)
        if shmem > _SHMEM_DEFAULT_MAX and shmem > self._shmem_opt_in.get(launch.kernel, 0):
            attr = D.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(D.cuFuncSetAttribute(fn, attr, shmem), "cuFuncSetAttribute")
            self._shmem_opt_in[launch.kernel] = shmem
        buf, addr = _pack_argv(launch.params.tobytes())   # private snapshot: later edits need a re-prepare
        args = (fn, *map(int, launch.grid), *map(int, launch.block), shmem)
        pdl = self.pdl and launch.pdl
        configs = self._configs.setdefault((args, pdl), {})
        launch.handle = _Prepared(args, buf, addr, configs, pdl, {})
        return launch

    def launch(self, stream, launch: Launch) -> None:
        h = launch.handle
        cfg = h.configs.get(stream)
        if cfg is None:
            cfg = h.configs[stream] = _launch_config(h.args, self._s(stream), h.pdl)
        (err,) = D.cuLaunchKernelEx(cfg, h.args[0], h.argv_addr, 0)
        if err:
            raise _error(err, f"cuLaunchKernelEx({launch.kernel})")
        if self.tracer is not None:
            self.tracer.on_launch(launch.kernel, launch.label)

    @property
    def launcher(self) -> str:
        """How launch_batch issues its launches: "C loop" (launch_loop.c) or "bindings" with the reason."""
        return "C loop" if self._launch_loop() is not None else f"cuda.bindings one by one ({self.launch_loop_error})"

    def _launch_loop(self):
        if not self._loop_tried:
            self._loop_tried = True
            self._loop, self.launch_loop_error = launch_loop.load(self.compiler.cache_dir)
            if self._loop is not None:
                self._launch_ex = ctypes.cast(ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx, ctypes.c_void_p).value
        return self._loop

    def launch_batch(self, stream, launches: list[Launch]) -> None:
        """The launches in order on `stream`, as launch() makes them one by one, issued in one call through
        the C launch loop (libcuda's cuLaunchKernelEx on the same configs, functions and kernelParams); one
        by one through the bindings where the loop could not be built. A failing launch raises as launch()
        does, the ones before it made."""
        loop = self._loop if self._loop_tried else self._launch_loop()
        if loop is None:
            for la in launches:
                self.launch(stream, la)
            return
        try:
            rows = b"".join([la.handle.rows[stream] for la in launches])
        except KeyError:              # a launch's first time on this stream: its row made once
            for la in launches:
                h = la.handle
                if stream not in h.rows:
                    cfg = h.configs.get(stream)
                    if cfg is None:
                        cfg = h.configs[stream] = _launch_config(h.args, self._s(stream), h.pdl)
                    h.rows[stream] = struct.pack("<3Q", cfg.getPtr(), int(h.args[0]), h.argv_addr)
            rows = b"".join([la.handle.rows[stream] for la in launches])
        done, err = loop.run(self._launch_ex, rows, len(launches))
        if self.tracer is not None:
            for la in launches[:done]:
                self.tracer.on_launch(la.kernel, la.label)
        if err:
            raise _error(D.CUresult(err), f"cuLaunchKernelEx({launches[done].kernel})")

    def preload(self) -> None:
        from ..kernels import KERNELS
        for name in KERNELS:
            self._function(name)

    def _function(self, name: str):
        fn = self._functions.get(name)
        if fn is None:
            t0 = time.monotonic_ns()
            fn = self._load_function(name)
            self.kernel_load_ns += time.monotonic_ns() - t0
        return fn

    def _load_function(self, name: str):
        """Compile (or read from the cache) and load the kernel's module, then its function."""
        fn = self._functions.get(name)
        if fn is None:
            stem = self.compiler.file_for(name)
            mod = self._modules.get(stem)
            if mod is None:
                image = np.frombuffer(self.compiler.cubin(stem), np.uint8).copy()   # alive for the call
                mod = self._modules[stem] = _check(D.cuModuleLoadData(image.ctypes.data), "cuModuleLoadData")
            fn = self._functions[name] = _check(D.cuModuleGetFunction(mod, name.encode()), "cuModuleGetFunction")
        return fn

    # memory
    def mem_alloc(self, nbytes: int) -> int:
        err, ptr = D.cuMemAlloc(max(int(nbytes), 1))
        if err == D.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise OutOfDeviceMemory(int(nbytes), "cuMemAlloc")
        _check((err,), "cuMemAlloc")
        self._owned["mem"][int(ptr)] = ptr
        return int(ptr)

    def copies_prepare(self, items: list[tuple[int, np.ndarray]]) -> object:
        """Several copies become one cuMemcpyBatchAsync (arguments built once): a driver call costs more
        from Python than the copy of a few bytes. Falls back to one copy per item where the driver
        refuses batches (`batch_copies_error` then says why)."""
        if len(items) < 2 or self.batch_copies_error is not None:
            return _Copies([(int(d), _contiguous(s).ctypes.data, int(s.nbytes)) for d, s in items],
                           [s for _, s in items])
        attr = D.CUmemcpyAttributes()
        attr.srcAccessOrder = D.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        attr.srcLocHint.type = D.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
        attr.dstLocHint.type = D.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        attr.dstLocHint.id = self.device
        args = ([D.CUdeviceptr(int(d)) for d, _ in items], [D.CUdeviceptr(s.ctypes.data) for _, s in items],
                [int(s.nbytes) for _, s in items], len(items), [attr], [0], 1)
        return _CopyBatch(args, list(items))

    def copies_issue(self, prepared, stream) -> None:
        if type(prepared) is _Copies:
            for dst, src, nbytes in prepared.calls:
                _check(D.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")
            return
        if not isinstance(prepared, _CopyBatch):
            return super().copies_issue(prepared, stream)
        if self.batch_copies_error is None:
            err = D.cuMemcpyBatchAsync(*prepared.args, stream)[0]
            if not err:
                return
            self.batch_copies_error = f"cuMemcpyBatchAsync: {_error(err, 'cuMemcpyBatchAsync')}"
        super().copies_issue(prepared.items, stream)

    def host_alloc(self, nbytes: int) -> np.ndarray:
        nbytes = max(int(nbytes), 1)
        ptr = _check(D.cuMemHostAlloc(nbytes, 0), "cuMemHostAlloc")
        self._owned["host"][int(ptr)] = ptr
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(int(ptr)))

    def mem_free(self, addr: int) -> None:
        _check(D.cuMemFree(self._disown("mem", addr)), "cuMemFree")

    def mem_get_info(self) -> tuple[int, int]:
        free, total = _check(D.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def memcpy_htod(self, dst: int, src: np.ndarray, stream=None) -> None:
        src = _contiguous(src)
        if stream is None:
            _check(D.cuMemcpyHtoD(dst, src.ctypes.data, src.nbytes), "cuMemcpyHtoD")
        else:
            _check(D.cuMemcpyHtoDAsync(dst, src.ctypes.data, src.nbytes, stream), "cuMemcpyHtoDAsync")

    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream=None) -> None:
        dst = _contiguous(dst)
        if stream is None:
            _check(D.cuMemcpyDtoH(dst.ctypes.data, src, dst.nbytes), "cuMemcpyDtoH")
        else:
            _check(D.cuMemcpyDtoHAsync(dst.ctypes.data, src, dst.nbytes, stream), "cuMemcpyDtoHAsync")

    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        if stream is None:
            _check(D.cuMemcpyDtoD(dst, src, nbytes), "cuMemcpyDtoD")
        else:
            _check(D.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")

    def memset_d8(self, dst: int, value: int, nbytes: int, stream=None) -> None:
        if stream is None:
            _check(D.cuMemsetD8(dst, value, nbytes), "cuMemsetD8")
        else:
            _check(D.cuMemsetD8Async(dst, value, nbytes, stream), "cuMemsetD8Async")

    def close(self) -> None:
        """Wait for the device, then release everything this driver created, and the primary context: every
        release tried even when one fails (a sticky error fails them all), the first failure raised once
        all were."""
        if self._closed:
            return
        self._closed = True
        first = [None]                # (status, call) of the first release that failed: raised once all were tried

        def tried(result: tuple, call: str) -> None:
            if result[0] and first[0] is None:
                first[0] = (result[0], call)
        tried(D.cuCtxSynchronize(), "cuCtxSynchronize")
        for kind, destroy in (("exec", D.cuGraphExecDestroy), ("graph", D.cuGraphDestroy),
                              ("event", D.cuEventDestroy), ("stream", D.cuStreamDestroy), ("mem", D.cuMemFree),
                              ("host", D.cuMemFreeHost)):
            for h in self._owned[kind].values():
                tried(destroy(h), getattr(destroy, "__name__", kind))
            self._owned[kind].clear()
        for mod in self._modules.values():
            tried(D.cuModuleUnload(mod), "cuModuleUnload")
        self._modules.clear()
        self._functions.clear()
        self._configs.clear()
        tried(D.cuDevicePrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")
        if first[0] is not None:
            raise _error(*first[0])

    # several devices (a layer split): the context made current around work, peer access, copies between them
    def make_current(self) -> None:
        _check(D.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def can_access_peer(self, other: "CudaDriver") -> bool:
        """Whether this device can map `other`'s memory (cuDeviceCanAccessPeer)."""
        return bool(_check(D.cuDeviceCanAccessPeer(self._dev, other._dev), "cuDeviceCanAccessPeer"))

    def enable_peer_access(self, other: "CudaDriver") -> None:
        """Let this device's context reach `other`'s memory (cuCtxEnablePeerAccess, this context current);
        access already enabled (a primary context shared in the process) is not an error."""
        self.make_current()
        (err,) = D.cuCtxEnablePeerAccess(other._ctx, 0)
        if err and _err_name(err) != "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED":
            raise _error(err, "cuCtxEnablePeerAccess")

    def memcpy_peer(self, dst: int, src_driver: "CudaDriver", src: int, nbytes: int, stream=None) -> None:
        """Copy nbytes from `src` on src_driver's device to `dst` on this one, ordered on `stream` (this
        device's); direct where peer access is enabled, staged by the driver otherwise."""
        _check(D.cuMemcpyPeerAsync(dst, self._ctx, src, src_driver._ctx, nbytes, self._s(stream)),
               "cuMemcpyPeerAsync")

    def __enter__(self) -> "CudaDriver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # helpers
    def _s(self, stream):
        return self._null_stream if stream is None else stream

    def _own(self, kind: str, handle):
        self._owned[kind][int(handle)] = handle
        return handle

    def _disown(self, kind: str, handle):
        return self._owned[kind].pop(int(handle), handle)

    def _describe_node(self, graph, addr: int) -> str:
        """'node 3 of 12: kernel rms_norm_f32' for the node the driver blamed (a node of `graph`)."""
        node = D.CUgraphNode(addr)
        try:
            _, nodes, n = D.cuGraphGetNodes(graph, self.graph_num_nodes(graph))
            index = next((i for i, x in enumerate(nodes[:n]) if int(x) == addr), None)
            kind = _check(D.cuGraphNodeGetType(node), "cuGraphNodeGetType")
            text = kind.name.removeprefix("CU_GRAPH_NODE_TYPE_").lower()
            if kind == D.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                fn = _check(D.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams").func
                fname = _check(D.cuFuncGetName(fn), "cuFuncGetName")
                text += " " + (fname.decode() if isinstance(fname, bytes) else str(fname))
            return f"node {index} of {n}: {text}" if index is not None else text
        except Exception as exc:   # a description is a courtesy; never let it mask the refusal
            return f"node {addr:#x} (not described: {exc})"


def graph_kernel_names(graph) -> list[str]:
    """The kernel function of each kernel node of a CUDA graph (a CUgraph or its address), in cuGraphGetNodes
    order: graphdiag's own captures and, in-process, llama.cpp's (parity diagnostics)."""
    g = graph if isinstance(graph, D.CUgraph) else D.CUgraph(int(graph))
    n = int(_check(D.cuGraphGetNodes(g, 0), "cuGraphGetNodes")[1])
    _, nodes, n = D.cuGraphGetNodes(g, n)
    names = []
    for node in nodes[:n]:
        if _check(D.cuGraphNodeGetType(node), "cuGraphNodeGetType") != D.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
            continue
        fn = _check(D.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams").func
        name = _check(D.cuFuncGetName(fn), "cuFuncGetName")
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return names


def device_count() -> int:
    """CUDA devices visible to this process; NoDeviceError (one line) without cuda-python, driver or GPU."""
    if D is None:
        raise NoDeviceError("CUDA backend unavailable: cuda-python (cuda.bindings) is not installed")
    try:
        (err,) = D.cuInit(0)
    except Exception as exc:   # cuda.pathfinder's DynamicLibNotFoundError when libcuda is absent
        raise NoDeviceError(f"no CUDA driver: {str(exc).splitlines()[0]}") from exc
    if err:
        raise NoDeviceError(f"no usable CUDA driver: cuInit returned {_err_name(err)}")
    err, count = D.cuDeviceGetCount()
    if err or count == 0:
        raise NoDeviceError("no CUDA device: the driver reports 0 devices")
    return int(count)


def device_identity(device: int = 0) -> tuple[str, int]:
    """(name, compute capability as major*10 + minor) of `device` without opening a context (graphdiag
    llama's up-front GPU check); NoDeviceError (one line) without one."""
    count = device_count()
    if not 0 <= device < count:
        raise NoDeviceError(f"no CUDA device {device}: the driver reports {count}")
    info = _device_info(_check(D.cuDeviceGet(device), "cuDeviceGet"))
    return info.name, info.compute_capability[0] * 10 + info.compute_capability[1]


def _device_info(dev) -> DeviceInfo:
    name = _check(D.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0", 1)[0].decode()
    attr = D.CUdevice_attribute
    major = _check(D.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
    minor = _check(D.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
    total = _check(D.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
    nsm = _check(D.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute")
    return DeviceInfo(name, (int(major), int(minor)), int(total), simulated=False, multiprocessors=int(nsm))


def _contiguous(a: np.ndarray) -> np.ndarray:
    """Host buffers are copied as raw bytes: they must be C-contiguous (a hidden copy could die before an
    asynchronous copy reads it)."""
    if not a.flags.c_contiguous:
        raise ValueError("host buffer must be C-contiguous")
    return a

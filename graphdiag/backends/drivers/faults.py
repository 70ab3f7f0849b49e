"""Faults a user can rehearse: one driver call of a step made to fail as the driver would fail it.

A scenario's `{ at_step = N, fault = KIND }` arms KIND for step N on every driver of the run. The first call
of that kind in the step fails at the driver-call boundary with the result the CUDA driver documents for it
(never by corrupting device memory), on the real driver and the simulated one alike:

    launch       cuLaunchKernelEx / cuGraphLaunch CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (not sticky)
    capture      cuStreamEndCapture               CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (the capture is
                                                  really ended and its graph destroyed first)
    instantiate  cuGraphInstantiate               CUDA_ERROR_OUT_OF_MEMORY
    update       cuGraphExecUpdate                CUDA_ERROR_INVALID_VALUE (an error, not a refusal: ggml
                                                  re-instantiates only on CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
    oom          cuMemAlloc                       CUDA_ERROR_OUT_OF_MEMORY

Arming shadows the driver's bound method on the instance until it fires or the step ends, so a step with no
fault armed calls the driver exactly as before (nothing is wrapped on the hot path).
"""

from __future__ import annotations

from typing import Callable

from ...errors import CaptureError, CudaError, OutOfDeviceMemory

# kind -> ((driver method, the CUDA call it stands for), ...), the error's result name
FAULTS: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    "launch": ((("launch", "cuLaunchKernelEx"), ("launch_batch", "cuLaunchKernelEx"),
                ("graph_launch", "cuGraphLaunch")),
               "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    "capture": ((("end_capture", "cuStreamEndCapture"),), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
    "instantiate": ((("instantiate", "cuGraphInstantiate"),), "CUDA_ERROR_OUT_OF_MEMORY"),
    "update": ((("exec_update", "cuGraphExecUpdate"),), "CUDA_ERROR_INVALID_VALUE"),
    "oom": ((("mem_alloc", "cuMemAlloc"),), "CUDA_ERROR_OUT_OF_MEMORY"),
}
FAULT_KINDS = tuple(FAULTS)

# results after which a CUDA context cannot be used again (every later call returns them): a step that
# fails with one cannot be recovered from, the run ends
STICKY = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_DEINITIALIZED",
})


def recoverable(error: BaseException) -> bool:
    """Whether a step that failed with `error` can be rolled back and the run go on: a CUDA error that
    leaves the context usable. Anything else (a sticky CUDA error, a bug, Ctrl-C) ends the run."""
    return isinstance(error, CudaError) and error.name not in STICKY


def calls_of(kind: str) -> str:
    """The CUDA calls a fault of `kind` waits for ("cuLaunchKernelEx / cuGraphLaunch")."""
    return " / ".join(dict.fromkeys(call for _, call in FAULTS[kind][0]))


class FaultInjector:
    """Arms one fault for one step over a run's drivers; `on_fire(kind, call, error_name)` is told when it
    fires (before the error is raised)."""

    def __init__(self, drivers: list, on_fire: Callable[[str, str, str], None]):
        self.drivers = [d for d in drivers if d is not None]
        self.on_fire = on_fire
        self.kind = ""
        self.fired = False
        self._armed: list[tuple[object, str]] = []

    def arm(self, kind: str) -> None:
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}")
        self.disarm()
        self.kind, self.fired = kind, False
        methods, _ = FAULTS[kind]
        for d in self.drivers:
            for name, call in methods:
                setattr(d, name, self._failing(d, name, call))
                self._armed.append((d, name))

    def disarm(self) -> bool:
        """Remove what is still armed; returns whether the fault fired."""
        self._unshadow()
        fired, self.kind, self.fired = self.fired, "", False
        return fired

    def _unshadow(self) -> None:
        for d, name in self._armed:
            d.__dict__.pop(name, None)
        self._armed = []

    def _failing(self, driver, name: str, call: str):
        real = getattr(driver, name)         # the bound method, before it is shadowed
        kind, result = self.kind, FAULTS[self.kind][1]

        def failing(*args, **kw):
            self._unshadow()                 # one call fails; the rest of the step runs as it would
            self.fired = True
            self.on_fire(kind, call, result)
            raise _error(kind, call, result, real, args)
        return failing


def _error(kind: str, call: str, result: str, real, args: tuple) -> CudaError:
    detail = f"injected fault {kind!r}"
    if kind == "capture":
        # the capture really ends (the stream leaves capture mode, as after an invalidated capture) and
        # what it recorded is dropped: the caller gets the error and nothing to destroy
        driver = real.__self__
        driver.graph_destroy(real(*args))
        return CaptureError(result, call, detail)
    if kind == "oom":
        nbytes = int(args[0]) if args else 0
        err = OutOfDeviceMemory(nbytes, call)
        err.args = (f"{err.args[0]}; {detail}",)
        return err
    return CudaError(result, call, detail)

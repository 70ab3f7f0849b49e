"""The one error hierarchy. Only the CLI entry turns these into messages and exit codes."""

from __future__ import annotations


class GraphdiagError(Exception):
    """Base of every error graphdiag reports to a user. `exit_code` is what the CLI exits with."""

    exit_code = 2


class UsageError(GraphdiagError):
    """Bad flags or settings."""


class ScenarioError(GraphdiagError):
    """A scenario file that cannot be read or is malformed (the message names file and line)."""


class EventFileError(GraphdiagError):
    """A JSON-lines event record that is truncated, corrupt or from another tool."""


class NoDeviceError(GraphdiagError):
    """A CUDA backend was asked for where there is no usable GPU or driver."""


class CudaError(GraphdiagError):
    """A CUDA driver/NVRTC call failed. `name` is the driver's result name (e.g. CUDA_ERROR_INVALID_VALUE)."""

    def __init__(self, name: str, call: str = "", detail: str = ""):
        self.name = name
        self.call = call
        msg = f"{call}: {name}" if call else name
        super().__init__(f"{msg} ({detail})" if detail else msg)


class OutOfDeviceMemory(CudaError):
    """An allocation the device could not satisfy (CUDA_ERROR_OUT_OF_MEMORY)."""

    def __init__(self, nbytes: int, call: str = "mem_alloc"):
        self.nbytes = nbytes
        super().__init__("CUDA_ERROR_OUT_OF_MEMORY", call, f"{nbytes} bytes")


class CaptureError(CudaError):
    """Stream capture was invalidated or ended illegally (CUDA_ERROR_STREAM_CAPTURE_*)."""


class WatchError(GraphdiagError):
    """CUPTI would not let graphdiag watch llama.cpp's graph calls (another subscriber, no CUPTI)."""


class KernelCompileError(GraphdiagError):
    """NVRTC rejected a kernel file; the message carries the file and NVRTC's log."""


INTERNAL_EXIT = 3     # a bug in graphdiag (or a broken llama.cpp invariant), never bad input
INTERRUPTED_EXIT = 130  # Ctrl-C (128 + SIGINT)
TERMINATED_EXIT = 143   # SIGTERM (128 + 15)


class InternalError(GraphdiagError):
    """A broken invariant: what llama.cpp would GGML_ASSERT/abort on (e.g. uid hit with another node count).
    Reported like any unexpected exception: as a bug, with its own exit code."""

    exit_code = INTERNAL_EXIT


class EventWriteError(GraphdiagError):
    """The JSON-lines record could not be written (missing directory, full disk, no permission)."""


class RunInterrupted(GraphdiagError):
    """The run was stopped (Ctrl-C, or SIGTERM: `terminated`) at `step`; the summary so far was printed and
    the record says so."""

    exit_code = INTERRUPTED_EXIT

    def __init__(self, step: int, terminated: bool = False):
        self.step = step
        if terminated:
            self.exit_code = TERMINATED_EXIT
        super().__init__(f"{'terminated (SIGTERM)' if terminated else 'interrupted'} at step {step}")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised by the run's handler (interrupts.terminate_as_interrupt): a KeyboardInterrupt, so
    the run ends through the same paths as after Ctrl-C."""


class VerifyMismatch(GraphdiagError):
    """A replayed step computed something different from eager (--verify)."""

    exit_code = 1


class EndpointError(GraphdiagError):
    """`graphdiag load`: the server is not there (refused, unreachable, timed out) or is not a streaming
    completions endpoint (an HTTP error, not server-sent events)."""


class TraceError(GraphdiagError):
    """`graphdiag trace` cannot trace CMD: not found or not executable, no compiler, no CUPTI, no GPU."""

"""What each time figure of a run is, by driver, and the names every view gives it (summary, JSON, diff,
steps table, plot, bench): one place, so no view calls a simulated figure a GPU time.

On CUDA, "gpu" figures are CUDA events around the GPU splits and the device's busy time is CUPTI's.
On the simulated driver the kernels are numpy, run by the host inside the driver calls: the "gpu" figure
(StepFinished.gpu_ns, bench's replay_gpu_ms) is the host's time between two events, i.e. numpy's, and the
device timeline (busy, idle, top kernels) is MODELLED (fixed costs per launch and node). Views read the
record header's `simulated` flag, so `report` and `diff` of a simulated record say so as the live run does.
"""

from __future__ import annotations

GPU_TIME_CUDA = "cuda events"
GPU_TIME_SIM = "numpy host time"
STEP_GPU = "step gpu"


def simulated_timings(header) -> bool:
    """Whether the run's GPU figures come from the simulated driver (a RunHeader or its dict)."""
    get = header.get if isinstance(header, dict) else lambda k, d=None: getattr(header, k, d)
    return bool(get("simulated", False)) and get("backend", "") != "cpu"


def gpu_time_source(header) -> str:
    """What StepFinished.gpu_ns measured: "cuda events", "numpy host time" (simulated), or "" (CPU
    backend: no GPU split)."""
    get = header.get if isinstance(header, dict) else lambda k, d=None: getattr(header, k, d)
    if get("backend", "") == "cpu":
        return ""
    return GPU_TIME_SIM if simulated_timings(header) else GPU_TIME_CUDA


def timing_name(name: str, simulated: bool) -> str:
    """A timing's displayed name: "step gpu" says what it is on the simulated driver."""
    return f"{STEP_GPU} ({GPU_TIME_SIM})" if simulated and name == STEP_GPU else name


def gpu_column(simulated: bool) -> str:
    """The steps table's column of StepFinished.gpu_ns."""
    return "gpu (numpy)" if simulated else "gpu"


def gpu_phrase(simulated: bool) -> str:
    """How an event line names a step's GPU time: '(gpu 1.2 ms)', '(numpy host 150 ms)' on the sim."""
    return "numpy host" if simulated else "gpu"


def device_label(what: str, source: str) -> str:
    """'dev busy' as 'dev busy (modelled)' when the device timeline is the simulated driver's."""
    return f"{what} (modelled)" if source == "modelled" else what

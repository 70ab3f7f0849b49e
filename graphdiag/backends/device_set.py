"""The devices of a layer split (--devices N): one driver and one GPU backend per device, and the links
between them.

Each device has its own backend, hence its own graph runtime (graph cache, warmup, ledger), temporary pool
and streams: a second device is a second backend instance, never a special case inside the runtime. The
simulated driver models N devices (labelled so; their memories lie apart, as CUDA's unified addresses). On
CUDA the first N visible devices are used, each on its primary context, made current around every driver
call (`CurrentContext`). Split inputs cross between devices directly where peer access can be enabled
(cuDeviceCanAccessPeer, cuCtxEnablePeerAccess; then cuMemcpyPeerAsync on the reading device's stream),
through the host otherwise (read back, written to the other device); each choice is a PeerLink event.
GGML_CUDA_GRAPH_OPT's concurrent streams: at d99724f2 they needed exactly one visible CUDA device; at
0c1e57098 each device's backend optimises its own splits. Simulated devices are all visible to each other.
"""

from __future__ import annotations

import contextlib

from .. import events as E
from ..errors import NoDeviceError, UsageError
from ..release import releasing
from .gpu.backend import GpuBackend, GpuTimes

MAX_SIM_DEVICES = 8


class CurrentContext:
    """A CUDA driver whose context is made current before each call (cuCtxSetCurrent), only when another
    device's was: several devices share one host thread, as llama.cpp's ggml_cuda_set_device."""

    _current: list = [None]                 # the driver whose context is current in this process

    def __init__(self, driver):
        object.__setattr__(self, "_driver", driver)

    def __getattr__(self, name):
        attr = getattr(self._driver, name)
        if not callable(attr) or name == "make_current":
            return attr
        driver, current = self._driver, self._current

        def call(*args, **kw):
            if current[0] is not driver:
                driver.make_current()
                current[0] = driver
            return attr(*args, **kw)
        object.__setattr__(self, name, call)   # bound once: later calls skip __getattr__
        return call

    def __setattr__(self, name, value) -> None:   # tracer, activity: the driver's own attributes
        setattr(self._driver, name, value)


def check_devices(cfg) -> None:
    """What opening the drivers would refuse, said before any work starts (bench steps, ahead of its rows):
    --backend cuda without a usable GPU, more devices than CUDA shows or than the simulator models."""
    if cfg.backend == "cpu":
        return
    if cfg.backend in ("auto", "cuda"):
        from .drivers import cuda
        try:
            count = cuda.device_count()
        except NoDeviceError:
            if cfg.backend == "cuda":
                raise
        else:
            if count < cfg.devices:
                raise _too_few_cuda(cfg.devices, count)
            return
    if cfg.devices > MAX_SIM_DEVICES:
        raise _too_many_simulated(cfg.devices)


def _too_few_cuda(n: int, count: int) -> UsageError:
    return UsageError(f"devices {n}: this machine shows {count} CUDA device{'s' * (count != 1)} "
                      f"(CUDA_VISIBLE_DEVICES); use --backend sim to simulate {n}")


def _too_many_simulated(n: int) -> UsageError:
    return UsageError(f"devices {n}: the simulated driver models at most {MAX_SIM_DEVICES} devices")


def open_drivers(cfg, cache_dir=None) -> tuple[list, str]:
    """(one driver per device, note) for --devices N > 1; UsageError before anything is built when N
    exceeds the devices present. cache_dir: where CUDA drivers cache compiled kernels (handed down from
    config.kernel_cache_dir(); None: no disk cache)."""
    n = cfg.devices
    if cfg.backend in ("auto", "cuda"):
        from .drivers import cuda
        try:
            count = cuda.device_count()
        except NoDeviceError as e:
            if cfg.backend == "cuda":
                raise
            note = f"no GPU ({e}); using the SIMULATED driver"
        else:
            if count < n:
                raise _too_few_cuda(n, count)
            drivers = []
            try:
                for i in range(n):
                    drivers.append(CurrentContext(cuda.CudaDriver.open(i, cache_dir=cache_dir)))
            except BaseException:
                for d in drivers:
                    d.close()
                raise
            return drivers, ""
    else:
        note = ""
    if n > MAX_SIM_DEVICES:
        raise _too_many_simulated(n)
    from ..sim_mode import sim_mode
    from .drivers.sim import SimDriver
    compute = sim_mode(cfg) == "compute"
    return [SimDriver(compute_capability=cfg.cc_tuple, name=f"simulated GPU {i}", device=i, compute=compute)
            for i in range(n)], note


class DeviceSet:
    """The GPU backends of a layer split, device order; `copy` moves a split input between two of them."""

    def __init__(self, drivers: list, make_backend):
        self.drivers = drivers
        self.gpus: list[GpuBackend] = []
        for i, d in enumerate(drivers):
            gpu = make_backend(d, f"{'SIM' if d.simulated else 'CUDA'}{i}")
            gpu.runtime.device, gpu.n_devices = i, len(drivers)
            if d.simulated:
                d.n_visible = len(drivers)
            self.gpus.append(gpu)
        self.links = self._link()

    def _link(self) -> dict[tuple[int, int], tuple[str, str]]:
        """(src, dst) -> (mode, reason) for every ordered pair of devices, peer access enabled where it can be."""
        links = {}
        for dst, dd in enumerate(self.drivers):
            for src, sd in enumerate(self.drivers):
                if src == dst:
                    continue
                sim = "simulated " if dd.simulated else ""
                if dd.can_access_peer(sd):
                    dd.enable_peer_access(sd)
                    links[src, dst] = ("peer", "simulated peer access" if dd.simulated else "cuCtxEnablePeerAccess")
                else:
                    links[src, dst] = ("host", f"{sim}cuDeviceCanAccessPeer: no")
        return links

    def announce(self, bus: E.EventBus, split) -> None:
        """The layout and the links, as events (after the run header)."""
        names = tuple(d.info.name for d in self.drivers)
        bus.emit(E.DeviceLayout(names=names, layers=split.layers, split_points=split.points,
                                shares_from=split.shares_from, simulated=self.drivers[0].simulated))
        for (src, dst), (mode, reason) in sorted(self.links.items()):
            bus.emit(E.PeerLink(device=src, to_device=dst, mode=mode, reason=reason))

    def free_memory(self) -> list[int]:
        """Free bytes per device (llama.cpp's default shares)."""
        return [d.mem_get_info()[0] for d in self.drivers]

    def copy(self, src, dst, src_be, dst_be) -> bool:
        """A split input between two devices with peer access: the producer's work finished, then one peer
        copy on the reader's stream (before the split's kernels). False: the host path is the caller's."""
        if not (src_be.is_gpu and dst_be.is_gpu) or src_be is dst_be:
            return False
        a, b = src_be.runtime.device, dst_be.runtime.device
        if self.links.get((a, b), ("host",))[0] != "peer":
            return False
        src_be.synchronize()
        dst_be.driver.memcpy_peer(dst.data, src_be.driver, src.data, src.nbytes(), dst_be.stream0)
        return True

    def close(self) -> None:
        """Every device's backend, then every driver: each tried, the first error raised once all were."""
        with releasing() as release:
            for gpu in reversed(self.gpus):
                release(gpu.close)
            for d in reversed(self.drivers):
                release(d.close)


class GpuGroup:
    """What the runner asks of "the GPU" when there are several: GPU time summed, eager recompute on all."""

    def __init__(self, gpus: list[GpuBackend]):
        self.gpus = gpus

    def take_gpu_time(self) -> GpuTimes:
        return GpuTimes([g.take_gpu_time() for g in self.gpus])

    def collect_gpu_ns(self) -> int:
        return self.take_gpu_time().read()

    @contextlib.contextmanager
    def verifying(self):
        with contextlib.ExitStack() as stack:
            for g in self.gpus:
                stack.enter_context(g.verifying())
            yield

    def close(self) -> None:
        """The DeviceSet closes the backends (and their drivers)."""

"""The temporary-buffer pool, modelled on ggml_cuda_pool_leg (0c1e57098).

As upstream, an allocation that fails synchronises, frees every cached buffer and retries once, and a free
that cannot be cached because the pool is full really frees the buffer. Captured graphs still hold pool
addresses, and upstream does nothing about them. The design article adds a rule upstream does not have:
whenever the pool's addresses may change, every captured graph of the context is invalidated (its
`invalidate_cuda_graphs`); `invalidate` is given only when a run asks for that rule (--pool-invalidation).
`cap` (bytes the pool may hold) and `max_buffers` (cache slots) are run options so scenarios can force both.
"""

from __future__ import annotations

from typing import Callable

from ...errors import OutOfDeviceMemory
from ...release import releasing
from ..drivers.base import Driver

LOOK_AHEAD = 1.05   # ggml over-allocates new pool buffers by 5 % so slightly larger requests still fit


class TempPool:
    def __init__(self, driver: Driver, invalidate: Callable[[str, int], None] | None, cap: int | None = None,
                 max_buffers: int = 256):
        self.driver = driver
        self.invalidate = invalidate          # invalidate(reason, nbytes); None: upstream's pool (no invalidation)
        self.cap = cap
        self.max_buffers = max_buffers
        self.cached: list[tuple[int, int]] = []   # (addr, size) free buffers kept for reuse
        self.pool_size = 0                        # bytes allocated from the device (cached + in use)
        self.n_device_allocs = 0
        self.on_alloc: Callable[[int], None] | None = None   # told of every new device buffer
        self.on_free: Callable[[int], None] | None = None    # and of every buffer really freed
        self.before_flush: Callable[[], None] | None = None  # told before the pool frees device memory

    def alloc(self, size: int) -> tuple[int, int]:
        """(addr, actual size) of a buffer of at least `size` bytes: best fit from the cache, else new."""
        best = None
        for k, (addr, sz) in enumerate(self.cached):
            if sz >= size and (best is None or sz < self.cached[best][1]):
                best = k
        if best is not None:
            return self.cached.pop(best)
        want = max(int(size * LOOK_AHEAD + 255) // 256 * 256, 256)
        try:
            return self._device_alloc(want)
        except OutOfDeviceMemory:
            if self.before_flush is not None:
                self.before_flush()
            self.driver.synchronize()
            freed = self.clear()
            if self.invalidate is not None:
                self.invalidate("alloc failure", freed)
            return self._device_alloc(want)       # a second failure propagates: truly out of memory

    def reuse(self, size: int) -> int | None:
        """alloc(size) and free() of what it returns, at once, where a cached buffer fits: its address, the
        cache left as those two calls leave it (the buffer moved to the end). None, touching nothing, where
        alloc would go to the device (the caller then calls alloc and free itself). An eager run's scratch
        launches only stage their buffer (ScratchLaunchesOp.stage): one call where two cost an eager 1b Q8_0
        step about 40 us of host time on its 113 scratch ops."""
        cached = self.cached
        best, best_size = -1, 0
        for k, (_, sz) in enumerate(cached):
            if sz >= size and (best < 0 or sz < best_size):
                best, best_size = k, sz
        if best < 0:
            return None
        item = cached[best]
        if best != len(cached) - 1:
            del cached[best]
            cached.append(item)
        return item[0]

    def free(self, addr: int, size: int) -> None:
        if len(self.cached) < self.max_buffers:
            self.cached.append((addr, size))
            return
        if self.before_flush is not None:
            self.before_flush()
        self._device_free(addr)
        self.pool_size -= size
        if self.invalidate is not None:
            self.invalidate("free into full pool", size)

    def clear(self) -> int:
        """Free every cached buffer (each tried: the first error raised once all were); returns the bytes freed."""
        freed = 0
        with releasing() as release:
            for addr, sz in self.cached:
                release(self._device_free, addr)
                freed += sz
            self.pool_size -= freed
            self.cached.clear()
        return freed

    def _device_alloc(self, size: int) -> tuple[int, int]:
        if self.cap is not None and self.pool_size + size > self.cap:
            raise OutOfDeviceMemory(size, "pool alloc (capped)")
        addr = self.driver.mem_alloc(size)
        if self.on_alloc is not None:
            self.on_alloc(addr)
        self.pool_size += size
        self.n_device_allocs += 1
        return addr, size

    def _device_free(self, addr: int) -> None:
        self.driver.mem_free(addr)
        if self.on_free is not None:
            self.on_free(addr)

    def close(self) -> None:
        self.clear()

"""Address spaces backed by numpy: host memory for the CPU backend, device memory for the simulated driver.

Addresses are plain ints (like `data` pointers). Each allocation is one numpy byte buffer (none when the
space is only reserved: the simulator's decisions-only mode); lookups go through a sorted list of bases. `ndarray()` gives a strided numpy view for a ggml (type, ne, nb) at an address.
"""

from __future__ import annotations

import bisect

import numpy as np

from .errors import OutOfDeviceMemory
from .ir.dtypes import GGMLType, NUMPY, Q8_0_BLOCK, QK8_0, block_size
from .quants.layouts import BLOCK_DTYPE as _DTYPES

ALIGN = 256


def aligned(n: int) -> int:
    """n bytes rounded up to the buffer alignment (the block a tensor of n bytes occupies)."""
    return (n + ALIGN - 1) // ALIGN * ALIGN



class UnmappedAccess(ValueError):
    """A read or write of bytes no live allocation holds (e.g. memory freed since a graph captured its
    address): the simulated driver reports it as the device would, an illegal address."""

class AddressSpace:
    """Allocations at increasing addresses from `base`; `capacity` bytes in all (None = unbounded).

    `materialised=False` reserves the addresses and counts the bytes (the same addresses, `used` and
    capacity checks as a materialised space) but keeps no bytes behind them: reading one is a bug.

    `granule` (the simulated device's): each allocation reserves whole granules of addresses (its bytes and
    the gap rounded up), and a freed range is handed out again, the lowest one that fits first, as
    cuMemAlloc does: on the H200 an allocation of 545 KiB after freeing one of 500 KiB came back at the
    freed base (driver 580, both inside one 2 MiB granule). A compute buffer that ggml-alloc grows therefore
    keeps its address when the larger size still fits its granules, and a captured graph stays valid. Without
    a granule (the host), addresses only increase."""

    def __init__(self, base: int, capacity: int | None = None, name: str = "host", materialised: bool = True,
                 granule: int | None = None):
        self.name = name
        self.base = base
        self.capacity = capacity
        self.materialised = materialised
        self.granule = granule
        self.next = base
        self.used = 0
        self._bases: list[int] = []
        self._sizes: dict[int, int] = {}
        self._bufs: dict[int, np.ndarray] = {}
        self._extents: dict[int, int] = {}          # granule spaces: address -> reserved bytes
        self._holes: list[tuple[int, int]] = []     # granule spaces: freed (address, bytes), sorted, coalesced

    def _reserve(self, nbytes: int) -> int:
        """The address of a new allocation of nbytes (a gap behind it: overruns never alias a neighbour)."""
        if self.granule is None:
            addr = self.next
            self.next += (nbytes + ALIGN - 1) // ALIGN * ALIGN + ALIGN
            return addr
        extent = -(-(nbytes + ALIGN) // self.granule) * self.granule
        for i, (a, n) in enumerate(self._holes):
            if n >= extent:
                if n == extent:
                    del self._holes[i]
                else:
                    self._holes[i] = (a + extent, n - extent)
                self._extents[a] = extent
                return a
        addr = self.next
        self.next += extent
        self._extents[addr] = extent
        return addr

    def _release(self, addr: int) -> None:
        extent = self._extents.pop(addr, None)
        if extent is None:
            return
        i = bisect.bisect_left(self._holes, (addr, 0))
        self._holes.insert(i, (addr, extent))
        if i + 1 < len(self._holes) and addr + extent == self._holes[i + 1][0]:      # merge the next hole
            self._holes[i] = (addr, extent + self._holes.pop(i + 1)[1])
        if i > 0 and self._holes[i - 1][0] + self._holes[i - 1][1] == addr:          # and the previous one
            a, n = self._holes.pop(i - 1)
            self._holes[i - 1] = (a, n + self._holes[i - 1][1])

    def alloc(self, nbytes: int) -> int:
        nbytes = max(int(nbytes), 1)
        if self.capacity is not None and self.used + nbytes > self.capacity:
            raise OutOfDeviceMemory(nbytes)
        addr = self._reserve(nbytes)
        self._sizes[addr] = nbytes
        if self.materialised:
            self._bufs[addr] = np.zeros(nbytes, np.uint8)
        bisect.insort(self._bases, addr)
        self.used += nbytes
        return addr

    def free(self, addr: int) -> None:
        nbytes = self._sizes.pop(addr, None)
        if nbytes is None:
            raise ValueError(f"{self.name}: free of unknown address {addr:#x}")
        self._bufs.pop(addr, None)
        self._bases.pop(bisect.bisect_left(self._bases, addr))
        self.used -= nbytes
        self._release(addr)

    def owns(self, addr: int) -> bool:
        i = bisect.bisect_right(self._bases, addr) - 1
        return i >= 0 and addr < self._bases[i] + self._sizes[self._bases[i]]

    def locate(self, addr: int, nbytes: int = 0) -> tuple[np.ndarray, int]:
        """(buffer, offset) holding [addr, addr+nbytes)."""
        if not self.materialised:
            raise RuntimeError(f"{self.name}: memory is reserved, not materialised: nothing may read or write it")
        i = bisect.bisect_right(self._bases, addr) - 1
        if i < 0:
            raise UnmappedAccess(f"{self.name}: address {addr:#x} is not allocated")
        b = self._bases[i]
        buf = self._bufs[b]
        off = addr - b
        if off + nbytes > len(buf):
            raise UnmappedAccess(f"{self.name}: [{addr:#x}, +{nbytes}) runs past its allocation")
        return buf, off

    def bytes(self, addr: int, nbytes: int) -> np.ndarray:
        buf, off = self.locate(addr, nbytes)
        return buf[off : off + nbytes]

    def ndarray(self, addr: int, type_: int, ne, nb) -> np.ndarray:
        """A strided view, numpy axes outermost first: shape (ne3, ne2, ne1, ne0).

        A block type gives blocks: shape (ne3, ne2, ne1, ne0 // block) of its quants.BLOCK_DTYPE records
        (BF16 too: one record per element)."""
        t = GGMLType(int(type_))
        ne = [int(x) for x in ne]
        nb = [int(x) for x in nb]
        dtype = _DTYPES.get(t)
        if dtype is None:
            dtype = np.dtype(NUMPY[t])
        shape = (ne[3], ne[2], ne[1], ne[0] // block_size(t))
        strides = (nb[3], nb[2], nb[1], nb[0])
        if any(s == 0 for s in shape):
            return np.zeros(shape, dtype)
        extent = sum((n - 1) * s for n, s in zip(shape, strides)) + dtype.itemsize
        buf, off = self.locate(addr, extent)
        return np.ndarray(shape, dtype, buffer=buf, offset=off, strides=strides)


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """(..., nblocks) Q8_0 records -> (..., nblocks*32) float32."""
    d = blocks["d"].astype(np.float32)[..., None]
    q = blocks["qs"].astype(np.float32)
    return (d * q).reshape(*blocks.shape[:-1], blocks.shape[-1] * QK8_0)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """(..., n) float32 with n % 32 == 0 -> (..., n/32) Q8_0 records, halves rounded to even as rng_fill_q8_0
    rounds them (a preset's Q8_0 weights). ggml's quantize_row_q8_0_ref rounds halves away from zero: the two
    differ only where x / d is exactly k + 0.5; graphdiag.quants.quantize(x, Q8_0) is ggml's."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // QK8_0, QK8_0)
    amax = np.abs(blocks).max(axis=-1)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    out = np.zeros(blocks.shape[:-1], Q8_0_BLOCK)
    out["d"] = d.astype(np.float16)
    out["qs"] = np.round(blocks * inv[..., None]).clip(-127, 127).astype(np.int8)
    return out

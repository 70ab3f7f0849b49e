"""The strided numpy view of a kernel descriptor's tensor in simulated device memory (shared by the
simulated kernels: sim_kernels, sim_quants, sim_kernels_ops)."""

from __future__ import annotations

import numpy as np

from ..memory import AddressSpace
from .abi import Q8_1

Q8_1_BLOCK = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))])   # as sim_kernels.Q8_1_BLOCK


def view(space: AddressSpace, p: np.ndarray, slot: int) -> np.ndarray:
    """The strided view of descriptor t[slot]: shape (ne3, ne2, ne1, ne0) (Q8_0 / Q8_1: block records)."""
    d = p["t"][slot]
    if int(d["type"]) == Q8_1:
        ne, nb = [int(x) for x in d["ne"]], [int(x) for x in d["nb"]]
        shape, strides = (ne[3], ne[2], ne[1], ne[0] // 32), (nb[3], nb[2], nb[1], nb[0])
        extent = sum((n - 1) * st for n, st in zip(shape, strides)) + Q8_1_BLOCK.itemsize
        buf, off = space.locate(int(d["data"]), extent)
        return np.ndarray(shape, Q8_1_BLOCK, buffer=buf, offset=off, strides=strides)
    return space.ndarray(int(d["data"]), int(d["type"]), d["ne"], d["nb"])

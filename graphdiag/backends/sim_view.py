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


def expert_biases(space: AddressSpace, p: np.ndarray, slot: int, glu: bool) -> tuple:
    """The experts' biases fused into mul_mat_id_vec(_glu) (ADD_ID): None, or for the plain kernel the bias
    t[slot] (M, E), for the GLU one (gate bias, up bias): the up bias t[slot], the gate bias at the address
    ip[1] | ip[2] << 32 with t[slot]'s layout (the ABI's six descriptors are taken)."""
    if not int(p["t"][slot]["data"]):
        return None
    up = view(space, p, slot)
    if not glu:
        return up
    q = p.copy()
    q["t"][slot]["data"] = (int(p["ip"][1]) & 0xFFFFFFFF) | ((int(p["ip"][2]) & 0xFFFFFFFF) << 32)
    return view(space, q, slot), up

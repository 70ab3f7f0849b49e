"""The kernel ABI shared by the lowering, the simulated driver's numpy kernels and kernels/*.cu.

Every kernel has the signature ``extern "C" __global__ void NAME(const kparams p)`` where ``kparams`` is
passed by value and laid out exactly as KPARAMS below (see kernels/common.cuh):

    t[0]        destination tensor descriptor
    t[1..5]     source descriptors (src0, src1, ...; kernel-specific, documented in graphdiag.backends.kernels)
    ip[16]      int32 scalars (kernel-specific)
    fp[8]       float32 scalars (kernel-specific)

A descriptor holds the device address, the ggml type and ggml's ne/nb (elements / bytes, innermost first).
Packing one record per launch once, and reusing it, keeps launches allocation-free.
"""

from __future__ import annotations

import numpy as np

N_DESC = 6
Q8_1 = 9          # descriptor type of Q8_1 activations (quantize_q8_1's pool scratch; not a tensor type)
Q8_1_BYTES = 36   # one Q8_1 block: f16 d, f16 d * sum(q), 32 int8

TDESC = np.dtype([("data", "<u8"), ("type", "<i4"), ("pad", "<i4"), ("ne", "<i8", (4,)), ("nb", "<i8", (4,))])
KPARAMS = np.dtype([("t", TDESC, (N_DESC,)), ("ip", "<i4", (16,)), ("fp", "<f4", (8,))])
assert TDESC.itemsize == 80 and KPARAMS.itemsize == 576


def new_params() -> np.ndarray:
    """A zeroed 0-d KPARAMS record."""
    return np.zeros((), KPARAMS)


def set_desc(p: np.ndarray, slot: int, data: int, type_: int, ne, nb) -> None:
    d = p["t"][slot]
    d["data"] = data
    d["type"] = type_
    d["ne"] = ne
    d["nb"] = nb


def set_desc_from_record(p: np.ndarray, slot: int, rec) -> None:
    """Fill descriptor `slot` from an arena record (a ggml_tensor struct)."""
    d = p["t"][slot]
    d["data"] = rec["data"]
    d["type"] = rec["type"]
    d["ne"] = rec["ne"]
    d["nb"] = rec["nb"].astype(np.int64)

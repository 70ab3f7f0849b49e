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

from ..ir.arena import TENSOR_DTYPE

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


def params_from_bytes(buf: bytearray) -> np.ndarray:
    """The 0-d KPARAMS record over `buf` (KPARAMS.itemsize bytes, written in place)."""
    return np.frombuffer(buf, KPARAMS).reshape(())


# A descriptor's ne/nb sit at the same byte offsets as the struct's (nb u64 there, i64 here: the same bytes),
# so a descriptor is three byte copies out of a struct.
_T_DATA, _T_TYPE, _T_SHAPE = (TDESC.fields[f][1] for f in ("data", "type", "ne"))
_S_DATA, _S_TYPE, _S_SHAPE = (TENSOR_DTYPE.fields[f][1] for f in ("data", "type", "ne"))
_SHAPE_BYTES = 64
assert _T_SHAPE == _S_SHAPE and TENSOR_DTYPE.fields["nb"][1] == TDESC.fields["nb"][1] == _S_SHAPE + 32


def set_desc_from_struct(buf: bytearray, slot: int, mem: memoryview, at: int) -> None:
    """Fill descriptor `slot` of a KPARAMS byte buffer from the ggml_tensor struct at byte `at` of `mem`
    (an arena's bytes): what set_desc_from_record writes, without a numpy scalar access per field."""
    d = slot * TDESC.itemsize
    buf[d + _T_DATA: d + _T_DATA + 8] = mem[at + _S_DATA: at + _S_DATA + 8]
    buf[d + _T_TYPE: d + _T_TYPE + 4] = mem[at + _S_TYPE: at + _S_TYPE + 4]
    buf[d + _T_SHAPE: d + _T_SHAPE + _SHAPE_BYTES] = mem[at + _S_SHAPE: at + _S_SHAPE + _SHAPE_BYTES]


def set_desc_from_record(p: np.ndarray, slot: int, rec) -> None:
    """Fill descriptor `slot` from an arena record (a ggml_tensor struct)."""
    d = p["t"][slot]
    d["data"] = rec["data"]
    d["type"] = rec["type"]
    d["ne"] = rec["ne"]
    d["nb"] = rec["nb"].astype(np.int64)

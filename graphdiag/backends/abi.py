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

import struct

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


# A descriptor is data, type, a zero pad, ne and nb (nb u64 in the struct, i64 here: the same bytes); the
# struct holds type at 0, ne/nb at 16..80 and data at 248, so a descriptor is two reads and one write.
_S_DATA = TENSOR_DTYPE.fields["data"][1]
_STRUCT_SHAPE = struct.Struct("<i12x4q4q")      # a struct's type, ne, nb
_DESC_HEAD = struct.Struct("<Qi4x4q4q")         # a whole descriptor
_U64 = struct.Struct("<Q")
assert [TENSOR_DTYPE.fields[f][1] for f in ("type", "ne", "nb")] == [0, 16, 48]
assert [TDESC.fields[f][1] for f in ("data", "type", "ne", "nb")] == [0, 8, 16, 48]


def set_desc_from_struct(buf: bytearray, slot: int, mem: memoryview, at: int) -> None:
    """Fill descriptor `slot` of a KPARAMS byte buffer from the ggml_tensor struct at byte `at` of `mem`
    (an arena's bytes): its data, type, a zero pad, ne and nb, with one unpack_from and one pack_into where
    numpy would take a scalar access per field."""
    _DESC_HEAD.pack_into(buf, slot * TDESC.itemsize, _U64.unpack_from(mem, at + _S_DATA)[0],
                         *_STRUCT_SHAPE.unpack_from(mem, at))


_IP, _FP = KPARAMS.fields["ip"][1], KPARAMS.fields["fp"][1]


def set_desc_bytes(buf: bytearray, slot: int, data: int, type_: int, ne, nb) -> None:
    """set_desc on a KPARAMS byte buffer: one pack_into."""
    _DESC_HEAD.pack_into(buf, slot * TDESC.itemsize, data, type_, *ne, *nb)


def set_scalars_bytes(buf: bytearray, ip=(), fp=()) -> None:
    """The first len(ip) int32 and len(fp) float32 scalars of a KPARAMS byte buffer (the rest untouched)."""
    if ip:
        struct.pack_into(f"<{len(ip)}i", buf, _IP, *ip)
    if fp:
        struct.pack_into(f"<{len(fp)}f", buf, _FP, *fp)

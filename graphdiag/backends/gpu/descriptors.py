"""Tensor descriptors of a graph's structs, gathered once per lowering."""

from __future__ import annotations

import numpy as np

from ...ir.arena import MAX_SRC, TENSOR_DTYPE, TENSOR_SIZE
from ...ir.graph import Graph
from .. import abi

_DESC = abi.TDESC.itemsize
_SW = TENSOR_SIZE // 8                            # 64-bit words per struct
_S_TYPE, _S_NE, _S_SRC, _S_DATA = 0, 2, 19, 31    # word offsets in ggml_tensor: type (low half), ne..nb, src, data
assert [abi.TDESC.fields[f][1] for f in ("data", "type", "pad", "ne", "nb")] == [0, 8, 12, 16, 48]
assert [TENSOR_DTYPE.fields[f][1] // 8 for f in ("type", "ne", "src", "data")] == [_S_TYPE, _S_NE, _S_SRC, _S_DATA]


def struct_words(arena) -> np.ndarray:
    """The arena's structs as (capacity, 42) 64-bit words (a view)."""
    return arena.rec.view(np.uint64).reshape(len(arena.rec), _SW)


def source_slots(arena, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slots, null): each node's MAX_SRC source slots (0 where there is none) and where there is none."""
    src = struct_words(arena)[nodes, _S_SRC : _S_SRC + MAX_SRC]
    null = src == 0
    slots = ((src - np.uint64(arena.base)) // np.uint64(TENSOR_SIZE)).astype(np.intp)
    slots[null] = 0
    return slots, null


class DescriptorTable:
    """The tensor descriptor (abi.TDESC: data, type, a zero pad, ne, nb) of every struct a graph's launches
    can describe — its nodes lo..hi and their sources — made by one vectorised gather when they are lowered,
    so a launch copies 80 bytes per descriptor instead of decoding the struct; the bytes are those
    abi.set_desc_from_struct writes. A snapshot: made and used by one LoweredOps, while the structs
    stay as they are; a struct it lacks is read from the arena. `described` collects, per launch made
    through it, the (descriptor slot, struct slot) pairs it wrote (what a LaunchMemo re-reads)."""

    __slots__ = ("rows", "row_of", "mem", "described")

    def __init__(self, graph: Graph, lo: int = 0, hi: int | None = None):
        arena = graph.arena
        nodes = graph.nodes[lo:hi]
        src, null = source_slots(arena, nodes)
        slots = np.unique(np.concatenate([nodes, src[~null]]))
        w = struct_words(arena)[slots]
        t = np.empty((len(slots), _DESC // 8), np.uint64)
        t[:, 0] = w[:, _S_DATA]
        t[:, 1] = w[:, _S_TYPE] & np.uint64(0xFFFF_FFFF)            # type, then the zero pad
        t[:, 2:] = w[:, _S_NE : _S_NE + 8]                          # ne, nb
        self.rows = t.tobytes()
        self.row_of = dict(zip(slots.tolist(), range(0, len(slots) * _DESC, _DESC)))
        self.mem = arena.mem
        self.described: list[tuple[tuple[int, int], ...]] = []

    def write(self, buf: bytearray, slot: int, idx: int) -> None:
        """Descriptor `slot` of a KPARAMS byte buffer, for the struct in arena slot idx."""
        at = self.row_of.get(idx)
        if at is None:
            abi.set_desc_from_struct(buf, slot, self.mem, idx * TENSOR_SIZE)
        else:
            buf[slot * _DESC : (slot + 1) * _DESC] = self.rows[at : at + _DESC]

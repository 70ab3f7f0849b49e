"""Struct fields of a whole arena as Python lists: what a pass over every node of a graph reads, at once.

A pass that walks a graph reading a few fields per node (the scheduler's assignment, the allocator's plan)
would otherwise pay a numpy scalar access per read. `Columns` reads each field it is asked for once, for
every slot below the arena's top, with one vectorised numpy call, and hands out plain ints. It is a
snapshot: writes to the arena after a field was first read are not seen.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .arena import Arena
from .dtypes import _BLOCK, _SIZE

# per type value: elements per block and bytes per block (0: no such type)
_N_TYPES = max(_BLOCK) + 1
_BLOCK_OF = np.zeros(_N_TYPES, np.int64)
_SIZE_OF = np.zeros(_N_TYPES, np.int64)
for _t in _BLOCK:
    _BLOCK_OF[_t], _SIZE_OF[_t] = _BLOCK[_t], _SIZE[_t]


def _field(name: str) -> cached_property:
    """A Columns attribute: struct field `name` of every slot, as a list of ints read once."""
    def read(self) -> list[int]:
        return self.rec[name].tolist()
    read.__name__ = name
    return cached_property(read)


class Columns:
    """Fields of the structs in slots [0, arena.top), indexed by slot. Sources and view sources are slots
    (-1: none)."""

    def __init__(self, arena: Arena):
        self.arena = arena
        self.top = arena.top
        self.rec = arena.rec[: arena.top]

    def _slots(self, addrs: np.ndarray) -> np.ndarray:
        """Struct addresses to slots, 0 (NULL) to -1."""
        a = self.arena
        return np.where(addrs == 0, -1, (addrs.astype(np.int64) - a.base) // self.rec.dtype.itemsize)

    op = _field("op")
    flags = _field("flags")
    data = _field("data")
    view_offs = _field("view_offs")

    @cached_property
    def view_src(self) -> list[int]:
        return self._slots(self.rec["view_src"]).tolist()

    @cached_property
    def src_slots(self) -> np.ndarray:
        """(top, MAX_SRC) int64: every struct's sources as slots, -1 for NULL."""
        return self._slots(self.rec["src"])

    def count_sources(self, nodes: np.ndarray) -> list[int]:
        """Per slot, how many times the structs at `nodes` read it (a struct read twice by one counts twice)."""
        s = self.src_slots[nodes]
        return np.bincount(s[s >= 0], minlength=self.top).tolist()

    def count_views(self, nodes: np.ndarray) -> list[int]:
        """Per slot, how many of the structs at `nodes` are views of it."""
        vs = self._slots(self.rec["view_src"][nodes])
        return np.bincount(vs[vs >= 0], minlength=self.top).tolist()

    @cached_property
    def src(self) -> list[tuple[int, ...]]:
        """Each struct's sources up to its last non-NULL one (a NULL before it stays, as -1)."""
        s = self.src_slots
        used = s >= 0
        n = np.where(used.any(axis=1), s.shape[1] - np.argmax(used[:, ::-1], axis=1), 0)
        out: list[tuple[int, ...]] = [()] * self.top
        some = np.flatnonzero(n)                 # rows with a source (none of the persistent region's)
        if some.size:
            rows = s[some, : int(n[some].max())].tolist()
            for i, row, k in zip(some.tolist(), rows, n[some].tolist()):
                out[i] = tuple(row[:k])
        return out

    @cached_property
    def owned_mask(self) -> np.ndarray:
        """Allocated by the graph allocator: a compute-region struct that is not a view (bool per slot)."""
        return (np.arange(self.top) >= self.arena.mark) & (self.rec["view_src"] == 0)

    @cached_property
    def owned(self) -> list[bool]:
        """owned_mask as a list."""
        return self.owned_mask.tolist()

    @cached_property
    def layout(self) -> list[bytes]:
        """type, ne[0..3] and nb[0..3] of each struct, as its bytes (equal layouts compare equal)."""
        raw = self.rec.view(np.uint8).reshape(self.top, self.rec.dtype.itemsize)
        fields = self.rec.dtype.fields
        t, ne, nb = fields["type"][1], fields["ne"][1], fields["nb"][1]
        cols = np.concatenate([raw[:, t:t + 4], raw[:, ne:ne + 32], raw[:, nb:nb + 32]], axis=1)
        return cols.view(f"V{cols.shape[1]}").ravel().tolist()

    @cached_property
    def nbytes(self) -> list[int | None]:
        """Bytes each tensor spans, as Tensor.nbytes (ggml_nbytes); None for a type graphdiag lacks (where
        Tensor.nbytes raises)."""
        r = self.rec
        t = r["type"].astype(np.int64)
        known = (t >= 0) & (t < _N_TYPES)
        t = np.where(known, t, 0)
        known &= _BLOCK_OF[t] > 0
        ne, nb = r["ne"], r["nb"].astype(np.int64)
        bs, ts = np.where(known, _BLOCK_OF[t], 1), _SIZE_OF[t]
        rest = ((ne[:, 1:] - 1) * nb[:, 1:]).sum(axis=1)
        spans = np.where(bs == 1, ts + (ne[:, 0] - 1) * nb[:, 0], ne[:, 0] * nb[:, 0] // bs) + rest
        out = np.where((ne == 0).any(axis=1), 0, spans).tolist()
        if not known.all():
            for i in np.flatnonzero(~known).tolist():
                out[i] = None
        return out

"""The ledger as rows for reports: what each node of a captured graph was, with addresses made comparable.

Addresses differ between runs, so a `data` pointer is written as `bN+0xOFF`: N is the order in which the
backend allocated the buffer that holds it (weights, KV cache, compute buffer, pool...), OFF the offset.
"""

from __future__ import annotations

import bisect
import hashlib

import numpy as np

from ...ir.dtypes import GGMLType
from ...ir.ops import Op


class AddressNamer:
    """Names addresses by the allocation order of the buffers a backend handed out."""

    def __init__(self):
        self.bases: list[int] = []
        self.order: dict[int, int] = {}
        self.count = 0

    def add(self, base: int) -> None:
        """A new buffer at `base`: it gets the next ordinal (a base reused after a free is a new buffer)."""
        if base in self.order:
            self.remove(base)
        self.order[base] = self.count
        self.count += 1
        bisect.insort(self.bases, base)

    def remove(self, base: int) -> None:
        """A freed buffer: addresses are no longer named after it."""
        if self.order.pop(base, None) is not None:
            self.bases.pop(bisect.bisect_left(self.bases, base))

    def name(self, addr: int) -> str:
        if addr == 0:
            return "NULL"
        i = bisect.bisect_right(self.bases, addr) - 1
        if i < 0:
            return "host"
        base = self.bases[i]
        return f"b{self.order[base]}+{addr - base:#x}"


def ledger_rows(snap: np.ndarray, names: AddressNamer) -> tuple:
    """One row per node of a PROPS_DTYPE snapshot: (index, name, op, type, ne, nb, op_params digest, flags,
    data, ((src j, ne, nb, data) for each source))."""
    rows = []
    for i, rec in enumerate(snap):
        n = rec["node"]
        srcs = tuple((j, tuple(int(x) for x in rec["src_ne"][j]), tuple(int(x) for x in rec["src_nb"][j]),
                      names.name(int(rec["src_data"][j])))
                     for j in range(len(rec["src_data"])) if int(n["src"][j]))
        rows.append((i, n["name"].decode(errors="replace"), Op(int(n["op"])).name, GGMLType(int(n["type"])).name,
                     tuple(int(x) for x in n["ne"]), tuple(int(x) for x in n["nb"]),
                     hashlib.blake2b(n["op_params"].tobytes(), digest_size=4).hexdigest(), int(n["flags"]),
                     names.name(int(n["data"])), srcs))
    return tuple(rows)

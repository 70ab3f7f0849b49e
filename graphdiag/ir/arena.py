"""The metadata arena: ggml_tensor structs as records of one numpy structured array.

A struct's address is its slot: ``BASE + index * TENSOR_SIZE``. The arena has a persistent region (model
weights, KV cache: built once) and a compute region above a mark that ``reset()`` rewinds without freeing,
so a deterministic rebuild hands out the same addresses for the same tensors, as ggml's ``buf_compute_meta``
does. Keeping every struct in one array makes a whole graph's property snapshot a single gather.
"""

from __future__ import annotations

import numpy as np

MAX_DIMS = 4
MAX_SRC = 10
MAX_OP_PARAMS = 64  # bytes
MAX_NAME = 64

# Byte-for-byte the LP64 layout of ggml_tensor (336 bytes; see ggml.h): the ledger compares whole records.
TENSOR_DTYPE = np.dtype({
    "names": ["type", "buffer", "ne", "nb", "op", "op_params", "flags", "src", "view_src", "view_offs",
              "data", "name", "extra", "padding"],
    "formats": ["<i4", "<u8", ("<i8", (4,)), ("<u8", (4,)), "<i4", ("<i4", (16,)), "<i4", ("<u8", (10,)),
                "<u8", "<u8", "<u8", "S64", "<u8", "V8"],
    "offsets": [0, 8, 16, 48, 80, 84, 148, 152, 232, 240, 248, 256, 320, 328],
    "itemsize": 336,
})
TENSOR_SIZE = TENSOR_DTYPE.itemsize

ARENA_BASE = 0x5EED_0000_0000
_ZERO_STRUCT = bytes(TENSOR_SIZE)


class Arena:
    """Slots for tensor structs. `rec` is the structured array, `raw` the same bytes as (capacity, 336) u8."""

    def __init__(self, capacity: int = 4096, base: int = ARENA_BASE):
        self.base = base
        self._adopt(np.zeros(capacity, TENSOR_DTYPE))
        self.top = 0
        self.mark = 0
        self.skip = 0          # slots left unused after the persistent region (a graph built elsewhere)

    def _adopt(self, rec: np.ndarray) -> None:
        """Make `rec` the structs' array; `mem` is its bytes as a flat memoryview (slot i at
        i * TENSOR_SIZE): byte-slice and struct reads and writes without a numpy call each. An attribute,
        not a property, as it is read at every field access."""
        self.rec = rec
        self.mem = memoryview(rec.view(np.uint8))

    @property
    def capacity(self) -> int:
        return len(self.rec)

    @property
    def raw(self) -> np.ndarray:
        return self.rec.view(np.uint8).reshape(len(self.rec), TENSOR_SIZE)

    def fit(self, n: int) -> None:
        """Room for `n` slots: the array doubled until they fit (as slot-by-slot allocation doubles it)."""
        while len(self.rec) < n:
            grown = np.zeros(len(self.rec) * 2, TENSOR_DTYPE)
            grown[: len(self.rec)] = self.rec
            self._adopt(grown)

    def new_slot(self) -> int:
        """A zeroed slot (as ggml_new_tensor_impl fully initialises the struct)."""
        if self.top == len(self.rec):
            self.fit(self.top + 1)
        i = self.top
        self.top += 1
        self.mem[i * TENSOR_SIZE : (i + 1) * TENSOR_SIZE] = _ZERO_STRUCT
        return i

    def freeze(self) -> None:
        """End the persistent region: everything allocated so far survives `reset()`."""
        self.mark = self.top

    def reset(self, offset: int = 0) -> None:
        """Rewind the compute region (ggml_init over the same buf_compute_meta). With `skip` slots the
        region starts that much later: the graph's structs, hence its first node's address (the CUDA graph
        key), are elsewhere, as when the metadata buffer is a fresh allocation or another context's.
        `offset` slots more: another graph result's own metadata buffer (the context's no-output one)."""
        self.fit(self.mark + self.skip + offset)
        self.top = self.mark + self.skip + offset

    def addr(self, idx) -> int | np.ndarray:
        return self.base + np.asarray(idx, dtype=np.uint64) * np.uint64(TENSOR_SIZE) if not isinstance(idx, int) \
            else self.base + idx * TENSOR_SIZE

    def index(self, addr):
        """Slot index of a struct address (vectorised for arrays)."""
        if isinstance(addr, np.ndarray):
            return ((addr - np.uint64(self.base)) // np.uint64(TENSOR_SIZE)).astype(np.int64)
        return (int(addr) - self.base) // TENSOR_SIZE

    def contains(self, addr: int) -> bool:
        return self.base <= addr < self.base + self.top * TENSOR_SIZE

"""llama.cpp's iSWA KV cache (llama_kv_cache_iswa): a global cache for the full-attention layers and a
sliding-window one for the others, fed the same tokens; each has its own cells, n_kv, mask and cell indices.

Placement, removal and rollback go to both, as upstream's seq_rm does (a rollback cannot bring back cells the
SWA cache evicted for the failed ubatch: neither can llama.cpp's).
"""

from __future__ import annotations

import numpy as np

from .kv_cells import KvCells
from .swa_cells import SwaKvCells


class IswaCells:
    """The two caches' cells. `place` returns (global cells, SWA cells), both int32 (n_tokens,)."""

    def __init__(self, n_ctx: int, swa_size: int, n_swa: int):
        self.base = KvCells(n_ctx)
        self.swa = SwaKvCells(swa_size, n_swa)

    @property
    def size(self) -> int:
        """The global cache's cells (init_full's n_kv)."""
        return self.base.size

    @property
    def size_swa(self) -> int:
        """The SWA cache's cells (init_full's n_kv of it)."""
        return len(self.swa.seq)

    def next_pos(self, seq: int) -> int:
        """The sequence's next position: the global cache holds every position, so it says."""
        return self.base.next_pos(seq)

    def place(self, seqs: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ubatch's tokens into both caches (llama_kv_cache_iswa::prepare then apply: the SWA slots are
        found first, so a full SWA cache refuses before the global cache changes)."""
        self.swa.find_slot(len(seqs))
        cells = self.base.place(seqs, pos)
        return cells, self.swa.place(seqs, pos)

    def seq_rm(self, seq: int, p0: int) -> int:
        """Both caches' cells of `seq` at positions >= p0 freed; returns the global cache's count."""
        self.swa.seq_rm(seq, p0)
        return self.base.seq_rm(seq, p0)

    def remove(self, seq: int) -> None:
        self.seq_rm(seq, 0)

    def n_kv(self) -> int:
        return self.base.n_kv()

    def n_kv_swa(self) -> int:
        return self.swa.n_kv()

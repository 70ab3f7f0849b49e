"""The sliding-window half of llama.cpp's iSWA KV cache (llama_kv_cache with n_swa > 0, LLAMA_SWA_TYPE_STANDARD).

A cell holds one (sequence, position). Unlike the global cache, a cell whose position has left its sequence's
window (seq_pos_max + 1 - pos >= n_swa) may be taken by a new token (find_slot), which evicts it; positions of
that sequence below the evicted one are purged so each sequence keeps a contiguous range (apply_ubatch). The
search starts at `head` (the cell after the last one placed) and wraps at the cache's end, so a full SWA cache
reuses its cells round-robin and its n_kv stops growing at its size while the global cache's keeps growing.
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from ..model.build import padded_n_kv
from ..model.kv_sizes import N_UBATCH, swa_cache_size  # noqa: F401  (the sizes live with the model)


def is_masked_swa(n_swa: int, p0, p1):
    """LLAMA_SWA_TYPE_STANDARD: a cell at position p0 is outside the window of a token at p1 when
    p1 - p0 >= n_swa (numpy arrays or ints)."""
    return (p1 - p0) >= n_swa


class SwaKvCells:
    """Which (sequence, position) each cell of the SWA cache holds (-1: free), with llama.cpp's head-based,
    wrapping slot search. `n_swa`: the window in positions; `size`: the cache's cells.

    What a step asks (each sequence's lowest and highest position and cell count, the cells in use, the
    highest used cell) is kept up to date, as llama_kv_cells keeps its seq_pos maps: a decode token that
    takes the head cell (free, or holding its sequence's oldest position, outside the window) is placed
    with no scan and no array made; anything else takes the general path and the kept state is worked out
    again from the cells."""

    def __init__(self, size: int, n_swa: int):
        if n_swa <= 0:
            raise ValueError(f"n_swa {n_swa} must be > 0")
        self.n_swa = n_swa
        self.seq = np.full(size, -1, np.int32)
        self.pos = np.full(size, -1, np.int32)
        self.head = 0
        self._min: dict[int, int] = {}            # seq -> its lowest position
        self._max: dict[int, int] = {}            # seq -> its highest position
        self._count: dict[int, int] = {}          # seq -> its cells
        self._n_used = 0                          # cells in use
        self._used_p1 = 0                         # highest used cell + 1
        self._d = np.empty(size, np.int32)        # mask scratch, so a decode row allocates nothing
        self._b1 = np.empty(size, np.bool_)
        self._b2 = np.empty(size, np.bool_)

    @property
    def size(self) -> int:
        return len(self.seq)

    # -- what the cells hold ------------------------------------------------------------------------------
    def seq_pos_max(self, seq: int) -> int:
        """The sequence's highest position in the cache, -1 when it has none."""
        return self._max.get(seq, -1)

    def seq_pos_min(self, seq: int) -> int:
        return self._min.get(seq, -1)

    def next_pos(self, seq: int) -> int:
        return self.seq_pos_max(seq) + 1

    def used(self) -> int:
        return self._n_used

    def used_max_p1(self) -> int:
        return self._used_p1

    def _resync(self) -> None:
        """The kept state worked out again from the cells (after the general path)."""
        held = self.seq >= 0
        self._n_used = int(np.count_nonzero(held))
        used = np.flatnonzero(held)
        self._used_p1 = int(used[-1]) + 1 if used.size else 0
        self._min, self._max, self._count = {}, {}, {}
        for q in np.unique(self.seq[held]).tolist():
            p = self.pos[self.seq == q]
            self._min[q], self._max[q], self._count[q] = int(p.min()), int(p.max()), int(p.size)

    def n_kv(self) -> int:
        """Cells the attention reads (get_n_kv): max(256, pad256(highest used cell + 1)), at most the size."""
        return padded_n_kv(self.used_max_p1(), self.size)

    # -- placing and removing -----------------------------------------------------------------------------
    def usable(self) -> np.ndarray:
        """Which cells find_slot may take now (bool per cell): empty, or holding a position outside its
        sequence's window as measured from that sequence's next position (seq_pos_max + 1)."""
        ok = self.seq < 0
        for q in np.unique(self.seq[~ok]).tolist():
            mine = self.seq == q
            ok |= mine & is_masked_swa(self.n_swa, self.pos, self.seq_pos_max(q) + 1)
        return ok

    def find_slot(self, n_tokens: int) -> np.ndarray:
        """llama_kv_cache::find_slot (non-contiguous): the first `n_tokens` usable cells from the head,
        wrapping at the end (the head restarts at 0 when enough cells below it are unused). UsageError when
        they do not fit."""
        size = self.size
        head = self.head
        if head > self.used() + 2 * n_tokens:
            head = 0
        if n_tokens > size:
            raise UsageError(f"SWA KV cache: {n_tokens} tokens > its {size} cells")
        ok = self.usable()
        order = np.concatenate([np.arange(head, size), np.arange(0, head)])
        cells = order[ok[order]][:n_tokens]
        if len(cells) < n_tokens:
            raise UsageError(f"SWA KV cache full: {n_tokens} tokens, {len(cells)} usable cells (size {size}, "
                             f"window {self.n_swa})")
        return cells.astype(np.int32)

    def place(self, seqs: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """find_slot then apply_ubatch: each token into its cell (evicting what it held), then positions of
        an evicted cell's sequence at or below the evicted one purged (llama.cpp keeps [pos_min, pos_max]
        contiguous per sequence); the head moves after the last cell. Returns the cells (int32)."""
        seqs, pos = np.asarray(seqs, np.int32), np.asarray(pos, np.int32)
        if len(seqs) == 1:
            cell = self._place_at_head(int(seqs[0]), int(pos[0]))
            if cell is not None:
                return cell
        cells = self._place(seqs, pos)
        self._resync()
        return cells

    def _place_at_head(self, q: int, p: int) -> np.ndarray | None:
        """One token into the head cell when find_slot would take it and no purge can follow: the cell is
        free, or holds the oldest position of a sequence whose positions are contiguous and which has left
        the window (so the sequence's new lowest position is the next one). None: the general path."""
        head = self.head
        if head > self._n_used + 2:
            head = 0
        if head >= self.size:
            return None
        old = int(self.seq[head])
        if old >= 0:
            p_old, lo, hi = int(self.pos[head]), self._min[old], self._max[old]
            if p_old != lo or hi - lo + 1 != self._count[old] or not is_masked_swa(self.n_swa, p_old, hi + 1):
                return None
            if self._count[old] == 1:
                del self._min[old], self._max[old], self._count[old]
            else:
                self._min[old], self._count[old] = lo + 1, self._count[old] - 1
        else:
            self._n_used += 1
            self._used_p1 = max(self._used_p1, head + 1)
        self.seq[head], self.pos[head] = q, p
        self._min[q] = min(self._min.get(q, p), p)
        self._max[q] = max(self._max.get(q, p), p)
        self._count[q] = self._count.get(q, 0) + 1
        self.head = head + 1
        return np.array([head], np.int32)

    def _place(self, seqs: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cells = self.find_slot(len(seqs))
        rm_max: dict[int, int] = {}
        for c in cells.tolist():
            q = int(self.seq[c])
            if q >= 0:
                rm_max[q] = max(rm_max.get(q, -1), int(self.pos[c]))
        self.seq[cells], self.pos[cells] = seqs, pos
        for q, p_rm in sorted(rm_max.items()):
            left = self.pos[self.seq == q]
            p_min = int(left.min()) if left.size else -1
            if 0 <= p_min <= p_rm:
                self._rm(q, p_min, p_rm + 1)
        self.head = int(cells[-1]) + 1
        return cells

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> int:
        """Free `seq`'s cells at positions in [p0, p1) (p1 < 0: no end), as llama_kv_cache::seq_rm: the head
        moves back to the first freed cell when it is lower. Returns how many were freed."""
        n = self._rm(seq, max(p0, 0), p1 if p1 >= 0 else np.iinfo(np.int32).max)
        self._resync()
        return n

    def remove(self, seq: int) -> None:
        self.seq_rm(seq, 0)

    def _rm(self, seq: int, p0: int, p1: int) -> int:
        gone = np.flatnonzero((self.seq == seq) & (self.pos >= p0) & (self.pos < p1))
        self.seq[gone], self.pos[gone] = -1, -1
        if gone.size and int(gone[0]) < self.head:
            self.head = int(gone[0])
        return int(gone.size)

    # -- the mask -----------------------------------------------------------------------------------------
    def mask(self, seqs: np.ndarray, pos: np.ndarray, n_kv: int, n_rows: int,
             out: np.ndarray | None = None) -> np.ndarray:
        """KQ mask (n_rows, n_kv) float32: 0 where the cell holds the token's sequence at a position p0 with
        p0 <= p1 and p1 - p0 < n_swa (set_input_kq_mask, causal, STANDARD window), -inf elsewhere and in the
        padding rows; written into `out` when given. One token writes through scratch (no allocation)."""
        m = np.empty((n_rows, n_kv), np.float32) if out is None else out
        n = len(seqs)
        for i in range(n):
            d, b1, b2 = self._d[:n_kv], self._b1[:n_kv], self._b2[:n_kv]
            np.subtract(np.int32(pos[i]), self.pos[:n_kv], out=d)
            # 0 <= p1 - p0 < n_swa in one unsigned comparison (a negative difference wraps to a large one)
            np.less(d.view(np.uint32), np.uint32(self.n_swa), out=b1)
            np.equal(self.seq[:n_kv], np.int32(seqs[i]), out=b2)
            np.logical_and(b1, b2, out=b1)
            _MASK_VALUES.take(b1.view(np.uint8), out=m[i], mode="clip")
        m[n:] = _NEG_INF
        return m


_NEG_INF = np.float32(-np.inf)
_MASK_VALUES = np.array([-np.inf, 0.0], np.float32)     # masked, visible

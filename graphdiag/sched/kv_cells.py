"""KV-cache cells (which sequence and position each holds, as llama_kv_cells) and the KQ mask they give."""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from ..model.build import padded_n_kv


class KvCells:
    """Which (sequence, position) each KV-cache cell holds (-1: free), as llama_kv_cells. What a decode
    step asks (a sequence's next position, the highest used cell, the lowest free one) is kept up to date
    as cells are placed and removed, as llama_kv_cells keeps its seq_pos and used sets: no scan of n_ctx
    cells per step."""

    def __init__(self, n_ctx: int):
        self.seq = np.full(n_ctx, -1, np.int32)
        self.pos = np.full(n_ctx, -1, np.int32)
        self._next: dict[int, int] = {}      # seq -> its highest position + 1
        self._used_p1 = 0                    # highest used cell + 1
        self._n_kv = padded_n_kv(0, n_ctx)   # n_kv() of _used_p1, worked out again whenever it changes
        self._free = 0                       # no free cell below this one
        self._placed: list[int] = []         # cells placed since the last removal, in order
        self._row: _MaskRow | None = None    # the last one-token mask row, for the next to start from

    @property
    def size(self) -> int:
        """The cache's cells: n_kv of a context over the whole cache (init_full)."""
        return len(self.seq)

    def next_pos(self, seq: int) -> int:
        """The position the sequence's next token takes (0 for a new sequence)."""
        return self._next.get(seq, 0)

    def place(self, seqs: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Put each token in the lowest free cell; returns the cells (int32, one per token)."""
        n = len(seqs)
        f = self._free
        if n == 1 and f < len(self.seq) and self.seq[f] < 0:        # decode: the cell after the last
            # slices, not an index array: the same casts in a third of the time
            self.seq[f:f + 1], self.pos[f:f + 1] = seqs, pos
            self._placed.append(f)
            self._free = f + 1
            if f >= self._used_p1:
                self._used(f + 1)
            q = int(seqs[0])
            self._next[q] = max(self._next.get(q, 0), int(pos[0]) + 1)
            return np.array([f], np.int32)
        free = np.flatnonzero(self.seq[f:] < 0)
        if free.size < n:
            raise UsageError(f"KV cache full: {n} tokens, {free.size} free cells (n_ctx {len(self.seq)})")
        cells = (free[:n] + f).astype(np.int32)
        self.seq[cells], self.pos[cells] = seqs, pos
        self._placed.extend(cells.tolist())
        self._free = int(cells[-1]) + 1
        self._used(max(self._used_p1, int(cells[-1]) + 1))
        if n == 1:
            q = int(seqs[0])
            self._next[q] = max(self._next.get(q, 0), int(pos[0]) + 1)
        else:
            seqs, pos = np.asarray(seqs), np.asarray(pos)
            for q in np.unique(seqs).tolist():
                self._next[q] = max(self._next.get(q, 0), int(pos[seqs == q].max()) + 1)
        return cells

    def remove(self, seq: int) -> None:
        self.seq_rm(seq, 0)

    def seq_rm(self, seq: int, p0: int) -> int:
        """Free the cells of `seq` at positions >= p0 (llama_kv_cache::seq_rm(seq, p0, -1)); returns how many.
        The sequence's next position becomes its highest remaining one + 1, and the lowest free cell is
        looked for from the first freed one, so the next placement takes the same cells again."""
        gone = (self.seq == seq) & (self.pos >= p0)
        n = int(np.count_nonzero(gone))
        self.seq[gone], self.pos[gone] = -1, -1
        self._placed.clear()                 # freed cells: a kept mask row no longer says what they hold
        self._row = None
        left = self.pos[self.seq == seq]
        if left.size:
            self._next[seq] = int(left.max()) + 1
        else:
            self._next.pop(seq, None)
        used = np.flatnonzero(self.seq >= 0)
        self._used(int(used[-1]) + 1 if used.size else 0)
        hole = np.flatnonzero(gone)
        if hole.size:
            self._free = min(self._free, int(hole[0]))
        return n

    def n_kv(self) -> int:
        """Cells the attention reads: highest used cell + 1, padded to 256, at most n_ctx."""
        return self._n_kv

    def _used(self, used_p1: int) -> None:
        self._used_p1, self._n_kv = used_p1, padded_n_kv(used_p1, len(self.seq))

    def mask(self, seqs: np.ndarray, pos: np.ndarray, n_kv: int, n_rows: int,
             out: np.ndarray | None = None) -> np.ndarray:
        """KQ mask (n_rows, n_kv) float32: 0 where the cell is the token's sequence at pos <= its pos, -inf
        elsewhere and in the padding rows; written into `out` when given (an input stage's view)."""
        m = np.empty((n_rows, n_kv), np.float32) if out is None else out
        n = len(seqs)
        row = self._row_update(int(seqs[0]), pos, n_kv) if n == 1 else None
        if row is not None:
            m[0] = row
            if n_rows > 1:
                m[1:] = _NEG_INF
            return m
        if n and (seqs == seqs[0]).all():
            # one sequence (a prefill): a cell is visible at its position if it holds that sequence, so one
            # (n, n_kv) comparison against the cells' positions, other sequences' cells never visible
            mine = self.seq[:n_kv] == seqs[0]
            cell_pos = np.where(mine, self.pos[:n_kv], _NEVER32)
            if n > 1 and _staircase(m, pos, cell_pos):
                m[n:] = _NEG_INF
                return m
            if _int32_exact(pos, cell_pos):
                _mask_bits(m[:n].view(np.int32), pos.astype(np.int32, copy=False), cell_pos)
                m[n:] = _NEG_INF
                if n == 1:
                    self._row_keep(int(seqs[0]), pos, n_kv, m[0])
                return m
            ok = np.where(mine, self.pos[:n_kv].astype(np.int64), _NEVER)[None, :] <= pos[:, None]
        else:
            ok = (self.seq[None, :n_kv] == seqs[:, None]) & (self.pos[None, :n_kv] <= pos[:, None])
        # one pass in place: each cell's value looked up by its bool (no fill to overwrite, no temporary)
        _MASK_VALUES.take(ok.view(np.uint8), out=m[:n], mode="clip")
        m[n:] = _NEG_INF
        if n == 1:
            self._row_keep(int(seqs[0]), pos, n_kv, m[0])
        return m

    def _row_update(self, seq: int, pos: np.ndarray, n_kv: int) -> np.ndarray | None:
        """The kept one-token row brought up to (seq, pos[0]) by the cells placed since it was made; None when
        it cannot serve (none kept, another sequence or n_kv, an earlier or non-integer position).

        Why that is the whole change: the kept row was made when every cell of `seq` sat at or before its
        position (_row_keep), and no cell was freed since (remove drops it), so a cell not placed since
        holds what it held then; at a position as late or later it is visible exactly as it was (its
        sequence's cells all before both positions, other cells never). A cell placed since was free then
        (-inf) and is worked out again from what it holds now."""
        row = self._row
        if row is None or row.seq != seq or row.n_kv != n_kv or pos.dtype.kind not in "iu":
            return None
        p = int(pos[0])
        if p < row.pos:
            return None
        placed, values = self._placed, row.values
        for c in placed[row.n_placed:]:
            if c < n_kv:
                values[c] = 0.0 if int(self.seq[c]) == seq and int(self.pos[c]) <= p else _NEG_INF
        if self._next.get(seq, 0) <= p + 1:      # every cell of seq at or before p: the row stays usable
            row.pos, row.n_placed = p, len(placed)
        else:
            self._row = None
        return values

    def _row_keep(self, seq: int, pos: np.ndarray, n_kv: int, values: np.ndarray) -> None:
        """Keep a copy of a one-token row just written, when every cell of its sequence is at or before its
        position (what _row_update relies on); drop the kept one otherwise."""
        ok = seq >= 0 and pos.dtype.kind in "iu" and self._next.get(seq, 0) <= int(pos[0]) + 1
        self._row = _MaskRow(seq, int(pos[0]), n_kv, len(self._placed), values.copy()) if ok else None


class _MaskRow:
    """A one-token KQ mask row (n_kv float32) for `seq` at `pos`, made when `n_placed` cells had been placed
    since the last removal."""

    __slots__ = ("seq", "pos", "n_kv", "n_placed", "values")

    def __init__(self, seq: int, pos: int, n_kv: int, n_placed: int, values: np.ndarray):
        self.seq, self.pos, self.n_kv, self.n_placed, self.values = seq, pos, n_kv, n_placed, values


def _int32_exact(pos: np.ndarray, cell_pos: np.ndarray) -> bool:
    """Whether token position minus cell position is exact in int32 and negative exactly where the cell is
    masked: positions in [0, 2**31 - 1), cells' positions (_NEVER32 for another sequence's) not negative."""
    return (pos.dtype.kind in "iu" and cell_pos.size > 0
            and bool(pos.min() >= 0 and pos.max() < _NEVER32 and cell_pos.min() >= 0))


def _staircase(m: np.ndarray, pos: np.ndarray, cell_pos: np.ndarray) -> bool:
    """The rows of a prefill whose tokens take consecutive positions over cells that hold consecutive
    positions from cell 0 on (every cell after them unseen by the batch): row i sees the first t0 + i cells,
    so every row is a window of one array of n_kv zeros then n_kv -inf, each starting one element before
    the row above; written in one copy from that window (`m`'s first len(pos) rows). False, with nothing
    written, for any other layout. Why by hand: the three in-place passes of _mask_bits over a 512 x 2048
    mask took 1.7 ms on the GPU host; one copy from a cache-resident template takes a third of that."""
    n, n_kv = len(pos), len(cell_pos)
    if pos.dtype.kind not in "iu" or n_kv == 0:
        return False
    p0, last = int(pos[0]), int(pos[-1])
    if last - p0 != n - 1 or (n > 2 and not (np.diff(pos) == 1).all()):
        return False
    seen = cell_pos <= last                       # the cells the last row sees: a prefix of consecutive positions
    n_seen = int(np.count_nonzero(seen))
    c0 = int(cell_pos[0])
    if n_seen == 0 or not seen[:n_seen].all() or not (cell_pos[:n_seen] == np.arange(c0, c0 + n_seen)).all():
        return False
    t0 = p0 - c0 + 1                              # cells row 0 sees
    if t0 < 0 or t0 + n - 1 > n_seen:
        return False
    tpl = np.empty(2 * n_kv, np.float32)
    tpl[:n_kv] = 0.0
    tpl[n_kv:] = _NEG_INF
    start = n_kv - t0                             # row i starts at start - i (>= 0: t0 + n - 1 <= n_kv)
    m[:n] = np.lib.stride_tricks.as_strided(tpl[start:], (n, n_kv), (-tpl.itemsize, tpl.itemsize),
                                            writeable=False)
    return True


def _mask_bits(d: np.ndarray, pos: np.ndarray, cell_pos: np.ndarray) -> None:
    """The mask's rows as int32 bits in `d` (n, n_kv), three passes in place and no temporary: the position
    difference is negative where the cell is masked (after the token, or _NEVER32), its sign spread over the
    word (-1 or 0) and kept where -inf has bits set (0.0 is all zero)."""
    np.subtract(pos[:, None], cell_pos[None, :], out=d)
    np.right_shift(d, 31, out=d)
    np.bitwise_and(d, _NEG_INF_BITS, out=d)


_NEG_INF = np.float32(-np.inf)
_MASK_VALUES = np.array([-np.inf, 0.0], np.float32)     # masked, visible
_NEVER = np.int64(1) << 62       # a cell position no token's (int32) position reaches
_NEVER32 = np.int32(np.iinfo(np.int32).max)   # the same in int32, for tokens below that position
_NEG_INF_BITS = _NEG_INF.view(np.int32)           # 0xff800000

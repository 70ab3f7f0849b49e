"""The iSWA KV cache: SWA cache sizing, cell reuse as llama.cpp's find_slot/apply_ubatch, window masks, rollback."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from graphdiag.errors import UsageError
from graphdiag.sched.iswa import IswaCells
from graphdiag.sched.swa_cells import SwaKvCells, swa_cache_size


# -- sizing ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_ctx, n_swa, n_seq, unified, full, want", [
    (32768, 512, 1, True, False, 1024),       # Gemma 3 270M, llama-server defaults: 512 + 512
    (32768, 512, 4, True, False, 2560),       # unified: the window of every sequence, + n_ubatch
    (32768, 512, 4, False, False, 1024),      # one stream per sequence: one window each
    (32768, 512, 1, True, True, 32768),       # --swa-full: the global size
    (768, 512, 1, True, False, 768),          # capped at n_ctx
    (700, 512, 1, True, False, 768),          # n_ctx padded to 768 first (llama_context), then the cap
    (4096, 100, 1, True, False, 768),         # 612 padded to 768
])
def test_swa_cache_size(n_ctx, n_swa, n_seq, unified, full, want):
    assert swa_cache_size(n_ctx, n_swa, n_seq, 512, unified, full) == want


# Worked by hand from 0c1e57098: llama_context's constructor pads n_ctx to 256, takes n_batch = min(n_ctx,
# n_batch) and n_ubatch = min(n_batch, n_ubatch), and gives the cache n_ctx_seq (n_ctx when unified, else
# pad256(n_ctx / n_seq_max)); llama_kv_cache_iswa's constructor: size_base = n_ctx_seq, size_swa =
# pad256(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch)), or size_base with swa_full.
@pytest.mark.parametrize("n_ctx, n_swa, n_seq, n_ubatch, unified, full, want", [
    (4096, 128, 1, 64, True, False, 256),     # the review's case (gemma3-tiny, --ubatch-size 64): 192 -> 256
    (4096, 128, 1, 512, True, False, 768),    # gemma3-tiny at the default n_ubatch: 640 -> 768
    (4096, 128, 3, 64, True, False, 512),     # unified, 3 sequences: 3 windows + 64 = 448 -> 512
    (4096, 128, 3, 64, False, False, 256),    # a stream each: n_ctx_seq pad256(1365) = 1536; 192 -> 256
    (4096, 128, 1, 16, True, False, 256),     # 144 -> 256
    (4096, 240, 1, 16, True, False, 256),     # 256 exactly: no pad
    (4096, 241, 1, 16, True, False, 512),     # 257 -> 512
    (1024, 512, 4, 512, False, False, 256),   # n_ctx_seq pad256(256) = 256 caps 1024
    (1000, 100, 3, 64, False, False, 256),    # n_ctx 1024; n_ctx_seq pad256(341) = 512; 164 -> 256
    (1000, 512, 1, 512, True, False, 1024),   # n_ctx 1000 -> 1024 caps 1024
    (700, 128, 1, 64, True, True, 768),       # swa_full: size_base, n_ctx padded to 768
    (1024, 128, 1, 2048, True, False, 1024),  # n_ubatch <= n_batch <= n_ctx: 1024; capped at 1024 anyway
])
def test_swa_cache_size_as_upstream_sizes_it(n_ctx, n_swa, n_seq, n_ubatch, unified, full, want):
    assert swa_cache_size(n_ctx, n_swa, n_seq, n_ubatch, unified, full) == want


def test_the_run_s_n_ubatch_sizes_gemma3_s_swa_cache():
    """The run's --ubatch-size reaches the SWA cache (it was sized for n_ubatch 512 whatever the run's)."""
    from graphdiag.model.presets import get_preset
    from graphdiag.model.source import sized
    cfg = get_preset("gemma3-tiny")
    assert sized(cfg, False, 1, 64).swa_size == 256 and sized(cfg, False, 1, 512).swa_size == 768
    assert sized(cfg, False, 3, 64).swa_size == 512 and sized(cfg, True, 1, 64).swa_size == 4096


# -- a literal twin of llama.cpp's loops, cell by cell ----------------------------------------------------
class _Twin:
    def __init__(self, size, n_swa):
        self.size, self.n_swa = size, n_swa
        self.cells = [None] * size          # (seq, pos) or None
        self.head = 0

    def pos_max(self, q):
        ps = [c[1] for c in self.cells if c and c[0] == q]
        return max(ps) if ps else -1

    def pos_min(self, q):
        ps = [c[1] for c in self.cells if c and c[0] == q]
        return min(ps) if ps else -1

    def find_slot(self, n):
        head = self.head
        used = sum(c is not None for c in self.cells)
        if head > used + 2 * n:
            head = 0
        idxs, tested = [], 0
        while True:
            if head + 1 > self.size:
                tested += self.size - head
                head = 0
                continue
            idx = head
            head += 1
            tested += 1
            c = self.cells[idx]
            if c is None or (self.pos_max(c[0]) + 1) - c[1] >= self.n_swa:
                idxs.append(idx)
            if len(idxs) == n:
                return idxs
            if tested >= self.size:
                return None

    def place(self, seqs, pos):
        idxs = self.find_slot(len(seqs))
        if idxs is None:
            return None
        rm = {}
        for i, idx in enumerate(idxs):
            c = self.cells[idx]
            if c is not None:
                rm[c[0]] = max(rm.get(c[0], -1), c[1])
                self.cells[idx] = None
            self.cells[idx] = (seqs[i], pos[i])
        for q, p in rm.items():
            lo = self.pos_min(q)
            if lo <= p:
                self.rm(q, lo, p + 1)
        self.head = idxs[-1] + 1
        return idxs

    def rm(self, q, p0, p1=1 << 30):
        new_head = None
        for i, c in enumerate(self.cells):
            if c and c[0] == q and p0 <= c[1] < p1:
                self.cells[i] = None
                if new_head is None:
                    new_head = i
        if new_head is not None and new_head < self.head:
            self.head = new_head

    def mask(self, seqs, pos, n_kv):
        m = np.full((len(seqs), n_kv), -np.inf, np.float32)
        for i, (q, p1) in enumerate(zip(seqs, pos)):
            for j in range(n_kv):
                c = self.cells[j]
                if c and c[0] == q and c[1] <= p1 and p1 - c[1] < self.n_swa:
                    m[i, j] = 0.0
        return m


def _run(ops, size, n_swa):
    """Apply ops to both the cells and the twin, checking every step."""
    cells, twin = SwaKvCells(size, n_swa), _Twin(size, n_swa)
    nxt = {}
    for op in ops:
        if op[0] == "add":
            _, q, n = op
            p0 = nxt.get(q, 0)
            seqs, pos = [q] * n, list(range(p0, p0 + n))
            want = twin.place(seqs, pos)
            if want is None:
                with pytest.raises(UsageError):
                    cells.place(np.array(seqs), np.array(pos))
                continue
            got = cells.place(np.array(seqs), np.array(pos))
            assert got.tolist() == want
            nxt[q] = p0 + n
            n_kv = cells.n_kv()
            np.testing.assert_array_equal(cells.mask(np.array(seqs, np.int32), np.array(pos, np.int32), n_kv, n),
                                          twin.mask(seqs, pos, n_kv))
        else:
            _, q, back = op
            p0 = max(nxt.get(q, 0) - back, 0)
            cells.seq_rm(q, p0)
            twin.rm(q, p0)
            nxt[q] = min(nxt.get(q, 0), p0)
        assert [(int(s), int(p)) if s >= 0 else None for s, p in zip(cells.seq, cells.pos)] == twin.cells
        assert cells.head == twin.head
        # the kept state (what a decode step reads without a scan) is what a scan of the twin says
        held = [i for i, c in enumerate(twin.cells) if c]
        assert (cells.used(), cells.used_max_p1()) == (len(held), held[-1] + 1 if held else 0)
        for q in range(3):
            assert (cells.seq_pos_min(q), cells.seq_pos_max(q)) == (twin.pos_min(q), twin.pos_max(q))


_op = st.one_of(st.tuples(st.just("add"), st.integers(0, 2), st.integers(1, 40)),
                st.tuples(st.just("add"), st.integers(0, 2), st.just(1)),     # decode: the head fast path
                st.tuples(st.just("rm"), st.integers(0, 2), st.integers(0, 30)))


@settings(max_examples=120, deadline=None)
@given(st.lists(_op, max_size=40), st.sampled_from([(64, 16), (96, 40), (256, 100)]))
def test_cells_match_llama_cpp_loops(ops, shape):
    _run(ops, *shape)


def test_long_decode_reuses_cells_round_robin():
    """One sequence decoding past the SWA cache's size: the cells wrap, the oldest (outside the window)
    evicted first; n_kv stops at the size; the window's positions are always all there."""
    c = SwaKvCells(1024, 512)
    for p in range(3000):
        cell = c.place(np.array([0]), np.array([p]))
        assert int(cell[0]) == p % 1024
        assert c.n_kv() == min(1024, max(256, (p // 256 + 1) * 256))
    assert c.seq_pos_min(0) == 3000 - 1024 and c.seq_pos_max(0) == 2999


def test_window_mask_at_decode():
    c = SwaKvCells(1024, 512)
    for p in range(1500):
        c.place(np.array([0]), np.array([p]))
    row = c.mask(np.array([0], np.int32), np.array([1500], np.int32), 1024, 1)[0]
    visible = np.flatnonzero(row == 0)
    assert sorted(c.pos[visible].tolist()) == list(range(1500 - 511, 1500))   # p1 - p0 < 512


def test_prefill_longer_than_the_window_fits_as_llama_cpp_sizes_it():
    """A 512-token ubatch after 600 positions: the window (512) + the ubatch fit the 1024 cells."""
    c = SwaKvCells(swa_cache_size(32768, 512, 1), 512)
    c.place(np.zeros(512, np.int32), np.arange(512))
    c.place(np.zeros(88, np.int32), np.arange(512, 600))
    c.place(np.zeros(512, np.int32), np.arange(600, 1112))
    assert c.seq_pos_max(0) == 1111 and c.seq_pos_min(0) <= 1112 - 512 - 1
    m = c.mask(np.zeros(512, np.int32), np.arange(600, 1112, dtype=np.int32), c.n_kv(), 512)
    assert (np.count_nonzero(m == 0, axis=1) == np.minimum(np.arange(601, 1113), 512)).all()


def test_full_swa_cache_refuses_in_one_line():
    c = SwaKvCells(256, 200)
    c.place(np.zeros(250, np.int32), np.arange(250))
    with pytest.raises(UsageError, match="SWA KV cache full"):
        c.place(np.zeros(100, np.int32), np.arange(250, 350))


def test_iswa_places_in_both_and_rolls_back_both():
    kv = IswaCells(4096, 1024, 512)
    for p in range(1200):
        kv.place(np.array([0]), np.array([p]))
    assert (kv.n_kv(), kv.n_kv_swa()) == (1280, 1024)
    base, swa = kv.place(np.array([0, 0]), np.array([1200, 1201]))
    assert base.tolist() == [1200, 1201] and swa.tolist() == [1200 % 1024, 1201 % 1024]
    kv.seq_rm(0, 1200)                                       # the failed ubatch's positions, from both
    assert kv.next_pos(0) == 1200 and kv.swa.seq_pos_max(0) == 1199
    assert kv.swa.head == 1200 % 1024                         # the next placement takes the same cells
    assert kv.place(np.array([0]), np.array([1200]))[1].tolist() == [1200 % 1024]
    # the SWA cells evicted for the failed ubatch stay evicted (as llama.cpp): the window is still whole
    assert kv.swa.seq_pos_min(0) <= 1200 - 511


def test_iswa_refuses_before_touching_the_global_cache():
    kv = IswaCells(4096, 256, 200)
    kv.place(np.zeros(250, np.int32), np.arange(250))
    with pytest.raises(UsageError):
        kv.place(np.zeros(100, np.int32), np.arange(250, 350))
    assert kv.next_pos(0) == 250 and kv.base.n_kv() == 256


def test_a_decode_token_after_removals_restarts_the_search_at_cell_0_as_llama_cpp():
    """find_slot's "head > used + 2 n_tokens: start from 0", on the one-token path (found by a random search
    against the twin: a fast path without it places the last token elsewhere)."""
    ops = [("add", 0, 6), ("add", 1, 1), ("add", 0, 1), ("add", 0, 1), ("add", 2, 1), ("add", 2, 1), ("add", 2, 15),
           ("add", 0, 1), ("rm", 1, 22), ("add", 2, 1), ("rm", 2, 12), ("add", 1, 1), ("add", 2, 11), ("add", 2, 1),
           ("add", 0, 1), ("rm", 1, 11), ("add", 1, 1), ("rm", 2, 21), ("add", 0, 15), ("add", 0, 1), ("add", 2, 1),
           ("add", 1, 34), ("add", 1, 1)]
    _run(ops, 64, 16)


def test_the_plans_most_sequences_size_the_swa_cache_as_llama_cpp_n_seq_max():
    """A timeline that raises the batch above --batch sizes the SWA cache for its most sequences, as
    `graphdiag llama` gives llama.cpp n_seq_max (it was sized for --batch alone)."""
    from types import SimpleNamespace

    from graphdiag.config import resolve
    from graphdiag.plan import max_sequences, plan_steps
    from graphdiag.runner import Session
    from graphdiag import events as E
    sc = SimpleNamespace(name="t", timeline=[{"at_step": 3, "batch": 3}])
    cfg = resolve({"backend": "sim", "model": "gemma3-tiny", "ubatch_size": 64, "prompt_tokens": 4, "steps": 6},
                  environ={})
    assert max_sequences(plan_steps(cfg, sc)) == 3
    s = Session(cfg, E.EventBus(), n_seq_max=max_sequences(plan_steps(cfg, sc)))
    try:
        assert s.model.cfg.swa_size == 512          # 128 x 3 + 64, padded to 256; --batch 1 alone gave 256
    finally:
        s.close()

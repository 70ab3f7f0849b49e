"""The context: KV cells and n_kv padding, the KQ mask, graph reuse and the reasons it is refused."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphdiag import events as E
from graphdiag.backends.cpu import CpuBackend
from graphdiag.counters import Counters
from graphdiag.memory import AddressSpace
from graphdiag.model.build import padded_n_kv
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model
from graphdiag.sched.context import make_context
from graphdiag.sched.kv_cells import KvCells

CFG = dataclasses.replace(PRESETS["tiny"], n_layer=2, n_vocab=512, n_ctx=1024)


def test_kv_cells_positions_padding_and_mask():
    kv = KvCells(1024)
    assert kv.n_kv() == 256 and kv.next_pos(0) == 0
    cells = kv.place(np.array([0, 0, 1]), np.array([0, 1, 0]))
    assert cells.tolist() == [0, 1, 2] and kv.next_pos(0) == 2 and kv.next_pos(1) == 1
    m = kv.mask(np.array([0, 1]), np.array([1, 0]), 256, 2)
    assert m.shape == (2, 256) and m.dtype == np.float32
    assert m[0, :3].tolist() == [0, 0, -np.inf] and m[1, :3].tolist() == [-np.inf, -np.inf, 0]
    assert np.isneginf(m[:, 3:]).all()
    kv.place(np.full(254, 2), np.arange(254))
    assert kv.n_kv() == 512                   # 257 cells in use
    kv.remove(2)
    assert kv.n_kv() == 256 and kv.place(np.array([3]), np.array([0])).tolist() == [3]



def _mask_by_definition(kv, seqs, pos, n_kv, n_rows):
    ok = (kv.seq[None, :n_kv] == seqs[:, None]) & (kv.pos[None, :n_kv].astype(np.int64)
                                                    <= np.asarray(pos, np.int64)[:, None])
    m = np.full((n_rows, n_kv), -np.inf, np.float32)
    m[:len(seqs)][ok] = 0
    return m


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=4),
       st.integers(0, 2), st.lists(st.integers(-2, 2**31 - 1), min_size=1, max_size=12), st.booleans(),
       st.integers(0, 2))
def test_kq_mask_bits_are_the_definitions(placed, seq, pos, one_seq, pad):
    """The int32 bit path (one sequence, positions in int32 range) and the lookup path give the mask's
    definition bit for bit, at the int32 edges too."""
    kv = KvCells(512)
    for s, n, gap in placed:
        kv.place(np.full(n, s, np.int32), (kv.next_pos(s) + gap + np.arange(n)).astype(np.int32))
    pos = np.asarray(pos, np.int64)
    seqs = np.full(len(pos), seq, np.int32) if one_seq else (np.arange(len(pos)) % 3).astype(np.int32)
    got = kv.mask(seqs, pos, 256, len(pos) + pad)
    want = _mask_by_definition(kv, seqs, pos, 256, len(pos) + pad)
    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    out = np.ones((len(pos) + pad, 256), np.float32)
    kv.mask(seqs, pos.astype(np.int32), 256, len(pos) + pad, out=out)
    assert out.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()

@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 40), st.sampled_from([0, 0, 0, 2])), max_size=3),
       st.integers(1, 70), st.integers(-3, 3), st.sampled_from([256, 512]), st.integers(0, 3),
       st.booleans())
def test_prefill_mask_staircase_is_the_definition(history, n, shift, n_kv, pad, remove_first):
    """A prefill's rows (consecutive positions) over a cache whose sequence-0 cells hold consecutive
    positions or not (gaps, another sequence's cells among them, a freed hole, a batch starting before or
    after the cache's last position): bit for bit the mask's definition, whichever path writes it."""
    kv = KvCells(1024)
    for s, k, gap in history:
        kv.place(np.full(k, s, np.int32), (kv.next_pos(s) + gap + np.arange(k)).astype(np.int32))
    if remove_first and history:
        kv.remove(history[0][0])
    p0 = max(kv.next_pos(0) + shift, 0)
    pos = (p0 + np.arange(n)).astype(np.int32)
    seqs = np.zeros(n, np.int32)
    kv.place(seqs, pos)
    n_kv = max(n_kv, kv.n_kv())
    want = _mask_by_definition(kv, seqs, pos, n_kv, n + pad)
    out = np.ones((n + pad, n_kv), np.float32)
    kv.mask(seqs, pos, n_kv, n + pad, out=out)
    assert out.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()


def test_the_prefill_staircase_takes_a_plain_prefill():
    """The plain prefill after a prompt (consecutive cells and positions) takes the one-copy path."""
    from graphdiag.sched import kv_cells
    kv = KvCells(1024)
    kv.place(np.zeros(300, np.int32), np.arange(300, dtype=np.int32))
    pos = np.arange(300, 500, dtype=np.int32)
    kv.place(np.zeros(200, np.int32), pos)
    cell_pos = kv.pos[:512].copy()
    cell_pos[kv.seq[:512] != 0] = np.iinfo(np.int32).max
    m = np.ones((200, 512), np.float32)
    assert kv_cells._staircase(m, pos, cell_pos)
    assert (m[0, :301] == 0).all() and np.isneginf(m[0, 301:]).all()
    assert (m[199, :500] == 0).all() and np.isneginf(m[199, 500:]).all()
    cell_pos[10] = 5                          # not consecutive: the bit path
    assert not kv_cells._staircase(m, pos, cell_pos)


@pytest.fixture(scope="module")
def model():
    return create_model(CFG, seed=11)


def context(model, **kw):
    cpu = CpuBackend("CPU")
    gs = AddressSpace(base=0x7000_0000_0000, name="GPU")
    gpu = CpuBackend("GPU", space=gs, resolve=[gs, cpu.space])
    bus, rec, counters = E.EventBus(), E.Recorder(), Counters()
    bus.subscribe(rec)
    bus.subscribe(counters)
    return make_context(model, [gpu, cpu], bus, **kw), rec, counters


def reasons(rec):
    return [(e.step, e.reused, e.reason) for e in rec.of(E.ContextDecision)]


def test_same_batch_decode_reuses_the_graph_and_its_uids(model):
    ctx, rec, counters = context(model)
    ctx.prefill([1, 2, 3], seq=0)
    ctx.prefill([4, 5], seq=1)
    with counters.expect(graphs_reused=2, graphs_rebuilt=1):
        ctx.decode([7, 8])
        uids = [s.graph.uid for s in ctx.sched.splits]
        ctx.decode([9, 10])
        ctx.decode([11, 12])
    assert [s.graph.uid for s in ctx.sched.splits] == uids and ctx.n_reused == 2
    ctx.decode({0: 3})
    assert reasons(rec) == [(0, False, "first graph"), (1, False, "n_tokens 3→2"),
                            (2, False, "n_seqs 1→2"), (3, True, ""), (4, True, ""),
                            (5, False, "n_tokens 2→1")]
    started = rec.of(E.StepStarted)
    assert [(e.step, e.phase, e.n_tokens, e.n_seqs, e.n_kv) for e in started][1:3] == [
        (1, "prefill", 2, 1, 256), (2, "decode", 2, 2, 256)]
    assert [e.step for e in rec.of(E.GraphSplit)] == [0, 1, 2, 5]


def test_reuse_disabled_splits_every_step_with_new_uids_at_stable_addresses(model):
    ctx, rec, counters = context(model, reuse_disabled=True)
    ctx.prefill([1, 2, 3])
    seen = []
    with counters.expect(graphs_reused=0, graphs_rebuilt=3):
        for t in (5, 6, 7):
            ctx.decode([t])
            seen.append((ctx.sched.splits[0].graph.uid, ctx.sched.splits[0].graph.first_node_addr,
                         model.arena.raw[ctx.sched.graph.nodes].tobytes()))
    assert len({u for u, _, _ in seen}) == 3
    assert len({(k, b) for _, k, b in seen}) == 1   # the rebuilt graph is byte-identical: only the uid moves
    assert reasons(rec)[2:] == [(2, False, "reuse disabled"), (3, False, "reuse disabled")]


def test_crossing_a_256_cell_boundary_forces_a_rebuild(model):
    ctx, rec, counters = context(model)
    ctx.prefill(list(range(1, 255)))          # cells 0..253
    for t in (1, 2, 3):                       # cells 254, 255, then 256: n_kv 256 -> 512
        ctx.decode([t])
    assert reasons(rec)[1:] == [(1, False, "n_tokens 254→1"), (2, True, ""),
                                (3, False, "n_kv 256→512")]
    assert rec.of(E.StepStarted)[-1].n_kv == 512 and ctx.res.inputs.kq_mask.ne[0] == 512
    # the context's worst-case reserve (a 512-token prompt over all n_ctx cells: Context.sched_reserve) covers
    # the prefill and both decode graphs (same node count, every node no larger; the K/V cache views move,
    # not grow): as ggml_gallocr_needs_realloc, no step re-plans
    assert counters.reallocs_changed == counters.reallocs_same == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["place", "remove", "mask", "mask"]), st.integers(0, 1),
                          st.integers(1, 30), st.integers(0, 60), st.sampled_from([256, 256, 512])),
                min_size=1, max_size=40))
def test_one_token_mask_rows_kept_between_calls_are_never_stale(ops):
    """A one-token mask row is brought up to date from the one kept by the last call: through placements
    of any sequence (ahead of the token too), removals, other sequences, n_kv and earlier positions, each
    row equals the definition bit for bit."""
    kv = KvCells(512)
    for op, seq, n, p, n_kv in ops:
        if op == "place" and np.count_nonzero(kv.seq < 0) >= n:
            kv.place(np.full(n, seq, np.int32), (kv.next_pos(seq) + p % 4 + np.arange(n)).astype(np.int32))
        elif op == "remove":
            kv.remove(seq)
        elif op == "mask":
            if p % 3 == 0 and np.count_nonzero(kv.seq < 0):    # a decode step: place, then its row
                pos = np.array([kv.next_pos(seq)], np.int32)
                kv.place(np.array([seq], np.int32), pos)
            else:                                               # any position, before or after the cells
                pos = np.array([p], np.int32)
            seqs = np.array([seq], np.int32)
            out = np.full((1 + n % 2, n_kv), 7.0, np.float32)
            kv.mask(seqs, pos, n_kv, len(out), out=out)
            want = _mask_by_definition(kv, seqs, pos, n_kv, len(out))
            assert out.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()


def test_a_kept_mask_row_is_not_reused_past_cells_placed_ahead_of_its_token():
    """Cells placed ahead of a row's position make it unfit to start the next from (it would miss them as
    later tokens reach their positions); an earlier position is worked out afresh."""
    kv = KvCells(512)
    kv.place(np.zeros(6, np.int32), np.arange(6, dtype=np.int32))           # cells 0..5, positions 0..5
    seqs = np.zeros(1, np.int32)
    for p, place_ahead in ((5, True), (9, False), (11, False), (3, False), (11, False)):
        pos = np.array([p], np.int32)
        got = kv.mask(seqs, pos, 256, 1)
        assert got.tobytes() == _mask_by_definition(kv, seqs, pos, 256, 1).tobytes(), p
        if place_ahead:
            kv.place(np.zeros(4, np.int32), np.arange(8, 12, dtype=np.int32))  # cells 6..9 at 8..11


def test_one_token_prefill_then_decode_reuses_the_graph(model):
    """llama.cpp's graph type is the same for prefill and decode: equal shapes reuse the graph."""
    ctx, rec, counters = context(model)
    ctx.prefill([5])
    with counters.expect(graphs_reused=1, graphs_rebuilt=0):
        ctx.decode([6])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=25))
def test_kv_cells_kept_state_matches_a_scan_of_the_cells(ops):
    """next_pos, n_kv and the cell place() picks, kept incrementally, equal what a scan of every cell gives."""
    kv = KvCells(512)
    for is_remove, seq, n in ops:
        if is_remove:
            kv.remove(seq)
        else:
            free = np.flatnonzero(kv.seq < 0)
            if free.size < n:
                continue
            start = kv.next_pos(seq)
            cells = kv.place(np.full(n, seq), start + np.arange(n))
            assert cells.tolist() == free[:n].tolist()
        for q in range(4):
            held = kv.pos[kv.seq == q]
            assert kv.next_pos(q) == (int(held.max()) + 1 if held.size else 0)
        used = np.flatnonzero(kv.seq >= 0)
        assert kv.n_kv() == padded_n_kv(int(used[-1]) + 1 if used.size else 0, 512)


def test_a_walk_freezes_what_was_built_before_it_and_collects_the_young_generation_less_often():
    import gc

    from graphdiag.runner import GC_YOUNG, steady_gc
    before = gc.get_threshold()
    gc.unfreeze()
    with steady_gc():
        assert gc.get_threshold()[0] == GC_YOUNG > before[0] and gc.get_freeze_count() > 0
        made = [[i] for i in range(10)]
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1           # cycles made during the walk are still collected
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0 and made

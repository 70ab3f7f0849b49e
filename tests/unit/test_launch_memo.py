"""LaunchMemo: a remembered lowering is exactly a fresh one; a field lowering reads misses; an address hits and
is written afresh."""

import pytest

from graphdiag.backends.gpu.capture import LoweredOps, lower_graph
from graphdiag.backends.gpu.fusion import fusion_plan
from graphdiag.backends.gpu.launch_memo import LaunchMemo
from graphdiag.backends.gpu.lowering import op_launches
from graphdiag.ir.dtypes import GGMLType
from graphdiag.ir.ops import Op
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model


def _graph(wtype=GGMLType.F16, n_tokens=1):
    m = create_model(PRESETS["tiny"], wtype, with_data=False)
    gtype = DECODE if n_tokens == 1 else PREFILL
    return build_graph(m, GraphParams(n_tokens, 1, 1, gtype, 256)).graph


def _lower(g, memo=None):
    return lower_graph(g, fusion_plan(g, 900), 900, memo=memo)


def _launches(ops):
    return [la for op in ops if op is not None for la in op_launches(op)]


def _bytes(ops):
    return [(la.kernel, la.grid, la.block, la.shmem, la.label, la.params.tobytes()) for la in _launches(ops)]


@pytest.mark.parametrize("wtype,n_tokens", [(GGMLType.F16, 1), (GGMLType.Q8_0, 1), (GGMLType.F16, 40)])
def test_a_remembered_lowering_is_a_fresh_one_in_new_objects(wtype, n_tokens):
    g = _graph(wtype, n_tokens)
    memo = LaunchMemo()
    first = _lower(g, memo)
    n_ops = sum(op is not None for op in first)
    assert (memo.hits, memo.misses) == (0, n_ops)
    again = _lower(g, memo)
    assert (memo.hits, memo.misses) == (n_ops, n_ops)
    assert _bytes(again) == _bytes(first) == _bytes(_lower(g))
    assert not {id(la) for la in _launches(first)} & {id(la) for la in _launches(again)}
    assert not {id(la.params.base) for la in _launches(first)} & {id(la.params.base) for la in _launches(again)}


def test_moved_addresses_hit_and_are_written_from_the_structs():
    g = _graph()
    memo = LaunchMemo()
    before = _bytes(_lower(g, memo))
    for k in range(g.n_nodes):
        g.node(k).data = 0x7000_0000 + 0x10000 * k
    hits = memo.hits
    after = _lower(g, memo)
    assert memo.hits - hits == sum(op is not None for op in after)
    assert _bytes(after) == _bytes(_lower(g)) != before


def _first(g, op):
    return next(g.node(i) for i in range(g.n_nodes) if g.node(i).op == op)


@pytest.mark.parametrize("change", ["op_param", "name", "source type", "source ne"])
def test_a_changed_field_misses(change):
    g = _graph(n_tokens=40)
    memo = LaunchMemo()
    _lower(g, memo)
    misses = memo.misses
    if change == "op_param":              # rms_norm's eps (fused with its MUL: the group's key holds both)
        node = _first(g, Op.RMS_NORM)
        node.set_param_f32(0, node.param_f32(0) * 2)
    elif change == "name":
        _first(g, Op.SOFT_MAX if any(g.node(i).op == Op.SOFT_MAX for i in range(g.n_nodes)) else Op.GLU).name = "x"
    elif change == "source type":         # the output mat-mul's weight: another kernel
        mm = [g.node(i) for i in range(g.n_nodes) if g.node(i).op == Op.MUL_MAT][-1]
        w = mm.src[0]
        g.arena.rec["type"][w.idx] = int(GGMLType.F32)
        g.arena.rec["nb"][w.idx] = (4, 4 * w.ne[0], 4 * w.ne[0] * w.ne[1], 4 * w.ne[0] * w.ne[1] * w.ne[2])
    else:                                 # a source's ne (the output weight's rows): another geometry
        mm = [g.node(i) for i in range(g.n_nodes) if g.node(i).op == Op.MUL_MAT][-1]
        g.arena.rec["ne"][mm.src[0].idx][1] -= 32
    fresh = _lower(g)
    got = _lower(g, memo)
    assert memo.misses - misses == 1
    assert _bytes(got) == _bytes(fresh)


def test_a_full_memo_starts_over_and_still_lowers_exactly():
    g = _graph()
    memo = LaunchMemo()
    memo.CAP = 5
    got = _lower(g, memo)
    assert 0 < len(memo.entries) <= 5
    assert _bytes(got) == _bytes(_lower(g)) == _bytes(_lower(g, memo))


@pytest.mark.parametrize("memo_warm", [False, True])
def test_ops_lowered_as_reached_are_the_whole_lowering(memo_warm):
    """LoweredOps lowers block by block as nodes are asked for (in any order): each node's op, and with a
    memo its hits and misses, are those of lowering the whole graph at once; a node past the lowered
    blocks is not lowered before it is asked for."""
    g = _graph(n_tokens=40)
    plan = fusion_plan(g, 900)
    memo, whole_memo = LaunchMemo(), LaunchMemo()
    if memo_warm:
        lower_graph(g, plan, 900, memo=memo)
        lower_graph(g, plan, 900, memo=whole_memo)
    whole = lower_graph(g, plan, 900, memo=whole_memo)
    lazy = LoweredOps(g, plan, 900, memo=memo)
    launching = [i for i, op in enumerate(whole) if op is not None]
    assert len(launching) > 2 * LoweredOps.FIRST_BLOCK
    first = lazy[launching[0]]
    assert first is not None and lazy._ops[launching[-1]] is None      # one block lowered, not the rest
    order = launching[::-1][: len(launching) // 2] + launching       # backwards, then in order
    got = [None] * len(whole)
    for i in order:
        got[i] = lazy[i]
    assert [op is None for op in got] == [op is None for op in whole]
    assert _bytes(got) == _bytes(whole) == _bytes(list(lazy))
    assert (memo.hits, memo.misses) == ((len(launching), len(launching)) if memo_warm else (0, len(launching)))


@pytest.mark.parametrize("wtype,n_tokens", [(GGMLType.F16, 1), (GGMLType.Q8_0, 1), (GGMLType.F16, 40)])
def test_block_descriptor_tables_write_what_the_structs_say(wtype, n_tokens):
    """Each block's DescriptorTable gathers its node range's descriptors: every launch is byte for byte
    the one lower_node makes reading each descriptor from the structs (no table)."""
    from graphdiag.backends.gpu.lowering import lower_node
    g = _graph(wtype, n_tokens)
    plan = fusion_plan(g, 900)
    ops = lower_graph(g, plan, 900)
    direct = [None if op is None else lower_node(g, i, plan.get(i), 900, None) for i, op in enumerate(ops)]
    strip = lambda xs: [(k, gr, b, s, p) for k, gr, b, s, _, p in xs]      # labels come from LoweredOps
    assert strip(_bytes(ops)) == strip(_bytes(direct)) and len(_launches(ops)) > 20


def test_a_block_whose_lowering_raised_is_lowered_again_not_skipped(monkeypatch):
    """A lowering error inside a block leaves that block to be lowered at the next ask (the step that
    raised is reported; a later step of the same graph must not find its nodes without ops)."""
    import graphdiag.backends.gpu.lowering as L
    g = _graph(n_tokens=40)
    plan = fusion_plan(g, 900)
    whole = lower_graph(g, plan, 900)
    launching = [i for i, op in enumerate(whole) if op is not None]
    bad = launching[LoweredOps.FIRST_BLOCK + 3]          # in the second block
    real, calls = L.lower_node, []

    def flaky(graph, i, *a):
        calls.append(i)
        if i == bad and calls.count(i) == 1:
            raise RuntimeError("lowering failed")
        return real(graph, i, *a)

    monkeypatch.setattr(L, "lower_node", flaky)
    lazy = LoweredOps(g, plan, 900, memo=LaunchMemo())
    assert lazy[launching[0]] is not None
    with pytest.raises(RuntimeError, match="lowering failed"):
        lazy[bad]
    assert lazy[bad] is not None and calls.count(bad) == 2
    assert _bytes(list(lazy)) == _bytes(whole)


class _CountingDriver:
    """prepare() as a driver's: a fresh handle (a private snapshot of the params) per call, counted."""

    def __init__(self):
        self.prepared = 0

    def prepare(self, launch):
        self.prepared += 1
        launch.handle = ("handle", launch.params.tobytes())
        return launch

    def launch(self, stream, launch):
        assert launch.handle == ("handle", launch.params.tobytes()), "launched with a stale handle"


class _Pool:
    def __init__(self, addr):
        self.addr = addr

    def alloc(self, n):
        return self.addr, n

    def free(self, addr, n):
        pass


def _prepare_and_run(ops, drv, pool):
    for op in ops:
        if op is not None and not op.ready:
            op.prepare(drv)
    for op in ops:
        if op is not None and hasattr(op, "slots"):
            op.run(drv, None, pool)


@pytest.mark.parametrize("wtype", [GGMLType.F16, GGMLType.Q8_0])
def test_an_unchanged_rebuild_takes_the_prepared_handles(wtype):
    """An eager step rebuilds the same graph at the same addresses: its launches keep the handles prepared
    the step before (no packing per step), each handle a snapshot of exactly the launch's bytes; Q8_0's
    scratch ops (Q8_1 activations) too while the pool hands out the same buffer, re-packed when it does not."""
    g = _graph(wtype)
    memo, drv, pool = LaunchMemo(), _CountingDriver(), _Pool(0x9000_0000)
    first = _lower(g, memo)
    _prepare_and_run(first, drv, pool)
    n = drv.prepared
    assert n >= len(_launches(first))
    again = _lower(g, memo)
    assert all(op.ready for op in again if op is not None)
    _prepare_and_run(again, drv, pool)
    assert drv.prepared == n
    for la in _launches(again):
        assert la.handle == ("handle", la.params.tobytes())
    scratch = [op for op in again if op is not None and hasattr(op, "slots")]
    assert scratch                               # (flash attention's partials; Q8_0 also its Q8_1 activations)
    pool.addr = 0xA000_0000                      # another buffer: the scratch launches are packed again
    third = _lower(g, memo)
    _prepare_and_run(third, drv, pool)
    assert drv.prepared == n + sum(op.n_launches for op in scratch)
    for la in _launches(third):
        assert la.handle == ("handle", la.params.tobytes())


def test_a_moved_node_is_prepared_afresh():
    g = _graph()
    memo, drv, pool = LaunchMemo(), _CountingDriver(), _Pool(0x9000_0000)
    _prepare_and_run(_lower(g, memo), drv, pool)
    n = drv.prepared
    g.node(g.n_nodes - 1).data += 0x1000                 # result_output elsewhere: its launch's bytes differ
    again = _lower(g, memo)
    assert sum(op is not None and not op.ready for op in again) >= 1
    _prepare_and_run(again, drv, pool)
    assert n < drv.prepared
    for la in _launches(again):
        assert la.handle == ("handle", la.params.tobytes())

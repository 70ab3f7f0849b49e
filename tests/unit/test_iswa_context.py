"""The context over llama.cpp's iSWA cache (Gemma 3): both caches' inputs written each step, the F16 masks,
n_kv per cache and the reuse reasons, and a failed step rolled back from both caches."""

import dataclasses

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.cpu import CpuBackend
from graphdiag.counters import Counters
from graphdiag.memory import AddressSpace
from graphdiag.model.presets import PRESETS
from graphdiag.model.reference import Reference
from graphdiag.model.weights import create_model
from graphdiag.sched.context import make_context
from graphdiag.sched.iswa import IswaCells

# gemma3-tiny with 2 layers (0 sliding, 1 global), a 16-position window: SWA cache 768 cells
CFG = dataclasses.replace(PRESETS["gemma3-tiny"], n_layer=2, n_vocab=512, n_ctx=1024, n_swa=16,
                          swa_layers=(True, False))


@pytest.fixture(scope="module")
def model():
    return create_model(CFG, seed=5)


def context(model):
    cpu = CpuBackend("CPU")
    gs = AddressSpace(base=0x7000_0000_0000, name="GPU")
    gpu = CpuBackend("GPU", space=gs, resolve=[gs, cpu.space])
    bus, rec = E.EventBus(), E.Recorder()
    bus.subscribe(rec)
    bus.subscribe(Counters())
    return make_context(model, [gpu, cpu], bus), rec


def _written(ctx):
    """The inputs the last step sent (the slot before the current one), by name."""
    stages, views = ctx._inputs.slots[ctx._slot ^ 1]
    names = ("tokens", "pos", "mask", "k_idxs", "v_idxs", "out_ids", "mask_swa", "k_idxs_swa", "v_idxs_swa")
    return dict(zip(names, views))


def _window_mask(seq_of, pos_of, p1, n_swa=None):
    ok = (seq_of == 0) & (pos_of >= 0) & (pos_of <= p1)
    if n_swa is not None:
        ok &= p1 - pos_of < n_swa
    return np.where(ok, 0.0, -np.inf).astype(np.float32)


def test_each_step_writes_both_caches_masks_and_idxs(model):
    ctx, rec = context(model)
    assert isinstance(ctx.kv, IswaCells) and ctx.kv.swa.size == 768
    ctx.prefill(list(range(1, 41)))
    for t in range(5):
        ctx.decode([t + 3])
    inp = _written(ctx)
    assert inp["mask"].dtype == np.float16 and inp["mask_swa"].dtype == np.float16
    kv = ctx.kv
    p1 = 44
    np.testing.assert_array_equal(inp["mask"][0], _window_mask(kv.base.seq[:256], kv.base.pos[:256], p1))
    np.testing.assert_array_equal(inp["mask_swa"][0], _window_mask(kv.swa.seq[:256], kv.swa.pos[:256], p1, 16))
    assert np.count_nonzero(inp["mask_swa"][0] == 0) == 16 and np.count_nonzero(inp["mask"][0] == 0) == 45
    assert inp["k_idxs"].tolist() == [44] and inp["k_idxs_swa"].tolist() == [44]
    assert (ctx.res.params.n_kv, ctx.res.params.n_kv_swa) == (256, 256)


@pytest.mark.slow
def test_logits_match_the_oracle_and_the_swa_n_kv_stops_at_its_size(model):
    ctx, rec = context(model)
    ref = Reference(model)
    toks = list(range(1, 501))
    np.testing.assert_allclose(ctx.prefill(toks), ref.prefill(toks), rtol=0, atol=2e-3)
    for step in range(300):                          # positions 500..799: the SWA cache (768 cells) wraps
        got, want = ctx.decode([step % 97 + 1]), ref.decode([step % 97 + 1])
        if step % 50 == 0 or step > 265:
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())
    assert (ctx.res.params.n_kv, ctx.res.params.n_kv_swa) == (1024, 768)
    assert ctx.kv.swa.seq_pos_min(0) == 800 - 768 and ctx.kv.base.next_pos(0) == 800
    reasons = [e.reason for e in rec.of(E.ContextDecision) if not e.reused]
    assert reasons[2:] == ["n_kv 512→768, n_kv (SWA) 512→768", "n_kv 768→1024"]


def test_a_failed_step_is_rolled_back_from_both_caches(model):
    ctx, rec = context(model)
    ctx.prefill(list(range(1, 31)))
    ctx.decode([5])
    before = (ctx.kv.base.seq.copy(), ctx.kv.base.pos.copy(), ctx.kv.swa.seq.copy(), ctx.kv.swa.pos.copy(),
              ctx.kv.swa.head)
    compute = ctx.sched.graph_compute

    def fail(graph):
        raise RuntimeError("injected")
    ctx.sched.graph_compute = fail
    with pytest.raises(RuntimeError):
        ctx.decode([6])
    ctx.sched.graph_compute = compute
    after = (ctx.kv.base.seq, ctx.kv.base.pos, ctx.kv.swa.seq, ctx.kv.swa.pos, ctx.kv.swa.head)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    removed = rec.of(E.CellsRemoved)
    assert [(e.seq, e.pos_min, e.n_cells) for e in removed] == [(0, 31, 1)]
    # the retried step decodes as a context that never failed
    fresh, _ = context(model)
    fresh.prefill(list(range(1, 31)))
    fresh.decode([5])
    np.testing.assert_array_equal(ctx.decode([6]), fresh.decode([6]))

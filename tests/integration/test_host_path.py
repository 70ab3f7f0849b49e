"""The replay path's host work (issue 9.2) and the per-stream pools: fewer copies and walks, same decisions."""

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.gpu import runtime as rt_mod
from graphdiag.config import resolve
from graphdiag.counters import Counters
from graphdiag.ir.dtypes import GGMLType
from graphdiag.plan import StepPlan
from graphdiag.runner import RunResult, Session, Stepper


def _session(**kw):
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, **kw}, environ={})
    s = Session(cfg, E.EventBus())
    return s, Stepper(s, RunResult({}, [], Counters()))


def _device_inputs(s):
    """The graph's inputs as they landed on the device; the mask (F16 at 0c1e57098, F32 under d99724f2) as
    float32."""
    inp = s.ctx.res.inputs
    get = lambda t, dt: s.gpu.tensor_get(t.data, t.nbytes()).view(dt)
    mask_dt = np.float16 if inp.kq_mask.type == GGMLType.F16 else np.float32
    return {"tokens": get(inp.tokens, np.int32), "pos": get(inp.pos, np.int32),
            "mask": get(inp.kq_mask, mask_dt).astype(np.float32).reshape(-1, inp.kq_mask.ne[0]),
            "k_idxs": get(inp.k_idxs, np.int32), "v_idxs": get(inp.v_idxs, np.int32),
            "out_ids": get(inp.out_ids, np.int32)}


def _watch_inputs(s) -> list[dict]:
    """_device_inputs of each compute from now on, taken as it starts: after the step's copies, before its
    nodes run (a node may take an input's memory after the input's last reader, as ggml-alloc lets it)."""
    seen = []
    real = s.ctx.sched.graph_compute
    s.ctx.sched.graph_compute = lambda graph: seen.append(_device_inputs(s)) or real(graph)
    return seen


def test_a_runs_logits_are_read_in_place_and_a_bare_contexts_are_copies():
    """The stepper's steps take their logits from the backend's pinned read buffer, read-only, with no copy
    (as llama.cpp's, valid until the next decode); a context used on its own hands out fresh arrays."""
    s, st = _session()
    try:
        seen = []
        real = s.ctx.read_logits
        s.ctx.read_logits = lambda: seen.append(real()) or seen[-1]
        for _ in range(4):
            st.step(StepPlan("decode", batch=1))
        read = s.gpu._pinned["read"]
        assert all(np.shares_memory(x, read) and not x.flags.writeable for x in seen)
        assert st.next_tok[0] == int(seen[-1].argmax())
        s.ctx.logits_in_place = False
        mine = s.ctx.decode([3])
        assert mine.flags.writeable and not np.shares_memory(mine, read)
    finally:
        s.close()


def test_the_in_place_logits_view_is_kept_while_the_read_buffer_and_size_stay():
    """Steps of one graph get the same read-only logits array (no view, flags or reshape per step), holding
    each step's own logits; a read of another size, or after the buffer grew, gets a view of its own."""
    s, st = _session()
    try:
        seen = []
        real = s.ctx.read_logits
        s.ctx.read_logits = lambda: seen.append((real(), None)) or seen[-1][0]
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
            t = s.ctx.res.logits
            seen[-1] = (seen[-1][0], s.gpu.tensor_get(t.data, t.nbytes()).view(np.float32).reshape(1, -1))
        assert seen[1][0] is seen[2][0] and not seen[2][0].flags.writeable
        assert np.array_equal(seen[2][0], seen[2][1])
        s.ctx.logits_in_place = True
        many = s.ctx.prefill([5, 6, 7, 8, 9], all_logits=True)     # 5 rows: another size, a grown buffer
        t = s.ctx.res.logits
        assert many.shape == (5, t.ne[0]) and many is not seen[2][0]
        assert np.array_equal(many, s.gpu.tensor_get(t.data, t.nbytes()).view(np.float32).reshape(5, -1))
        assert np.shares_memory(many, s.gpu._pinned["read"]) and not many.flags.writeable
    finally:
        s.close()


def test_a_replayed_step_writes_its_inputs_in_one_batch_from_pinned_memory():
    """One batch of asynchronous copies on stream 0, one copy per input: the decode graph sits in the plan of
    the context's 512-token reserve, so its small inputs are blocks apart (llama.cpp copies each too)."""
    s, st = _session()
    allocs = []
    real_alloc = s.driver.host_alloc
    s.driver.host_alloc = lambda n: allocs.append(n) or real_alloc(n)
    try:
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        assert len(allocs) == 3                         # page-locked: two input slots, one read buffer
        batches = []
        real = s.driver.copies_issue
        s.driver.copies_issue = lambda prepared, stream: batches.append((len(prepared), stream)) or real(prepared,
                                                                                                         stream)
        landed = _watch_inputs(s)
        token = st.next_tok[0]
        st.step(StepPlan("decode", batch=1))
        assert batches == [(6, s.gpu.stream0)]          # tokens, pos, k_idxs, v_idxs, mask, out_ids
        got = landed[-1]                                 # and each input landed where it belongs
        cell = int(np.flatnonzero(s.ctx.kv.seq >= 0)[-1])
        assert got["tokens"].tolist() == [token] and got["pos"].tolist() == [3]
        assert got["k_idxs"].tolist() == got["v_idxs"].tolist() == [cell] and got["out_ids"].tolist() == [0]
        want = np.full_like(got["mask"], -np.inf)
        want[0, :4] = 0.0
        assert np.array_equal(got["mask"], want)
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        assert len(allocs) == 3                         # nothing allocated per step
        inputs = [s.gpu._pinned[f"inputs{i}"] for i in (0, 1)]
        st.step(StepPlan("decode", batch=2))            # a rebuilt graph: its stages take the same memory
        assert all(s.gpu._pinned[f"inputs{i}"] is inputs[i] for i in (0, 1))
        got = landed[-1]
        assert got["pos"].tolist() == [7, 0] and got["out_ids"].tolist() == [0, 1]
    finally:
        s.close()


@pytest.mark.parametrize("upstream", ["0c1e57098", "d99724f2"])
def test_prefills_at_growing_n_kv_pin_their_inputs_once(upstream):
    """The input slots are reserved for the batch's mask at n_ctx cells when first made (as llama.cpp sizes
    its input buffers for the worst case): later prefills of that size, at every larger n_kv, pin nothing.
    The mask is F16 (0c1e57098) or F32 (d99724f2), stamped out again at each n_kv (GraphTemplates)."""
    s, st = _session(upstream=upstream)
    allocs = []
    real_alloc = s.driver.host_alloc
    s.driver.host_alloc = lambda n: allocs.append(n) or real_alloc(n)
    try:
        st.step(StepPlan("prefill", n_tokens=200))
        first = len(allocs)
        seen = set()
        for _ in range(6):
            st.step(StepPlan("prefill", n_tokens=200))
            seen.add(s.ctx.res.inputs.kq_mask.ne[0])
        assert len(seen) >= 4 and allocs[first:] == []
        landed = _watch_inputs(s)                        # (reading the device grows the read buffer)
        st.step(StepPlan("prefill", n_tokens=200))
        got = landed[-1]                                 # the last prefill's mask landed whole
        pos = got["pos"]
        want = np.where(np.arange(got["mask"].shape[1])[None, :] <= pos[:, None], 0.0, -np.inf)
        assert np.array_equal(got["mask"][:len(pos)], want.astype(np.float32))
    finally:
        s.close()


def test_writing_inputs_waits_for_copies_still_in_flight():
    """Copies from page-locked memory run asynchronously: a stage whose last send was not followed by a
    synchronisation waits before its views are written again."""
    s, st = _session()
    try:
        st.step(StepPlan("decode", batch=1))
        stage = s.ctx._inputs.slots[s.ctx._slot][0][0]
        syncs = []
        real = s.gpu.synchronize
        s.gpu.synchronize = lambda: syncs.append(1) or real()
        stage.writable()
        assert syncs == []                               # the step's read-back synchronised after the send
        stage.send()
        stage.writable()
        assert syncs == [1]
    finally:
        s.close()


def test_the_compatibility_walk_runs_only_when_the_uid_changes(monkeypatch):
    calls = []
    real = rt_mod.check_compatibility
    monkeypatch.setattr(rt_mod, "check_compatibility", lambda g, cc: calls.append(g.uid) or real(g, cc))
    s, st = _session()
    try:
        for _ in range(6):
            st.step(StepPlan("decode", batch=1))
        assert len(calls) == len(set(calls)) == 1       # decode graph reused: one uid, one walk
    finally:
        s.close()


def test_each_stream_has_its_own_pool_and_any_pool_invalidates_everything():
    s, st = _session(concurrent_streams=True, wtype="q8_0", pool_invalidation=True)   # the article's rule
    seen = []
    s.bus.subscribe(seen.append)
    try:
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        assert len(s.gpu.pools) >= 2                     # Q8_1 scratch taken on the branch streams too
        branch = next(p for k, p in s.gpu.pools.items() if p is not s.gpu.pool)
        assert branch.n_device_allocs >= 1
        branch.invalidate("alloc failure", 0)
        assert any(isinstance(e, E.PoolInvalidated) for e in seen)
        assert not s.gpu.runtime.cache.entries
    finally:
        s.close()
    assert not s.gpu.pools


def test_the_oracle_rounds_activations_to_q8_1_only_for_the_gpu_backend():
    from support.simrun import of, run_sim
    sim = run_sim(wtype="q8_0", steps=2, prompt_tokens=1, oracle=True)
    assert max(c.rel_err for c in of(sim, E.OracleCheck)) < 1e-5      # the GPU path's own arithmetic
    cpu = run_sim(wtype="q8_0", steps=2, prompt_tokens=1, oracle=True, backend="cpu")
    assert max(c.rel_err for c in of(cpu, E.OracleCheck)) < 1e-3      # plain float products
    assert {c.bound for c in of(cpu, E.OracleCheck)} == {1e-3}


def test_a_q8_0_gpu_run_is_checked_within_the_q8_1_noise():
    """8 prompt tokens: one activation on a Q8_1 rounding midpoint sends the run ~1e-2 from the oracle
    (the quantisation noise itself); the bound says so and the run passes."""
    from support.simrun import of, run_sim
    r = run_sim(wtype="q8_0", steps=2, prompt_tokens=8, oracle=True)
    checks = of(r, E.OracleCheck)
    assert all(c.ok for c in checks) and not r.failures
    assert all(c.noise and c.bound == max(2 * c.noise, 1e-3) for c in checks)   # the bound follows the noise
    assert max(c.rel_err for c in checks) > 1e-3


def test_the_input_copy_grouping_is_worked_out_once_per_placement(monkeypatch):
    from graphdiag.backends.gpu import backend as be_mod
    from graphdiag.backends.gpu.backend import _copy_runs
    calls = []
    monkeypatch.setattr(be_mod, "_copy_runs", lambda layout, a: calls.append(layout) or _copy_runs(layout, a))
    s, st = _session()
    try:
        for _ in range(6):
            st.step(StepPlan("decode", batch=1))
        assert len(calls) == 2 and len(set(calls)) == 1  # one reused decode graph: one layout, two slots
    finally:
        s.close()
    # adjacent allocator blocks (CUDA's: 128-byte aligned) join one run, a gap starts another; offsets are
    # from the run's start
    assert _copy_runs(((0x1080, 8), (0x1000, 4), (0x2000, 4), (0x2100, 4)), 128) == [
        (0x1000, 0x88, [(1, 0), (0, 0x80)]), (0x2000, 4, [(2, 0)]), (0x2100, 4, [(3, 0)])]


def test_the_step_timers_are_read_without_a_second_synchronisation():
    s, st = _session()
    try:
        st.step(StepPlan("decode", batch=1))
        syncs = []
        real = s.gpu.synchronize
        s.gpu.synchronize = lambda: syncs.append(1) or real()
        st.step(StepPlan("decode", batch=1))
        assert syncs == [1]                              # the read-back's; the GPU time needs no other
        s.ctx.recompute()                                # computed, nothing read back yet
        assert s.gpu.collect_gpu_ns() > 0 and syncs == [1, 1]
    finally:
        s.close()


def test_a_steps_gpu_time_is_read_after_the_next_launch_and_its_events_are_reused():
    """Between a replayed step's read-back and the next graph launch no timing event is queried: a step's GPU
    time is read once the next step's work is queued, yet every sink (plain, internal) gets it filled in, and
    the timing events go back to be used again (a long run makes no more than a few pairs)."""
    s, st = _session()
    plain, internal = E.Recorder(), E.Recorder()
    s.bus.subscribe(plain)
    try:
        st.run([StepPlan("decode", batch=1)] * 4)
        drv = s.gpu.driver
        log = []
        for name in ("event_elapsed_ms", "graph_launch", "stream_synchronize"):
            real = getattr(drv, name)
            setattr(drv, name, lambda *a, _r=real, _n=name: log.append(_n) or _r(*a))
        st.run([StepPlan("decode", batch=1)] * 40)
        between = []            # what came between each read-back and the launch after it
        for name in log:
            if name == "stream_synchronize":
                between.append([])
            elif between:
                between[-1].append(name)
        assert [b for b in between[:-1] if b[0] != "graph_launch"] == []
        assert log.count("event_elapsed_ms") == 40
        finished = plain.of(E.StepFinished)
        assert len(finished) == 44 and all(e.gpu_ns > 0 for e in finished)
        assert len(s.gpu._timers) <= 3
        s.bus.subscribe(internal, internal=True, kinds=(E.StepFinished,))
        st.run([StepPlan("decode", batch=1)] * 3)
        assert [e.gpu_ns > 0 for e in internal.events] == [True] * 3
    finally:
        s.close()


_TIMELINE = [{"at_step": 4, "alternate_batches": [1, 2]}, {"at_step": 8, "batch": 1},
             {"at_step": 10, "prefill": 40}, {"at_step": 12, "idle_s": 30.0}, {"at_step": 14, "batch": 3}]


def _comparable(events):
    """The events without what host timing decides (stamps, durations), graph uids numbered in order of
    appearance (the counter is the process's)."""
    import dataclasses
    uids: dict[int, int] = {0: 0}
    num = lambda u: uids.setdefault(u, len(uids))
    out = []
    for e in events:
        d = {k: v for k, v in dataclasses.asdict(e).items() if not k.endswith(("_ns", "_us"))}
        for k in ("uid", "old_uid"):
            if k in d:
                d[k] = num(d[k])
        if "uids" in d:
            d["uids"] = tuple(num(u) for u in d["uids"])
        out.append((type(e).__name__, d))
    return out


def test_preparing_the_next_step_early_changes_no_decision_token_or_logit(monkeypatch):
    """The next decode step's placement and inputs are done while the GPU computes this step
    (Context.prepare_decode): across batch changes, a prefill, an idle eviction and n_kv 256 -> 512, the
    events, tokens, --verify and --oracle are those of the run that does everything in the step."""
    from support.simrun import of, run_sim
    from graphdiag.sched.context import Context
    early = []
    real = Context._write_inputs
    monkeypatch.setattr(Context, "_write_inputs", lambda self, kept, slot, tokens, *a:
                        early.append(tokens is None) or real(self, kept, slot, tokens, *a))
    kw = dict(timeline=_TIMELINE, steps=18, prompt_tokens=245, verify=True, oracle=True)
    piped = run_sim(**kw)
    assert sum(early) >= 8                 # most decode steps had their inputs written ahead
    monkeypatch.setattr("graphdiag.runner.Stepper._prepare_next", lambda self: None)
    plain = run_sim(**kw)
    assert not piped.failures and not plain.failures
    assert piped.tokens == plain.tokens
    assert _comparable(piped.events) == _comparable(plain.events)
    assert {e.n_kv for e in of(piped, E.StepStarted)} == {256, 512}
    assert all(v.ok for v in of(piped, E.VerifyResult)) and of(piped, E.VerifyResult)


def test_a_prepared_step_must_be_the_one_decoded():
    from graphdiag.errors import InternalError
    s, st = _session()
    try:
        st.step(StepPlan("decode", batch=1))
        s.ctx.prepare_decode([0])
        with pytest.raises(InternalError, match="after preparing"):
            s.ctx.decode({0: 1, 1: 1})
    finally:
        s.close()


def test_scattered_inputs_go_to_the_driver_as_one_batch_of_copies():
    """After a prefill the decode graph's inputs are not adjacent (several runs): the stage still hands
    the driver one batch per step (one cuMemcpyBatchAsync on CUDA), and each input lands in place."""
    s, st = _session()
    try:
        st.step(StepPlan("prefill", n_tokens=200))
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        batches = []
        real = s.driver.copies_issue
        s.driver.copies_issue = lambda prepared, stream: batches.append(len(prepared)) or real(prepared, stream)
        landed = _watch_inputs(s)
        st.step(StepPlan("decode", batch=1))
        assert len(batches) == 1 and batches[0] > 1
        got = landed[-1]
        assert got["pos"].tolist() == [203] and got["out_ids"].tolist() == [0]
        assert (got["mask"][0, :204] == 0).all() and np.isneginf(got["mask"][0, 204:]).all()
    finally:
        s.close()


def test_uid_miss_digests_are_worked_out_at_flush_from_the_ledger_the_decision_took():
    """UidMiss's digests are filled in when the held events are delivered, after the step's work is queued
    (not before its first kernel), and they are those of the snapshot the runtime compared: equal for a graph
    seen again, and what ledger.props_digest / shape_digest give for the entry's ledger."""
    from graphdiag.backends.gpu.ledger import props_digest, shape_digest
    s, st = _session()
    try:
        rec = s.bus.subscribe(E.Recorder())
        hashed = []
        real = rt_mod.props_digest
        rt_mod.props_digest = lambda snap: hashed.append(len(snap)) or real(snap)
        queued = []
        real_launch = s.gpu.driver.launch
        s.gpu.driver.launch = lambda *a: queued.append(len(hashed)) or real_launch(*a)
        try:
            st.step(StepPlan("prefill", n_tokens=6))
        finally:
            rt_mod.props_digest, s.gpu.driver.launch = real, real_launch
        assert queued and queued[-1] == 0 and hashed   # none before the last launch; done by the step's end
        misses = rec.of(E.UidMiss)
        assert misses and all(len(m.props_digest) == 16 and len(m.shape_digest) == 16 for m in misses)
        entry = s.gpu.runtime.cache.entries[misses[-1].key]
        assert misses[-1].props_digest == props_digest(entry.props)
        assert misses[-1].shape_digest == shape_digest(entry.props)
    finally:
        s.close()

"""The capture/replay runtime on the simulated driver: one test per behaviour of the graph path."""

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.runner import Session, Stepper, RunResult
from graphdiag.counters import Counters
from graphdiag.plan import StepPlan

from support.simrun import of, phases, run_sim


def test_steady_decode_eager_capture_replay_and_replay_equals_eager():
    r = run_sim(steps=8, verify=True)
    p = phases(r)
    assert p[0] == "eager" and p[1] == "eager" and p[2] == "capture"   # step 0 is the prefill
    assert all(p[s] == "replay" for s in range(3, 9))
    hits = {e.step for e in of(r, E.UidHit)}
    assert set(range(3, 9)) <= hits
    ver = of(r, E.VerifyResult)
    assert [v.step for v in ver] == list(range(3, 9)) and all(v.ok and v.max_abs_diff == 0 for v in ver)
    assert r.counters.captures == 1 and r.counters.instantiates == 1 and r.counters.replays == 6
    # the same tokens with graphs disabled: capture and replay compute what eager computes
    ref = run_sim(steps=8, env={"GGML_CUDA_DISABLE_GRAPHS": "1"})
    assert ref.tokens == r.tokens


def test_replay_step_launches_no_kernel_eagerly():
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4}, environ={})
    bus = E.EventBus()
    s = Session(cfg, bus)
    try:
        st = Stepper(s, RunResult({}, [], Counters()))
        for _ in range(3):
            st.step(StepPlan("decode", batch=1))
        c = s.driver.counters
        launches, graphs = c.launches, c.graph_launches
        st.step(StepPlan("decode", batch=1))
        assert c.launches == launches and c.graph_launches == graphs + 1
    finally:
        s.close()


def test_batch_change_names_node_and_field_resets_warmup_and_recaptures():
    r = run_sim(steps=10, timeline=[{"at_step": 5, "batch": 2}])
    diffs = [d for d in of(r, E.PropertyDiff) if d.step == 5]
    assert diffs, "the ledger must report the first differing node"
    d = diffs[0]
    assert d.node == 0 and d.node_name == "embd" and d.field == "ne[1]" and (d.old, d.new) == ("1", "2")
    resets = [w for w in of(r, E.WarmupTransition) if w.to_state == "cold"]
    assert [w.step for w in resets] == [5]
    p = phases(r)
    assert p[5] == "eager" and p[6] == "capture" and p[7] == "replay"
    # 1 -> 2 tokens drops the one-column fusions: more kernels, so the update is refused (as on the H200)
    outcome = [e for e in of(r, E.ChunkUpdated, E.UpdateRefused, E.ChunkInstantiated) if e.step == 6]
    assert [type(e) for e in outcome] == [E.UpdateRefused, E.ChunkInstantiated]
    assert outcome[0].reason == "TOPOLOGY_CHANGED" and outcome[1].after_refusal


def test_n_kv_crossing_256_recaptures_through_a_successful_update():
    r = run_sim(prompt_tokens=250, steps=12)
    ctx = [c for c in of(r, E.ContextDecision) if not c.reused and "n_kv" in c.reason]
    assert ctx and ctx[0].reason == "n_kv 256→512"
    step = ctx[0].step
    assert any(d.step == step for d in of(r, E.PropertyDiff))
    p = phases(r)
    assert p[step] == "eager" and p[step + 1] == "capture" and p[step + 2] == "replay"
    upd = [e for e in of(r, E.ChunkUpdated, E.UpdateRefused, E.ChunkInstantiated) if e.step == step + 1]
    assert upd and all(isinstance(e, E.ChunkUpdated) for e in upd)


def _launches(r, step):
    return [e.n_launches for e in of(r, E.CaptureRun, E.EagerRun) if e.step == step]


def test_batch_1_to_2_drops_the_one_column_fusions_update_refused_topology_then_reinstantiated():
    """Upstream fuses gate/up+GLU and mat-vec+residual ADD only when the mat-vec writes one column: 1 token
    launches fewer kernels than 2, so the recapture after 1 -> 2 cannot update the executable."""
    r = run_sim(batch=1, prompt_tokens=1, steps=8, timeline=[{"at_step": 6, "batch": 2}])
    fus1 = [e.pattern for e in of(r, E.FusionApplied) if e.step == 0]
    fus2 = [e.pattern for e in of(r, E.FusionApplied) if e.step == 6]
    # the last layer's attention output goes through inp_out_ids' GET_ROWS before its ADD: 7 of 8 fuse
    assert fus1.count("mul_mat_vec+glu") == 4 and fus1.count("mul_mat_vec+add") == 7
    assert "mul_mat_vec+glu" not in fus2 and "mul_mat_vec+add" not in fus2
    # real ggml on these shapes (measured on the H200): 24 fusions at 1 token, 13 at 2
    assert len(fus1) == 24 and len(fus2) == 13      # 13 = rms_norm+mul x 9 + rope+view+set_rows x 4
    assert _launches(r, 7)[0] > _launches(r, 1)[0]
    refused = [e for e in of(r, E.UpdateRefused) if e.step == 7]
    assert refused and refused[0].reason == "TOPOLOGY_CHANGED" and refused[0].error_node == ""
    inst = [e for e in of(r, E.ChunkInstantiated) if e.step == 7]
    assert inst and inst[0].after_refusal


def test_batch_8_to_9_keeps_the_topology_and_updates_in_place():
    # steps 0-7: one prompt token per sequence; decode from step 8 with 8 sequences, 9 from step 12
    r = run_sim(batch=8, prompt_tokens=1, steps=10, timeline=[{"at_step": 12, "batch": 9}])
    fus8 = [e.pattern for e in of(r, E.FusionApplied) if e.step == 8]
    fus9 = [e.pattern for e in of(r, E.FusionApplied) if e.step == 12]
    assert fus8 and fus8 == fus9 and "mul_mat_vec+glu" not in fus8
    p = phases(r)
    assert p[12] == "eager" and p[13] == "capture" and p[14] == "replay"
    out = [e for e in of(r, E.ChunkUpdated, E.UpdateRefused, E.ChunkInstantiated) if e.step == 13]
    assert out and all(isinstance(e, E.ChunkUpdated) for e in out)


def _boundaries(r, step):
    return [e for e in of(r, E.ChunkBoundary) if e.step == step]


@pytest.mark.parametrize("chunk,expect", [(0, 1), (512, 1), (64, 3)])   # tiny: 130 nodes
def test_chunk_counts(chunk, expect):
    r = run_sim(steps=4, chunk_size=chunk)
    assert len(_boundaries(r, 2)) == expect
    assert [e.n_chunks for e in of(r, E.ReplayLaunched)][0] == expect


def test_chunk_size_one_gives_a_chunk_per_launching_or_view_node_and_never_splits_fusions_or_regions():
    r = run_sim(steps=3, chunk_size=1, concurrent_streams=True)
    b = _boundaries(r, 2)
    n_nodes = b[-1].end_node
    fusions = [(e.node, e.absorbed) for e in of(r, E.FusionApplied) if e.step == 1]
    regions = [(e.fork_node, e.join_node) for e in of(r, E.ConcurrentRegion)]
    assert regions, "concurrent Q/K/V regions must be found"
    # the fork (attn_norm) is absorbed by rms_norm+mul, so its region starts at the next node, after that
    # node's boundary test (the article's loop order): a boundary falls right after the fused fork
    inside = {j for f, j0 in regions for j in range(f + 2, j0 + 1)} | {j for i, a in fusions for j in range(i + 1, i + a + 1)}
    starts = {e.start_node for e in b}
    assert not (starts & inside)
    assert {f + 1 for f, _ in regions} <= starts
    assert len(b) == n_nodes - len(inside)
    assert any(e.moved_by == "concurrent region" for e in b)
    assert any(e.moved_by == "fusion" for e in b)


def test_shrinking_graph_destroys_leftover_executables():
    # 2 tokens have no one-column fusions, 1 token has them: with one chunk per node, 1 token has fewer chunks
    r = run_sim(batch=2, prompt_tokens=1, steps=8, chunk_size=1, timeline=[{"at_step": 6, "batch": 1}])
    caps = {e.step: e.n_chunks for e in of(r, E.CaptureRun)}
    n2, n1 = caps[3], caps[7]
    gone = [e for e in of(r, E.ChunksDestroyed) if e.step == 7]
    assert n1 == n2 - (2 + 1 + 1) * 4 + 1  # per layer: gate/up+GLU absorbs two nodes, two mat-vec+ADD one
                                           # each (but the last layer's attention output: a GET_ROWS first)
    assert gone and gone[0].first == n1 and gone[0].count == n2 - n1


def test_moe_f16_prefill_within_the_mmf_column_limit_is_eligible():
    r = run_sim(model="moe-tiny", wtype="f16", prompt_tokens=512, steps=0)
    assert not of(r, E.Incompatible)


def test_moe_f16_prefill_is_ineligible_and_names_node_and_rule():
    r = run_sim(model="moe-tiny", wtype="f16", prompt_tokens=513, steps=3, ubatch_size=600)   # one ubatch of 513 (llama.cpp -ub 600)
    inc = of(r, E.Incompatible)
    assert inc and inc[0].step == 0 and inc[0].node_name == "ffn_moe_gate-0" and inc[0].op == "MUL_MAT_ID"
    assert "MMF: 513 columns > 512" in inc[0].rule and "sorted fallback synchronises" in inc[0].rule
    assert phases(r)[3] == "replay"      # decode rows fit the F16 tensor-core path: eligible again


def test_moe_q8_0_decode_is_eligible():
    r = run_sim(model="moe-tiny", wtype="q8_0", steps=4)
    assert not of(r, E.Incompatible)
    assert phases(r)[4] == "replay"


def test_n_cpu_moe_gives_each_gpu_split_its_own_key_and_warmup():
    r = run_sim(model="moe-tiny", wtype="q8_0", n_cpu_moe=2, steps=4)
    keys = {e.key for e in of(r, E.PhaseDecided) if e.step >= 1}     # decode steps
    assert len(keys) == 3
    warm = {e.key for e in of(r, E.WarmupTransition) if e.to_state == "warm"}
    assert warm == keys
    for split in {e.split for e in of(r, E.PhaseDecided) if e.step >= 1}:
        assert phases(r, split)[4] == "replay"


def test_idle_eviction_after_10s_and_rewarm():
    r = run_sim(steps=8, timeline=[{"at_step": 5, "idle_s": 11}])
    ev = of(r, E.Evicted)
    assert ev and ev[0].step == 5 and ev[0].idle_ns >= 10_000_000_000
    p = phases(r)
    assert p[4] == "replay" and p[5] == "eager" and p[6] == "capture" and p[7] == "replay"


def test_idle_under_10s_keeps_the_entry():
    r = run_sim(steps=6, timeline=[{"at_step": 4, "idle_s": 6}])
    assert not of(r, E.Evicted) and phases(r)[4] == "replay"


def test_pool_alloc_failure_invalidates_every_entry_and_rewarms():
    r = run_sim(prompt_tokens=4, steps=10, pool_cap=280_000, timeline=[{"at_step": 5, "prefill": 32}],
                pool_invalidation=True)                  # the article's rule
    inv = of(r, E.PoolInvalidated)
    assert inv and inv[0].reason == "alloc failure" and inv[0].step == 5 and inv[0].n_captured >= 1
    p = phases(r)
    assert p[4] == "replay" and p[6] == "eager" and p[7] == "capture" and p[8] == "replay"


def test_free_into_full_pool_invalidates_every_step():
    r = run_sim(steps=5, pool_max_buffers=0, pool_invalidation=True)   # the article's rule
    assert r.counters.invalidations >= 5 and r.counters.replays == 0
    assert {e.reason for e in of(r, E.PoolInvalidated)} == {"free into full pool"}


@pytest.mark.parametrize("env,settings,why", [
    ({"GGML_CUDA_DISABLE_GRAPHS": "0"}, {}, "GGML_CUDA_DISABLE_GRAPHS"),
    ({}, {"compute_capability": "6.1"}, "6.1 < 7.0"),
])
def test_graphs_disabled(env, settings, why):
    r = run_sim(steps=4, env=env, **settings)
    dis = of(r, E.GraphsDisabled)
    assert dis and why in dis[0].reason
    assert r.counters.captures == 0 and r.counters.replays == 0 and r.counters.eager_runs == 5


def test_alternating_variants_under_one_key_never_replay():
    r = run_sim(steps=12, timeline=[{"at_step": 1, "alternate_batches": [1, 2]}])
    assert r.counters.replays == 0 and r.counters.captures == 0
    keys = {e.key for e in of(r, E.PhaseDecided) if e.step >= 1}
    assert len(keys) == 1
    diffs = [d for d in of(r, E.PropertyDiff) if d.step >= 2]
    assert len(diffs) >= 10 and {d.field for d in diffs} == {"ne[1]"}


@pytest.mark.parametrize("upstream,n_regions", [("0c1e57098", 4), ("d99724f2", 3)])
def test_concurrent_branches_share_memory_only_where_a_race_is_named(upstream, n_regions):
    """A region per layer (but layer 0's under d99724f2: its range holds the KQ mask's cast), each passing
    llama.cpp's concurrent_event::is_valid; where ggml-alloc still gave two branches the same bytes (inside the
    join's buffer, which is_valid leaves out: llama.cpp races there too), concurrency.races names the pair."""
    from graphdiag.backends.gpu.concurrency import invalid_reason, races
    from graphdiag.backends.gpu.fusion import fusion_plan, launching_nodes
    cfg = resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, "concurrent_streams": True,
                   "upstream": upstream}, environ={})
    s = Session(cfg, E.EventBus())
    try:
        Stepper(s, RunResult({}, [], Counters())).step(StepPlan("decode", batch=1))
        g = s.ctx.sched.splits[0].graph
        regions = s.gpu.concurrent.regions
        assert len(regions) == n_regions
        for r in regions:
            assert invalid_reason(g, r) == ""
            plan = fusion_plan(g, 900, launching_nodes(g), upstream)
            named = {frozenset((a, b)) for a, _, b, _ in races(g, r, plan)}
            elided = {q + k for q, f in plan.items() for k in range(f.absorbed)}   # (no top-k router here)
            spans = {b: [] for b in range(1, r.n_branches + 1)}
            for i, b in r.stream_of.items():
                t = g.node(i)
                if t.view_src is None and i not in elided:
                    spans[b].append((t.data, t.data + t.nbytes(), t.name))
            for b1 in spans:
                for b2 in spans:
                    if b1 < b2:
                        for lo1, hi1, n1 in spans[b1]:
                            for lo2, hi2, n2 in spans[b2]:
                                if lo1 < hi2 and lo2 < hi1:
                                    assert frozenset((n1, n2)) in named, (r.fork, n1, n2)
    finally:
        s.close()

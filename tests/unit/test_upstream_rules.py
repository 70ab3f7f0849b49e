"""The decision rules taken from upstream ggml (issue 8): MUL_MAT_ID needs-sync, runtime fusion, concurrent
regions, the chunk-size variable, the eviction sweep clock, and the capture loop's order around a fork."""

import pytest

from graphdiag.backends.gpu.compat import mul_mat_id_sync_reason
from graphdiag.backends.gpu.concurrency import find_regions
from graphdiag.backends.gpu.entry import Clock, GraphCache
from graphdiag.backends.gpu.fusion import MMV_ADD, MMV_GLU, ROPE_SET_ROWS, RMS_NORM_MUL, fusion_plan
from graphdiag.config import resolve
from graphdiag.ir.dtypes import GGMLType
from graphdiag.ir.ops import Op
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model


def graph(preset="tiny", wtype=GGMLType.F16, n_tokens=1, n_seqs=None, gtype=DECODE, upstream="0c1e57098"):
    m = create_model(PRESETS[preset], wtype, with_data=False, upstream=upstream)
    n_seqs = n_tokens if n_seqs is None else n_seqs
    return build_graph(m, GraphParams(n_tokens, n_seqs, n_seqs if gtype == DECODE else 1, gtype, 256)).graph


def first_mmid(g):
    return next(g.node(i) for i in range(g.n_nodes) if g.node(i).op == Op.MUL_MAT_ID)


@pytest.mark.parametrize("wtype,tokens,cc,syncs", [
    (GGMLType.F16, 17, 900, False),      # MMF takes up to 512 columns for experts of <= 1024 rows
    (GGMLType.F16, 512, 900, False),
    (GGMLType.F16, 513, 900, True),
    (GGMLType.F16, 64, 700, False),      # F16 MMF from Volta
    (GGMLType.F16, 16, 610, True),       # Pascal: no MMF
    (GGMLType.Q8_0, 63, 700, False),     # Volta: dp4a MMQ below 64 columns
    (GGMLType.Q8_0, 64, 700, True),
    (GGMLType.Q8_0, 600, 900, False),    # Turing+: MMQ for any quantized batch
    (GGMLType.Q8_0, 4, 610, False),      # Pascal: MMVQ takes Q8_0 up to 4 tokens...
    (GGMLType.Q8_0, 5, 610, False),      # ...and dp4a MMQ the rest
    (GGMLType.F32, 1, 750, True),        # F32 experts: MMF only from Ampere, no mat-vec path for MUL_MAT_ID
    (GGMLType.F32, 1, 800, False),
])
def test_mul_mat_id_needs_sync_as_upstream(wtype, tokens, cc, syncs):
    g = graph("moe-tiny", wtype, tokens, n_seqs=1, gtype=PREFILL)
    why = mul_mat_id_sync_reason(first_mmid(g), cc)
    assert bool(why) == syncs, why
    if syncs:
        assert "the sorted fallback synchronises the stream" in why and "MMF" in why and "MMQ" in why


@pytest.mark.parametrize("cc,syncs", [(700, False), (720, True), (730, True), (750, False)])
def test_f16_mmf_needs_volta_exactly_or_turing(cc, syncs):
    # volta_mma_available is compiled arch == 7.0, turing_mma_available >= 7.5: 7.2/7.3 have neither
    g = graph("moe-tiny", GGMLType.F16, 64, n_seqs=1, gtype=PREFILL)
    assert bool(mul_mat_id_sync_reason(first_mmid(g), cc)) == syncs


def test_f16_expert_mat_vec_fusion_below_volta_takes_up_to_8_columns_of_any_size():
    # should_use_mmvf, F16 without FP16 tensor cores: ne11 <= 8 with no "small src0" condition, so
    # experts of 1024 rows (not small: 8 experts) fuse gate/up+GLU at 1 token on Pascal
    import dataclasses
    from graphdiag.backends.gpu.fusion import MMID_GLU
    cfg = dataclasses.replace(PRESETS["moe-tiny"], n_ff_exp=1024)
    m = create_model(cfg, GGMLType.F16, with_data=False)
    g = build_graph(m, GraphParams(1, 1, 1, DECODE, 256)).graph
    assert MMID_GLU in _patterns(g, 610)
    assert MMID_GLU not in _patterns(g, 700)       # FP16 tensor cores: a small src0 only


def test_q8_0_mmvq_limit_per_cc():
    g = graph("moe-tiny", GGMLType.Q8_0, 5, n_seqs=1, gtype=PREFILL)
    # 5 tokens on cc 7.2 (pascal_older table: Q8_0 <= 4): MMVQ refuses, dp4a MMQ takes it
    assert "MMVQ: 5 tokens > 4" not in mul_mat_id_sync_reason(first_mmid(g), 720)
    assert mul_mat_id_sync_reason(first_mmid(g), 720) == ""


def _patterns(g, cc=900):
    plan = fusion_plan(g, cc)
    return [f.pattern for _, f in sorted(plan.items())]


def test_one_token_fuses_mat_vec_glu_and_residual_adds_two_tokens_do_not():
    one, two, nine = _patterns(graph(n_tokens=1)), _patterns(graph(n_tokens=2)), _patterns(graph(n_tokens=9))
    assert one.count(MMV_GLU) == 4 and one.count(MMV_ADD) == 7 and len(one) == 24
    assert MMV_GLU not in two and MMV_ADD not in two and len(two) == 13
    assert two.count(RMS_NORM_MUL) == 9 and two.count(ROPE_SET_ROWS) == 4
    assert nine == two                    # 8 <-> 9 changes no fusion


def test_quantized_mat_vec_fusion_not_on_pascal():
    g = graph(wtype=GGMLType.Q8_0, n_tokens=1)
    assert MMV_GLU in _patterns(g, 700) and MMV_GLU not in _patterns(g, 600)


@pytest.mark.parametrize("upstream,first", [("0c1e57098", 0), ("d99724f2", 1)])
def test_concurrent_regions_only_at_one_token_and_not_around_the_mask_cast(upstream, first):
    """0c1e57098's mask is an input (a leaf, in no fork-join range): every layer forms a region. Under
    d99724f2 layer 0's range holds the mask's cast, a node in no branch: upstream skips that fork."""
    g = graph(n_tokens=1, upstream=upstream)
    assert [g.node(r.fork).name for r in find_regions(g)] == [f"attn_norm-{il}" for il in range(first, 4)]
    assert find_regions(graph(n_tokens=2, upstream=upstream)) == []


def test_chunk_size_variable_is_atoi_and_negative_means_one_graph():
    for value, want in (("64abc", 64), ("  +8", 8), ("abc", 0), ("-5", -5), ("٣", 0)):
        cfg = resolve({}, environ={"GGML_CUDA_GRAPH_CHUNK_SIZE": value})
        assert cfg.chunk_size == want, value


@pytest.mark.parametrize("value,want", [
    ("2147483648", -2147483648), ("4294967297", 1), ("-2147483649", 2147483647),
    ("99999999999999999999", -1), ("-99999999999999999999", 0), ("9223372036854775807", -1)])
def test_chunk_size_beyond_int32_wraps_as_glibc_atoi(value, want):
    # glibc atoi = (int)strtol: clamped to LONG_MAX/LONG_MIN, then the low 32 bits (checked against libc's atoi)
    assert resolve({}, environ={"GGML_CUDA_GRAPH_CHUNK_SIZE": value}).chunk_size == want


def test_negative_chunk_size_from_the_environment_captures_one_graph():
    from support.simrun import of, run_sim
    from graphdiag import events as E
    r = run_sim(steps=4, env={"GGML_CUDA_GRAPH_CHUNK_SIZE": "-5"})
    assert [e.n_chunks for e in of(r, E.ReplayLaunched)][0] == 1


def test_the_first_lookup_sweeps():
    t = [100_000_000]
    cache = GraphCache(Clock(lambda: t[0]))
    cache.lookup(1)
    assert cache.last_sweep_us == 100_000_000        # swept at the first lookup (the sweep clock starts at 0)
    t[0] += 4_000_000
    cache.lookup(2)
    assert cache.last_sweep_us == 100_000_000


def test_the_smallest_pool_cap_counts_the_split_kv_partials_and_the_q8_1_copy():
    from graphdiag.backends.geometry import fa_plan
    from graphdiag.config import min_pool_cap
    from graphdiag.plan import StepPlan
    cfg = PRESETS["tiny"]

    class Demand:
        steps = [(0, StepPlan("decode", batch=1), 8)]     # (step, plan, cells in use)
    f16, _ = min_pool_cap(Demand, cfg, "f16")
    q8, _ = min_pool_cap(Demand, cfg, "q8_0")
    assert f16 >= fa_plan(cfg.head_dim, cfg.n_head, cfg.n_head_kv, 256, 1)[3] > 4 * 256 * cfg.n_head
    assert q8 >= f16 and q8 >= 36 * (cfg.n_ff // 32)


def test_expert_gate_up_glu_fuses_at_one_token_only():
    from graphdiag.backends.gpu.fusion import MMID_GLU
    one = _patterns(graph("moe-tiny", GGMLType.F16, 1))
    two = _patterns(graph("moe-tiny", GGMLType.F16, 2))
    assert one.count(MMID_GLU) == 4 and MMID_GLU not in two
    assert MMID_GLU in _patterns(graph("moe-tiny", GGMLType.Q8_0, 1), 700)
    assert MMID_GLU not in _patterns(graph("moe-tiny", GGMLType.Q8_0, 1), 600)   # no quantized fusion on Pascal


def test_contiguity_is_ggml_is_contiguous_a_one_block_row_has_no_element_stride():
    # the rope+view+set_rows fusion (and the scheduler's split inputs) test ggml_is_contiguous: when ne[0]
    # is the block size, nb[0] is not looked at; the higher dims must follow on type_size * ne[0] / block
    from graphdiag.ir import Arena
    from graphdiag.ir.build import Ctx
    c = Ctx(Arena(64))
    a = c.new_tensor(GGMLType.F32, (3, 4), "a")
    col = c.view(a, (1, 4), (12, 4), 0, "strided one-element rows")
    assert col.is_contiguous()
    assert not c.view(a, (1, 4), (4, 12), 0, "a column").is_contiguous()
    assert not c.view(a, (2, 4), (8, 8), 0, "strided rows").is_contiguous()
    assert c.view(a, (3, 2), (4, 12), 0, "two rows").is_contiguous()


def test_graph_optimize_looks_the_split_key_up_at_every_alloc():
    # ggml_backend_cuda_graph_optimize calls ggml_cuda_graph_set_enabled -> cuda_graph(key), concurrent
    # streams or not: the entry is made (or its last use stamped) and the 5 s sweep may run at alloc time
    from graphdiag import events as E
    from graphdiag.backends.drivers.sim import SimDriver
    from graphdiag.backends.gpu.backend import GpuBackend
    from graphdiag.backends.gpu.runtime import RuntimeOptions
    t = [50_000_000]
    gpu = GpuBackend(SimDriver(memory_bytes=16 << 20), E.EventBus(), RuntimeOptions(), Clock(lambda: t[0]))
    g = graph()
    gpu.graph_optimize(g, 0)
    cache = gpu.runtime.cache
    assert cache.entries[g.first_node_addr].last_used_us == 50_000_000 and cache.last_sweep_us == 50_000_000
    t[0] += 6_000_000
    gpu.graph_optimize(g, 0)
    assert cache.entries[g.first_node_addr].last_used_us == 56_000_000 and cache.last_sweep_us == 56_000_000

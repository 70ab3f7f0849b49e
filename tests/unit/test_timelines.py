"""Seeded timelines for the differential test (graphdiag/llama/timelines.py): the same seed gives the same
scenario, and every one passes scenario validation, llama.cpp's expressibility check and the KV cells."""

from __future__ import annotations

from hypothesis import example, given, settings, strategies as st

from graphdiag.llama.command import resolve_llama
from graphdiag.llama.expressible import check_expressible
from graphdiag.llama.timelines import Limits, timeline, to_toml, write_timeline
from graphdiag.plan import N_UBATCH, kv_demand, plan_steps
from graphdiag.scenario import load_scenario


def _plan(path):
    cfg, sc = resolve_llama("x.gguf", {}, str(path))
    check_expressible(cfg, sc)
    return sc, list(plan_steps(cfg, sc))


def test_the_same_seed_gives_the_same_scenario(tmp_path):
    assert to_toml(timeline(7)) == to_toml(timeline(7))
    assert write_timeline(7, tmp_path).read_bytes() == to_toml(timeline(7)).encode()
    assert len({to_toml(timeline(s)) for s in range(20)}) == 20
    assert load_scenario(write_timeline(7, tmp_path, model="1b")).run["model"] == "1b"


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
@example(seed=7924326)      # decode steps past the last one a timeline entry may name ran over the cells
def test_every_timeline_is_valid_and_expressible(tmp_path_factory, seed):
    path = write_timeline(seed, tmp_path_factory.mktemp("gen"))
    sc, plan = _plan(path)                         # ScenarioError / UsageError on anything refused
    assert sc.name == f"gen-{seed}"
    demand = kv_demand(plan, 4096)
    assert demand.overflow_step is None and demand.cells <= Limits().max_tokens
    assert all(1 <= p.batch <= 16 for p in plan if p.kind == "decode")
    assert all(p.n_tokens <= N_UBATCH for p in plan if p.kind == "prefill")


def test_the_seeds_cover_what_llama_cpp_is_held_to(tmp_path):
    """Over 60 seeds: prefills past n_ubatch, 9+ sequences together, idle past the 10 s sweep, alternations,
    each per-run environment."""
    seen = {"split prefill": 0, "9+ sequences": 0, "idle > 10 s": 0, "alternation": 0, "env": set()}
    for seed in range(60):
        data = timeline(seed)
        sc, plan = _plan(write_timeline(seed, tmp_path))
        seen["split prefill"] += any(p.kind == "prefill" and p.n_outputs == 0 for p in plan)
        seen["9+ sequences"] += any(p.batch >= 9 for p in plan if p.kind == "decode")
        seen["idle > 10 s"] += any(p.idle_s > 10 for p in plan)
        seen["alternation"] += any("alternate_batches" in e for e in data["timeline"])
        seen["env"] |= set(sc.env)
    assert min(v for k, v in seen.items() if k != "env") >= 3, seen
    assert seen["env"] == {"GGML_CUDA_DISABLE_FUSION", "LLAMA_GRAPH_REUSE_DISABLE", "GGML_CUDA_PDL"}

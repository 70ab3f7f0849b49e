"""Issue 12: thrash detection, whatif key policies, graph memory, --strict and the thread scenarios (sim)."""

import json

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.report.analysis.graph_memory import SIM_MODEL, graph_memory
from graphdiag.report.record import read_record, write_record
from graphdiag.report.analysis.summary import summarize
from graphdiag.report.analysis.thrash import find_thrash
from graphdiag.report.analysis.whatif import what_if
from tests.support.simrun import run_sim

SPEC = [{"at_step": 2, "alternate_batches": [4, 1, 1, 1]}]


@pytest.fixture(scope="module")
def spec():
    return run_sim(SPEC, model="tiny", steps=16)


@pytest.fixture(scope="module")
def steady():
    return run_sim((), model="tiny", steps=8)


def test_thrash_names_the_alternating_key_its_resets_cost_and_field(spec):
    t = find_thrash(spec.events)
    assert len(t) == 1
    k = t[0]
    assert k.returns >= 2 and k.warmup_resets >= 3 and k.eager_runs >= 3 and k.captures >= 3
    assert k.capture_ns > 0 and "ne[1]" in k.differing_fields
    assert {v.first_ne[1] for v in k.variants} >= {1, 4}
    s = summarize(spec.header, spec.events)
    assert s.diagnoses["thrash_keys"] == 1
    assert json.loads(s.to_json())["thrash"][0]["key"] == k.key


def test_no_thrash_on_steady_decode(steady):
    assert find_thrash(steady.events) == []


def test_whatif_first_node_reproduces_the_record_and_shape_key_captures_less(spec):
    w = what_if(spec.events, ("first-node", "first-node+shape", "content-hash"))
    base, fn, shape, content = w.baseline, *w.outcomes
    for k in ("captures", "instantiates", "updates", "update_refusals", "replays", "eager_runs", "warmup_resets"):
        assert getattr(fn, k) == base[k], k
    assert shape.captures < base["captures"] and shape.replays > base["replays"]
    assert content.captures < base["captures"]
    d = w.to_dict("first-node+shape")
    assert d["baseline_captures"] == base["captures"] and d["captures"] == shape.captures


def test_whatif_max_graphs_caps_what_is_held(spec):
    w = what_if(spec.events, ("first-node+shape",), max_graphs=1)
    assert w.outcomes[0].graphs_held_peak <= 1 and w.outcomes[0].evictions > 0


def test_whatif_cli_json_and_bad_input(spec, tmp_path, capsys):
    rec = tmp_path / "spec.jsonl"
    write_record(rec, spec.header, spec.events)
    assert main(["whatif", str(rec), "--key", "first-node+shape", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["captures"] < d["baseline_captures"] and "replays" in d
    assert main(["whatif", str(rec), "--key", "nope"]) == 2
    assert "unknown key policy" in capsys.readouterr().err
    old = tmp_path / "old.jsonl"       # a record from before the fingerprints: one clear line, exit 2
    write_record(old, spec.header, [E.PhaseDecided(step=1, split=0, key=1, phase="eager", why="first call")])
    assert main(["whatif", str(old), "--key", "content-hash"]) == 2
    assert "lacks the graph fingerprints" in capsys.readouterr().err


def test_graph_memory_modelled_per_key_and_released(steady):
    gm = graph_memory(True, steady.events)
    assert gm.source == SIM_MODEL and gm.executables >= 1
    assert gm.peak_bytes > 0 and gm.end_bytes == gm.peak_bytes and gm.never_replayed == []
    inst = [e for e in steady.events if isinstance(e, E.ChunkInstantiated)]
    assert all(e.mem_bytes > 0 for e in inst)
    assert sum(k.peak_bytes for k in gm.keys) >= gm.peak_bytes


def test_sim_mem_get_info_sees_executables():
    from graphdiag.backends.drivers.sim import SimDriver
    d = SimDriver()
    free0, total = d.mem_get_info()
    assert free0 <= total
    a = d.mem_alloc(1 << 20)
    assert d.mem_get_info()[0] == free0 - (1 << 20)
    d.mem_free(a)
    assert d.mem_get_info()[0] == free0


def test_strict_fails_thrash_and_passes_steady(tmp_path, capsys):
    assert main(["run", "--backend", "sim", "--model", "tiny", "--steps", "6", "--prompt-tokens", "4",
                 "--strict"]) == 0
    capsys.readouterr()
    assert main(["run", "--scenario", "speculative-decoding", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: strict: thrash: key" in out


@pytest.mark.parametrize("name", ["speculative-decoding", "speculative-draft-arena",
                                  "graph-growth-changing-pointers", "pool-flush-stale-pointer",
                                  "moe-graphs-silently-disabled", "update-refusal-flood"])
def test_thread_scenarios_hold_and_name_their_cause(name, capsys):
    assert main(["run", "--scenario", name]) == 0
    out = capsys.readouterr().out
    assert f"scenario {name}: every expectation holds" in out
    assert sum(line.startswith("cause: ") for line in out.splitlines()) == 1


def test_an_executable_made_at_the_last_step_is_not_a_never_replayed_finding():
    """A run that ends on a capture step (e.g. a batch change one step before the end) is strict-clean."""
    from support.simrun import run_sim
    from graphdiag.report.analysis.graph_memory import graph_memory
    r = run_sim(steps=5, timeline=[{"at_step": 4, "batch": 2}])   # ends with the 2-sequence graph's capture
    gm = graph_memory(True, r.events)
    last = max(e.step for e in r.events if isinstance(e, E.StepStarted))
    assert any(isinstance(e, E.ChunkInstantiated) and e.step == last for e in r.events)
    assert not gm.never_replayed


def _flush_sequence(after):
    """Key 0xa captured from ledger digest "d1", replayed, then a pool flush, then `after`."""
    k = 0xa
    return [E.StepStarted(step=1), E.UidMiss(step=1, key=k, props_digest="d1"), E.CaptureRun(step=1, key=k),
            E.ChunkInstantiated(step=1, key=k, chunk=0, mem_bytes=4096), E.StepStarted(step=2),
            E.UidHit(step=2, key=k), E.ReplayLaunched(step=2, key=k), E.StepStarted(step=3),
            E.PoolInvalidated(step=3, n_graphs=1, n_captured=1), E.StepStarted(step=4), *after]


@pytest.mark.parametrize("after,prevented", [
    ([E.UidMiss(step=4, key=0xa, props_digest="d1")], 1),     # same graph after the flush: upstream would replay
    ([E.UidHit(step=4, key=0xa)], 1),                          # the very same graph (uid)
    ([E.UidMiss(step=4, key=0xa, props_digest="d2")], 0),     # the graph changed: an update would refresh it
    ([E.UidMiss(step=4, key=0xb, props_digest="d1")], 0),     # another key
])
def test_a_stale_replay_is_counted_only_when_the_flushed_key_returns_unchanged(after, prevented):
    gm = graph_memory(True, _flush_sequence(after))
    assert gm.stale_replays_prevented == prevented
    if prevented:
        assert gm.stale == ["step 4: key 0xa would have replayed 1 executable(s) captured before the pool "
                            "flush at step 3"]
    assert gm.end_bytes == 0 and gm.peak_bytes == 4096        # the flush released the executable

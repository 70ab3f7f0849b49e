"""Scenario files: every bundled one loads; every malformed input is one ScenarioError naming file and line;
expectations are checked against a Summary."""

from __future__ import annotations

import textwrap

import pytest

from graphdiag import resources
from graphdiag.config import resolve
from graphdiag.errors import ScenarioError
from graphdiag.report.analysis.summary import summarize
from graphdiag.scenario import TimelineChange, check_expectations, list_scenarios, load_file, load_scenario
from support import synth

REQUIRED = {"steady-decode", "batch-change", "nkv-growth", "prefill-then-decode", "chunk-size-64",
            "moe-cpu-offload", "moe-sync-fallback", "pool-pressure", "idle-eviction", "fusion-boundary",
            "concurrent-qkv", "alternating-variants", "graphs-disabled-env"}


def test_scenario_files_all_load_and_resolve():
    found = list_scenarios()
    assert REQUIRED <= {s.name for s in found}
    for s in found:
        cfg = resolve({}, scenario=s.run, environ=s.environ({}))
        assert cfg.steps <= 40, f"{s.name}: keep scenarios short"
        assert s.expect, f"{s.name}: a scenario states what it expects"
        assert all(c.at_step < cfg.steps for c in s.timeline)


def test_scenario_env_reaches_the_config():
    s = load_scenario("graphs-disabled-env")
    cfg = resolve({}, scenario=s.run, environ=s.environ({}))
    assert cfg.graphs_disabled and cfg.sources["graphs_disabled"] == "env GGML_CUDA_DISABLE_GRAPHS"


def test_scenario_timeline_entries():
    assert load_scenario("alternating-variants").changes_at(2) == [TimelineChange(2, alternate_batches=(1, 2))]
    assert load_scenario("idle-eviction").timeline == (TimelineChange(10, idle_s=11.0),)


def test_scenario_by_path_and_unknown_name(tmp_path):
    assert load_scenario(resources.scenarios_dir() / "steady-decode.toml").name == "steady-decode"
    with pytest.raises(ScenarioError, match=r"unknown scenario 'stedy-decode' \(known: .*steady-decode"):
        load_scenario("stedy-decode")


GOOD = """\
name = "s"
description = "a test scenario"
timeline = [
  { at_step = 2, batch = 2 },
  { at_step = 4, idle_s = 1.5 },
]

[run]
model = "tiny"
steps = 8

[env]
GGML_CUDA_GRAPH_CHUNK_SIZE = "64"

[expect]
replays_min = 1
refusal_reasons = ["TOPOLOGY_CHANGED"]
"""


def _load(tmp_path, text: str):
    p = tmp_path / "s.toml"
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return load_file(p)


def test_scenario_good_file_loads(tmp_path):
    s = _load(tmp_path, GOOD)
    assert s.run == {"model": "tiny", "steps": 8} and s.env == {"GGML_CUDA_GRAPH_CHUNK_SIZE": "64"}
    assert s.timeline == (TimelineChange(2, batch=2), TimelineChange(4, idle_s=1.5))


@pytest.mark.parametrize("old, new, line, message", [
    ('steps = 8', 'steps = 8\nsteps = 9', 11, "invalid TOML"),
    ('model = "tiny"', 'model = tiny', 9, "invalid TOML"),
    ('name = "s"', 'name = "other"', 1, "differs from the file name 's'"),
    ('description = "a test scenario"\n', '', 1, "missing 'description'"),
    ('steps = 8', 'stepz = 8', 10, "unknown key 'stepz' in [run] (did you mean 'steps'?)"),
    ('steps = 8', 'steps = "8"', 10, "run.steps must be an integer, not a string"),
    ('steps = 8', 'steps = true', 10, "run.steps must be an integer, not true or false"),
    ('model = "tiny"', 'model = "tiny"\nchunk_size = -1', 10, "invalid [run]: invalid chunk size -1"),
    ('{ at_step = 4, idle_s = 1.5 }', '{ at_step = 4, idle = 1.5 }', 5, "unknown key 'idle' in timeline entry 2"),
    ('{ at_step = 4, idle_s = 1.5 }', '{ at_step = 40, idle_s = 1.5 }', 5, "at_step 40 is outside"),
    ('{ at_step = 4, idle_s = 1.5 }', '{ at_step = 4, idle_s = "x" }', 5, "idle_s must be a number"),
    ('{ at_step = 2, batch = 2 }', '{ at_step = 2, batch = 2, prefill = 3 }', 4, "exactly one of"),
    ('{ at_step = 2, batch = 2 }', '{ at_step = 2, batch = 0 }', 4, "batch must be >= 1, not 0"),
    ('{ at_step = 2, batch = 2 }', '{ at_step = 2, alternate_batches = [1] }', 4, "at least two"),
    ('GGML_CUDA_GRAPH_CHUNK_SIZE = "64"', 'GGML_CUDA_GRAPH_CHUNK_SIZ = "64"', 13, "unknown key"),
    ('GGML_CUDA_GRAPH_CHUNK_SIZE = "64"', 'GGML_CUDA_GRAPH_CHUNK_SIZE = 64', 13, "must be a string"),
    ('replays_min = 1', 'replays_minimum = 1', 16, "unknown key 'replays_minimum' in [expect]"),
    ('replays_min = 1', 'replays_min = -1', 16, "expect.replays_min must be >= 0"),
    ('refusal_reasons = ["TOPOLOGY_CHANGED"]', 'refusal_reasons = [2]', 17, "items must be a string"),
    ('[run]\n', '[run]\ntimeline = []\n', 9, "top-level keys such as 'timeline' must come before"),
    ('[expect]', '[expected]', 15, "unknown key 'expected' in the scenario"),
])
def test_scenario_bad_input_names_file_and_line(tmp_path, old, new, line, message):
    assert old in GOOD
    with pytest.raises(ScenarioError) as exc:
        _load(tmp_path, GOOD.replace(old, new, 1))
    msg = str(exc.value)
    assert msg.startswith(f"{tmp_path / 's.toml'}:{line}: "), msg
    assert message in msg and "\n" not in msg


def test_scenario_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_file(tmp_path / "nope.toml")


def test_scenario_expectations_hold_and_fail_with_reasons(tmp_path):
    s = _load(tmp_path, GOOD)
    summary = summarize(*synth.batch_change())
    assert check_expectations(s, summary) == []
    s.expect = {"captures": 1, "replays_min": 10, "eager_runs_max": 2, "chunks": 2, "distinct_keys_min": 2,
                "no_replay": True, "graphs_disabled": True, "refusal_reasons": ["OTHER"],
                "property_diff_fields": ["ne[1]", "nb[2]"]}
    assert check_expectations(s, summary) == [
        "s: expected captures = 1, got 2", "s: expected replays >= 10, got 4",
        "s: expected eager_runs <= 2, got 3", "s: expected distinct_keys >= 2, got 1",
        "s: expected no replay, got 4", "s: expected graphs disabled, got 0",
        "s: expected refusal_reasons to include OTHER, got TOPOLOGY_CHANGED",
        "s: expected property_diff_fields to include ne[1], nb[2], got ne[1], src[1].ne[1]"]


def test_scenario_array_of_tables_timeline_names_the_entry_line(tmp_path):
    text = """\
    name = "s"
    description = "timeline as [[timeline]] tables"

    [run]
    steps = 8

    [[timeline]]
    at_step = 1
    batch = 2

    [[timeline]]
    at_step = 2
    batch = "x"

    [expect]
    replays_min = 1
    """
    with pytest.raises(ScenarioError, match=r"s\.toml:13: batch must be an integer, not a string"):
        _load(tmp_path, text)
    s = _load(tmp_path, text.replace('"x"', "3"))
    assert s.timeline == (TimelineChange(1, batch=2), TimelineChange(2, batch=3))

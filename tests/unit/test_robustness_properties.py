"""Issue 10 point 5: property-based tests: any scenario file and any edit of an event record ends in a result
or a one-line GraphdiagError, never a traceback."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from graphdiag.errors import GraphdiagError
from graphdiag.report.analysis.diff import diff_runs
from graphdiag.report.record import read_record, write_record
from graphdiag.report.analysis.summary import summarize
from graphdiag.scenario import load_file
from support import synth

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8), lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4),
                                                                                              c, max_size=3),
                    max_leaves=8)
KEYS = st.sampled_from(["name", "description", "timeline", "run", "env", "expect", "at_step", "batch", "steps",
                        "prompt_tokens", "chunk_size", "idle_s", "prefill", "alternate_batches", "pool_cap",
                        "GGML_CUDA_GRAPH_CHUNK_SIZE", "replays_min", "refusal_reasons", "model", "seed"])
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _toml_value(v) -> str:
    return json.dumps(v) if not isinstance(v, bool) else ("true" if v else "false")


@FAST
@given(st.lists(st.tuples(st.sampled_from([None, "run", "env", "expect"]), KEYS,
                          st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=6)
                          | st.lists(st.integers(-2, 9), max_size=3)), max_size=8),
       st.text(max_size=40))
def test_any_scenario_file_loads_or_is_one_scenario_error(tmp_path_factory, entries, junk):
    path = tmp_path_factory.mktemp("sc") / "prop.toml"
    lines = ['name = "prop"', 'description = "property"']
    for table, key, value in entries:
        if value is None:
            continue
        lines.append((f"[{table}]\n" if table else "") + f"{key} = {_toml_value(value)}")
    path.write_text("\n".join(lines) + "\n" + junk)
    try:
        load_file(path)
    except GraphdiagError as e:
        assert "\n" not in str(e) and str(path) in str(e)


@FAST
@given(st.integers(0, 40), st.sampled_from(["step", "split", "key", "uid", "t_ns", "duration_ns", "tokens",
                                            "mode", "phase", "reason", "n_chunks", "nodes", "changed", "ok",
                                            "kind", "field", "rel_err", "status", "settings", "simulated"]),
       JSON)
def test_any_edited_record_reports_and_diffs_or_is_one_event_file_error(tmp_path_factory, line, field, value):
    path = tmp_path_factory.mktemp("rec") / "r.jsonl"
    write_record(path, *synth.batch_change())
    lines = path.read_text().splitlines()
    i = line % len(lines)
    obj = json.loads(lines[i])
    obj[field] = value
    lines[i] = json.dumps(obj)
    path.write_text("\n".join(lines) + "\n")
    try:
        run = read_record(path)
    except GraphdiagError as e:
        assert "\n" not in str(e)
        return
    summarize(*run)
    diff_runs(run, read_record(path)).to_json()

"""Scenario files (scenarios/*.toml): a named run, its environment, step-level changes, expected outcomes.

    name = "batch-change"                      # must equal the file's stem
    description = "one line"
    cause = "one line"                         # optional: the cause the run shows (printed with its verdict)
    [run]        # RunConfig fields: model, wtype, prompt_tokens, steps, batch, chunk_size, fusion, ...
                 # (model = "file.gguf": relative to this file's folder, or absolute; prompt = "text")
    [env]        # llama.cpp / ggml environment knobs the scenario sets, values as strings
    timeline = [ { at_step = 4, batch = 2 }, { at_step = 9, idle_s = 11 },
                 { at_step = 12, prefill = 32 }, { at_step = 2, alternate_batches = [1, 2] },
                 { at_step = 14, fault = "launch" } ]
    [expect]     # COUNTER, COUNTER_min, COUNTER_max (any Counters name, plus chunks and distinct_keys),
                 # refusal_reasons, property_diff_fields, property_diff_nodes (lists of str: the fields, the
                 # names of the first differing nodes a property diff named), no_replay, graphs_disabled (bool);
                 # diagnoses: thrash_keys, never_replayed, graph_bytes_peak, stale_replays_prevented,
                 # strict_failures (each also _min/_max)

Loading validates strictly: every error is a ScenarioError naming the file and the line.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from . import resources
from ._toml_lines import line_of
from .backends.drivers.faults import FAULT_KINDS
from .config import ENV_KNOBS, RunConfig, resolve
from .counters import COUNTER_NAMES
from .errors import ScenarioError, UsageError

RUN_FIELDS: dict[str, type] = {
    "model": str, "wtype": str, "prompt_tokens": int, "prompt_ids": list, "prompt": str, "steps": int, "batch": int, "chunk_size": int,
    "fusion": bool, "concurrent_streams": bool, "n_cpu_moe": int, "pool_cap": int, "pool_max_buffers": int,
    "pool_invalidation": bool,
    "compute_capability": str, "reuse_disabled": bool, "graphs_disabled": bool, "devices": int, "tensor_split": list,
    "sim_mode": str, "swa_full": bool, "upstream": str, "ubatch_size": int,
}
CHANGES: dict[str, type] = {"batch": int, "idle_s": float, "prefill": int, "alternate_batches": list,
                            "new_arena_every": int, "separate_arena_batch": int, "fault": str}
TOP_LEVEL: dict[str, type] = {"name": str, "description": str, "cause": str, "run": dict, "env": dict,
                              "timeline": list, "expect": dict}
DIAGNOSES = ("thrash_keys", "never_replayed", "graph_bytes_peak", "stale_replays_prevented", "strict_failures",
             "unrecovered_failures", "faults_missed")
BOUNDED = (*COUNTER_NAMES, "chunks", "distinct_keys", *DIAGNOSES)
EXPECT: dict[str, type] = ({n + s: int for n in BOUNDED for s in ("", "_min", "_max")}
                           | {"refusal_reasons": list, "property_diff_fields": list, "property_diff_nodes": list,
                              "no_replay": bool,
                              "graphs_disabled": bool})
# the reasons an update can be refused for: drivers.base.UpdateResult's names but SUCCESS (UpdateRefused.reason;
# written out: scenarios load without numpy, which the drivers need; a test keeps the two equal)
REFUSAL_REASONS = ("ERROR", "TOPOLOGY_CHANGED", "NODE_TYPE_CHANGED", "FUNCTION_CHANGED", "PARAMETERS_CHANGED",
                   "NOT_SUPPORTED", "UNSUPPORTED_FUNCTION_CHANGE", "ATTRIBUTES_CHANGED")
# the eviction sweep acts after 10 s idle, so a day shows all a longer pause would; the clock stays an int64
MAX_IDLE_S = 86_400
# timeline fields that decide the same thing (what the step decodes): two at one step, one would win
OVERRIDING = ("batch", "alternate_batches", "prefill")


@dataclass(frozen=True)
class TimelineChange:
    """One step-level change, applied before step `at_step` (exactly one of the optional fields is set).

    batch: sequences decoded from this step on; idle_s: seconds the runtime's clock advances first;
    prefill: a prefill ubatch of this many tokens at this step; alternate_batches: cycle through these
    batch sizes, one per step, from this step on; new_arena_every: the graph's structs (node pointers, the
    CUDA graph key) move every N steps; separate_arena_batch: steps of that batch build their graph in an
    arena of their own (a draft model's context), so they get keys of their own; fault: the first driver
    call of that kind in this step fails as the driver would fail it ("launch", "capture", "instantiate",
    "update", "oom"): the step fails, is rolled back and the run goes on."""

    at_step: int
    batch: int | None = None
    idle_s: float | None = None
    prefill: int | None = None
    alternate_batches: tuple[int, ...] | None = None
    new_arena_every: int | None = None        # node pointers move every N steps from here on
    separate_arena_batch: int | None = None   # steps of this batch build their graph in their own arena
    fault: str | None = None                  # a driver call of this step fails (backends/drivers/faults.py)
    line: int = field(default=0, compare=False)     # where the entry is in its file (for messages)

    # Read-only mapping view of the fields that are set, so step planners can treat it as the TOML table.
    def keys(self) -> list[str]:
        return [k for k in ("at_step", *CHANGES) if getattr(self, k) is not None]

    def __contains__(self, name: str) -> bool:
        return name in self.keys()

    def __getitem__(self, name: str):
        if name not in self:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default=None):
        return self[name] if name in self else default


@dataclass
class Scenario:
    name: str
    description: str
    path: Path
    cause: str = ""                   # one line: what the scenario reproduces goes wrong, and why
    run: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    timeline: tuple[TimelineChange, ...] = ()
    expect: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict, compare=False)   # "run.steps", "env.NAME" -> line

    def where(self, key: str) -> str:
        """`file:line` of a [run] or [env] key ("run.steps", "env.GGML_CUDA_GRAPH_CHUNK_SIZE")."""
        return f"{self.path}:{self.lines.get(key, 1)}"

    def env_origins(self) -> dict[str, str]:
        """Environment variable -> `file:line` for every knob this scenario's [env] sets."""
        return {k: self.where(f"env.{k}") for k in self.env}

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment a run of this scenario sees: `base` (os.environ) with [env] on top."""
        return dict(os.environ if base is None else base) | self.env

    def changes_at(self, step: int) -> list[TimelineChange]:
        """The timeline changes that apply before `step`, in file order."""
        return [c for c in self.timeline if c.at_step == step]


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A scenario by name (a bundled scenarios/NAME.toml) or by path to a .toml file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return load_file(p)
    candidate = resources.scenarios_dir() / f"{name_or_path}.toml"
    if not candidate.exists():
        known = ", ".join(s.stem for s in sorted(resources.scenarios_dir().glob("*.toml")))
        raise ScenarioError(f"unknown scenario {str(name_or_path)!r} (known: {known})")
    return load_file(candidate)


def list_scenarios() -> list[Scenario]:
    """Every bundled scenario, sorted by name (each one validated)."""
    return [load_file(p) for p in sorted(resources.scenarios_dir().glob("*.toml"))]


def load_file(path: str | Path) -> Scenario:
    """Read and validate one scenario file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{path}: cannot read: {e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"at line (\d+)", str(e))
        raise ScenarioError(f"{path}:{m.group(1) if m else 1}: invalid TOML: {e}") from None
    return _Validator(path, text).scenario(data)


class _Validator:
    """Checks a parsed scenario; `fail` finds the line of the offending key in the text."""

    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text

    def fail(self, msg: str, table: str | None = None, key: str | None = None, index: int | None = None):
        raise ScenarioError(f"{self.path}:{line_of(self.text, table, key, index)}: {msg}")

    def typed(self, value, want: type, where: str, table, key, index=None):
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if want is float
              else type(value) is want)
        if not ok:
            self.fail(f"{where} must be {_type_name(want)}, not {_type_name(type(value))}", table, key, index)
        return float(value) if want is float else value

    def known(self, table: dict, allowed, what: str, tname, index=None) -> None:
        for k in table:
            if k not in allowed:
                hint = _close(k, allowed)
                if k in TOP_LEVEL and tname is not None:
                    hint = f" (top-level keys such as {k!r} must come before the first [table])"
                self.fail(f"unknown key {k!r} in {what}{hint}", tname, k, index)

    def scenario(self, data: dict) -> Scenario:
        self.known(data, TOP_LEVEL, "the scenario", None)
        for k in ("name", "description"):
            if k not in data:
                self.fail(f"missing {k!r}")
        for k, v in data.items():
            self.typed(v, TOP_LEVEL[k], k, None, k)
        if data["name"] != self.path.stem:
            self.fail(f"name {data['name']!r} differs from the file name {self.path.stem!r}", None, "name")
        if not data["description"].strip() or "\n" in data["description"].strip():
            self.fail("description must be one non-empty line", None, "description")
        run = self.run(data.get("run", {}))
        if "\n" in data.get("cause", "").strip():
            self.fail("cause must be one line", None, "cause")
        return Scenario(name=data["name"], description=data["description"].strip(), path=self.path,
                        cause=data.get("cause", "").strip(), run=run,
                        env=self.env(data.get("env", {})),
                        timeline=self.timeline(data.get("timeline", []), run.get("batch", RunConfig.batch),
                                               run.get("steps", RunConfig.steps)),
                        expect=self.expect(data.get("expect", {})), lines=self.lines(data))

    def lines(self, data: dict) -> dict[str, int]:
        return {f"{t}.{k}": line_of(self.text, t, k, None) for t in ("run", "env") for k in data.get(t, {})}

    def run(self, run: dict) -> dict:
        self.known(run, RUN_FIELDS, "[run]", "run")
        for k, v in run.items():
            self.typed(v, RUN_FIELDS[k], f"run.{k}", "run", k)
        try:
            resolve({}, scenario=run, environ={})
        except UsageError as e:
            said = str(e)
            key = next((k for k in run if k in said or k.replace("_", "-") in said or k.replace("_", " ") in said),
                       None)
            self.fail(f"invalid [run]: {e}", "run", key)
        run = dict(run)
        model = run.get("model", "")
        if model.endswith(".gguf") and not Path(model).is_absolute():
            # a model file is named relative to the scenario's own folder, wherever the run starts
            run["model"] = str(self.path.parent / model)
        return run

    def env(self, env: dict) -> dict[str, str]:
        self.known(env, ENV_KNOBS, "[env] (known knobs)", "env")
        for k, v in env.items():
            self.typed(v, str, f"env.{k}", "env", k)
        return dict(env)

    def timeline(self, entries: list, batch: int, steps: int) -> tuple[TimelineChange, ...]:
        """Steps are numbered over every ubatch: `batch` prefills (0..batch-1), then `steps` decode steps;
        a change applies to a decode step."""
        first, last = batch, batch + steps - 1
        out = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                self.fail(f"timeline entry {i + 1} must be a table", "timeline", None, i)
            self.known(e, ("at_step", *CHANGES), f"timeline entry {i + 1}", "timeline", i)
            if "at_step" not in e:
                self.fail(f"timeline entry {i + 1} has no at_step", "timeline", None, i)
            at = self.typed(e["at_step"], int, "at_step", "timeline", "at_step", i)
            if not first <= at <= last:
                self.fail(f"at_step {at} is outside the decode steps {first}–{last} (steps {first}–{last} "
                          f"follow {batch} prefill step{'s' if batch != 1 else ''})", "timeline", "at_step", i)
            change = [k for k in e if k != "at_step"]
            if len(change) != 1:
                self.fail(f"timeline entry {i + 1} must set exactly one of {', '.join(CHANGES)}",
                          "timeline", "at_step", i)
            out.append(TimelineChange(at, **{change[0]: self.change(change[0], e[change[0]], i)},
                                      line=line_of(self.text, "timeline", "at_step", i)))
        self.one_per_step(out)
        return tuple(out)

    def one_per_step(self, changes: list[TimelineChange]) -> None:
        """Two entries at one step may not set the same field, nor two of OVERRIDING (one would win
        silently); entries of different kinds (a batch and an idle time, a fault) may share a step."""
        seen: dict[tuple[int, str], TimelineChange] = {}
        for c in changes:
            field_ = next(k for k in c.keys() if k != "at_step")
            slot = (c.at_step, "decoded" if field_ in OVERRIDING else field_)
            first = seen.setdefault(slot, c)
            if first is not c:
                other = next(k for k in first.keys() if k != "at_step")
                what = ("as the entry on line {} does at the same step: write one entry (merge them or move one)"
                        if other == field_ else "and the entry on line {} at the same step sets " + other
                        + ": one would silently override the other (move one)").format(first.line)
                raise ScenarioError(f"{self.path}:{c.line}: timeline entry at_step {c.at_step} sets {field_}, {what}")

    def change(self, key: str, value, index: int):
        value = self.typed(value, CHANGES[key], key, "timeline", key, index)
        if key == "fault":
            if value not in FAULT_KINDS:
                self.fail(f"fault must be one of {', '.join(FAULT_KINDS)}, not {value!r}", "timeline", key, index)
            return value
        values = value if key == "alternate_batches" else [value]
        if key == "alternate_batches" and len(values) < 2:
            self.fail("alternate_batches needs at least two batch sizes", "timeline", key, index)
        for v in values:
            if key == "alternate_batches":
                self.typed(v, int, "alternate_batches items", "timeline", key, index)
            if v < (0 if key == "idle_s" else 1):
                self.fail(f"{key} must be {'>= 0' if key == 'idle_s' else '>= 1'}, not {v}", "timeline", key, index)
            if key == "idle_s" and not v <= MAX_IDLE_S:       # nan compares false: refused too
                self.fail(f"idle_s must be a number of seconds from 0 to {MAX_IDLE_S} (a day; entries idle "
                          f"after 10 s are evicted), not {v:g}", "timeline", key, index)
        return tuple(values) if key == "alternate_batches" else value

    def expect(self, expect: dict) -> dict:
        self.known(expect, EXPECT, "[expect]", "expect")
        for k, v in expect.items():
            self.typed(v, EXPECT[k], f"expect.{k}", "expect", k)
            if EXPECT[k] is list:
                for item in v:
                    self.typed(item, str, f"expect.{k} items", "expect", k)
                    if k == "refusal_reasons" and item not in REFUSAL_REASONS:
                        self.fail(f"unknown refusal reason {item!r} in expect.refusal_reasons"
                                  f"{_close(item, REFUSAL_REASONS)} (the driver's: {', '.join(REFUSAL_REASONS)})",
                                  "expect", k)
            elif EXPECT[k] is int and v < 0:
                self.fail(f"expect.{k} must be >= 0", "expect", k)
        return dict(expect)


def check_expectations(scenario: Scenario, summary) -> list[str]:
    """What the run's Summary contradicts in [expect], one sentence each (empty: all hold)."""
    failures = []
    for k, want in scenario.expect.items():
        got = _observed(k, summary)
        if not _holds(k, want, got):
            failures.append(f"{scenario.name}: expected {_expectation(k, want)}, got {_shown(got)}")
    return failures


def _observed(k: str, s):
    if k == "refusal_reasons":
        return sorted(s.counters.get("refusals_by_reason", {}))
    if k in ("property_diff_fields", "property_diff_nodes"):
        return list(getattr(s, k))
    if k == "no_replay":
        return s.counters["replays"]
    if k == "graphs_disabled":
        return s.counters["disabled"]
    name = re.sub(r"_(min|max)$", "", k)
    if name in DIAGNOSES:
        return s.diagnoses[name]
    return {"chunks": s.max_chunks, "distinct_keys": s.distinct_keys}.get(name, s.counters.get(name))


def _holds(k: str, want, got) -> bool:
    if isinstance(want, list):
        return set(want) <= set(got)
    if k in ("no_replay", "graphs_disabled"):
        return (got == 0) == want if k == "no_replay" else (got > 0) == want
    if k.endswith("_min"):
        return got >= want
    if k.endswith("_max"):
        return got <= want
    return got == want


def _expectation(k: str, want) -> str:
    if isinstance(want, list):
        return f"{k} to include {', '.join(want)}"
    if k == "no_replay":
        return "no replay" if want else "at least one replay"
    if k == "graphs_disabled":
        return "graphs disabled" if want else "graphs enabled"
    name = re.sub(r"_(min|max)$", "", k)
    op = ">=" if k.endswith("_min") else "<=" if k.endswith("_max") else "="
    return f"{name} {op} {want}"


def _shown(got) -> str:
    if isinstance(got, list):
        return ", ".join(got) or "none"
    return str(got)


def _type_name(t: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "an array",
            dict: "a table"}.get(t, t.__name__)


def _close(key: str, allowed) -> str:
    m = difflib.get_close_matches(key, list(allowed), n=1)
    return f" (did you mean {m[0]!r}?)" if m else ""

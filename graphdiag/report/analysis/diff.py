"""Compare two runs (control vs test), or two steps of one run. Pure analysis; views/diff.py renders.

Decisions are compared as per-step sequences of events with what differs by run or by time taken out:
timestamps, durations, tokens, and addresses. Graph keys and uids become first-seen ordinals per run
(k1, k2… / u1, u2…) and hex addresses inside values become a1, a2…, so two runs that took the same decisions
on differently placed structs compare equal. `equal` means: same decisions at every step, same counters, the
same capture facts (ledger.py) and the same node rows at every capture (node_diff.py: the LedgerCaptured
rows, which are data rather than decisions and so are compared there, not as events); settings and timings
are reported but never decide it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ... import events as E
from ...errors import UsageError
from .eventlog import describe
from .ledger import LedgerChange, compare_ledgers
from .node_diff import CaptureNodeDiff, compare_run_captures, compare_step_captures
from .devices import device_report
from .measured import gpu_time_source, simulated_timings
from ..record.header import RunHeader
from .summary import summarize

# clock_us (the eviction clock), mem_bytes (measured) and props_digest (covers addresses) vary between runs
IGNORED = {"t_ns", "step", "duration_ns", "gpu_ns", "capture_ns", "idle_ns", "max_abs_diff", "tokens", "clock_us",
           "mem_bytes", "props_digest"}
HEX = re.compile(r"0x[0-9a-fA-F]+")


class Canon:
    """Per-run renaming of keys, uids and addresses to first-seen ordinals."""

    def __init__(self):
        self.maps: dict[str, dict[Any, str]] = {"k": {}, "u": {}, "a": {}}

    def name(self, kind: str, value) -> str:
        m = self.maps[kind]
        if value not in m:
            m[value] = f"{kind}{len(m) + 1}"
        return m[value]

    def key(self, key: int) -> str:
        return self.name("k", key) if key else "-"

    def text(self, s: str) -> str:
        return HEX.sub(lambda m: self.name("a", int(m.group(0), 16)), s)


def signature(ev: E.Event, canon: Canon) -> tuple:
    """What a decision is, comparable across runs: kind and fields, minus times, with ordinals."""
    d = ev.to_dict()
    out = [d.pop("kind"), canon.key(d.pop("key")), canon.name("u", d.pop("uid")) if ev.uid else "-"]
    for name in sorted(set(d) - IGNORED):
        v = d[name]
        if name == "uids":
            v = [canon.name("u", u) for u in v]
        elif name == "old_uid":
            v = canon.name("u", v) if v else "-"
        elif isinstance(v, str):
            is_address = isinstance(ev, E.PropertyDiff) and name in ("old", "new") and ev.field.endswith("data")
            v = canon.name("a", v) if is_address and not HEX.search(v) else canon.text(v)
        out.append((name, tuple(v) if isinstance(v, list) else v))
    return tuple(out)


@dataclass
class Change:
    """One decision added, removed or changed (control -> test), as human-readable lines."""

    change: str                     # "added" | "removed" | "changed"
    control: str | None
    test: str | None


@dataclass
class StepDiff:
    """Decisions of step `step_control` (control) against `step_test` (test), and per key the node rows of
    the captures in force at each step."""

    step_control: int
    step_test: int
    changes: list[Change] = field(default_factory=list)
    nodes: list[CaptureNodeDiff] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.changes and not self.nodes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"equal": self.equal}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass
class Delta:
    """A counter or a median time (ns) in control and test; delta = test - control."""

    name: str
    control: int | None
    test: int | None

    @property
    def delta(self) -> int | None:
        return None if self.control is None or self.test is None else self.test - self.control


@dataclass
class TimingDelta(Delta):
    """A median time (ns) of both runs with its spread (median absolute deviation over the samples: the
    steps of that phase, the splits or chunks) and sample count. `verdict`: "noise" when the change is
    within the runs' combined spread, "1 sample" when either side has one (no spread: never a speedup),
    "faster" / "slower" otherwise, "" when a side has none."""

    control_spread: int = 0
    test_spread: int = 0
    control_n: int = 0
    test_n: int = 0

    @property
    def verdict(self) -> str:
        if self.delta is None:
            return ""
        if min(self.control_n, self.test_n) == 1:
            return "1 sample"
        if abs(self.delta) <= self.control_spread + self.test_spread:
            return "noise"
        return "faster" if self.delta < 0 else "slower"


def timing_delta(name: str, a, b) -> TimingDelta:
    """The TimingDelta of two summary Timings (either None: the run has no sample of it)."""
    return TimingDelta(name, a.median_ns if a else None, b.median_ns if b else None,
                       a.spread_ns if a else 0, b.spread_ns if b else 0, a.n if a else 0, b.n if b else 0)


@dataclass
class SettingChange:
    name: str
    control: Any
    test: Any
    control_source: str = "default"
    test_source: str = "default"


@dataclass
class RunDiff:
    """Two runs compared. `first_divergence` is the first step whose decisions differ (None: none)."""

    control: str
    test: str
    settings: list[SettingChange] = field(default_factory=list)
    counters: list[Delta] = field(default_factory=list)
    timings: list[TimingDelta] = field(default_factory=list)
    first_divergence: StepDiff | None = None
    ledger: list[LedgerChange] = field(default_factory=list)
    nodes: list[CaptureNodeDiff] = field(default_factory=list)
    tokens_differ_at: int | None = None
    tokens_not_computed: list[str] = field(default_factory=list)   # runs of the decisions-only simulator
    devices: list[Delta] = field(default_factory=list)   # per-device outcomes, when either run had several
    simulated: tuple[bool, bool] = (False, False)   # whose timings are the simulated driver's host times
    gpu_time_source: tuple[str, str] = ("", "")     # what each run's "step gpu" measured (measured.py)

    @property
    def equal(self) -> bool:
        return (self.first_divergence is None and not self.ledger and not self.nodes
                and all(d.delta == 0 for d in self.counters))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for group in ("counters", "timings"):
            for item, delta in zip(d[group], getattr(self, group)):
                item["delta"] = delta.delta
                if group == "timings":
                    item["verdict"] = delta.verdict
        return d | {"equal": self.equal}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)


def _decisions(events: list[E.Event]) -> list[E.Event]:
    """Events that are decisions: no spans, and no ledger rows (node_diff.py compares those)."""
    return [e for e in events if not isinstance(e, (E.SpanBegin, E.SpanEnd, E.LedgerCaptured, E.DeviceTime))]


def _by_step(events: list[E.Event], canon: Canon) -> dict[int, list[tuple[tuple, E.Event]]]:
    steps: dict[int, list[tuple[tuple, E.Event]]] = {}
    for ev in events:
        steps.setdefault(ev.step, []).append((signature(ev, canon), ev))
    return steps


def _line(ev: E.Event) -> str:
    head = " · ".join(([f"split {ev.split}"] if ev.split >= 0 else []) + ([f"key {ev.key:#x}"] if ev.key else []))
    return f"{head} · {describe(ev)}" if head else describe(ev)


def compare_sequences(a: list[tuple[tuple, E.Event]], b: list[tuple[tuple, E.Event]]) -> list[Change]:
    """Align two decision sequences by signature; report what was removed, added or changed."""
    sm = difflib.SequenceMatcher(a=[s for s, _ in a], b=[s for s, _ in b], autojunk=False)
    changes: list[Change] = []
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op != "equal":
            changes += _pair([e for _, e in a[i1:i2]], [e for _, e in b[j1:j2]])
    return changes


def _pair(olds: list[E.Event], news: list[E.Event]) -> list[Change]:
    """Within a differing block, an old and a new event of the same kind, split and key are one change;
    the others were removed or added."""
    news = list(news)
    out = []
    for old in olds:
        match = next((n for n in news if (n.kind, n.split, n.key) == (old.kind, old.split, old.key)), None)
        if match is None:
            out.append(Change("removed", _line(old), None))
        else:
            news.remove(match)
            out.append(Change("changed", *_distinct_lines(old, match)))
    return out + [Change("added", None, _line(n)) for n in news]


def _distinct_lines(old: E.Event, new: E.Event) -> tuple[str, str]:
    """The two events' lines; where they read the same, the fields that differ are appended."""
    a, b = _line(old), _line(new)
    if a != b:
        return a, b
    da, db = old.to_dict(), new.to_dict()
    names = [n for n in da if n not in IGNORED and da[n] != db.get(n)]
    return (a + "".join(f" [{n} {_short(da[n])}]" for n in names),
            b + "".join(f" [{n} {_short(db.get(n))}]" for n in names))


def _short(v, most: int = 8) -> str:
    """A field value for a line: long tuples (PropertyDiff.changed) cut to their first `most` items."""
    if isinstance(v, tuple) and len(v) > most:
        return f"({', '.join(map(str, v[:most]))}, … {len(v) - most} more)"
    return str(v)


def diff_steps(events: list[E.Event], step_i: int, step_j: int) -> StepDiff:
    """Compare the decisions of two steps of one run (same renaming for both), and per key the node rows
    of the captures in force at each step."""
    canon = Canon()
    steps = _by_step(_decisions(events), canon)
    for s in (step_i, step_j):
        if s not in steps:
            raise UsageError(f"step {s} is not in the record (steps {min(steps, default=0)}–{max(steps, default=0)})")
    return StepDiff(step_i, step_j, compare_sequences(steps[step_i], steps[step_j]),
                    compare_step_captures(events, canon.key, step_i, step_j))


def diff_runs(control: tuple[RunHeader, list[E.Event]], test: tuple[RunHeader, list[E.Event]],
              names: tuple[str, str] = ("control", "test")) -> RunDiff:
    """Compare two runs: settings, counters, timings, first divergent step, capture facts, node rows."""
    (ha, a_all), (hb, b_all) = control, test
    ea, eb = _decisions(a_all), _decisions(b_all)
    ca, cb = Canon(), Canon()
    d = RunDiff(*names)
    d.settings = _settings(ha, hb)
    d.first_divergence = _first_divergence(_by_step(ea, ca), _by_step(eb, cb))
    sa, sb = summarize(ha, ea), summarize(hb, eb)
    d.counters = [Delta(n, sa.counters[n], sb.counters[n]) for n in sa.counters if n != "refusals_by_reason"]
    d.timings = [timing_delta(n, sa.timings.get(n), sb.timings.get(n))
                 for n in dict.fromkeys([*sa.timings, *sb.timings])]
    d.ledger = compare_ledgers(ea, ca, eb, cb)
    d.nodes = compare_run_captures(a_all, ca.key, b_all, cb.key)
    d.tokens_differ_at = _tokens_differ_at(ea, eb)
    d.tokens_not_computed = [n for n, h in zip(names, (ha, hb)) if h.sim_mode == "decisions"]
    d.devices = _device_deltas(ea, eb)
    d.simulated = (simulated_timings(ha), simulated_timings(hb))
    d.gpu_time_source = (gpu_time_source(ha), gpu_time_source(hb))
    return d


DEVICE_FIGURES = ("keys", "eager", "capture", "replay", "instantiates", "updates", "refusals")


def _device_deltas(a: list[E.Event], b: list[E.Event]) -> list[Delta]:
    """'dev1 replay' and the like for every device of either run (a one-device run is all device 0); empty
    when neither ran on several devices."""
    ra, rb = device_report(a, one_device=True), device_report(b, one_device=True)
    if len(ra.devices) == 1 and len(rb.devices) == 1:
        return []
    out = []
    for dev in range(max(len(ra.devices), len(rb.devices))):
        da = ra.devices[dev] if dev < len(ra.devices) else None
        db = rb.devices[dev] if dev < len(rb.devices) else None
        for f in DEVICE_FIGURES:
            out.append(Delta(f"dev{dev} {f}", getattr(da, f, None), getattr(db, f, None)))
    return out


def _settings(a: RunHeader, b: RunHeader) -> list[SettingChange]:
    """Settings that differ; one a record predates (devices, tensor_split) reads as its default."""
    from ...config import RunConfig
    default = RunConfig().settings()
    names = dict.fromkeys([*a.settings, *b.settings])
    va = {n: a.settings.get(n, default.get(n)) for n in names}
    vb = {n: b.settings.get(n, default.get(n)) for n in names}
    return [SettingChange(n, va[n], vb[n], a.sources.get(n, "default"), b.sources.get(n, "default"))
            for n in names if va[n] != vb[n]]


def _first_divergence(a: dict, b: dict) -> StepDiff | None:
    for step in sorted(set(a) | set(b)):
        changes = compare_sequences(a.get(step, []), b.get(step, []))
        if changes:
            return StepDiff(step, step, changes)
    return None


def _tokens_differ_at(a: list[E.Event], b: list[E.Event]) -> int | None:
    ta = {e.step: e.tokens for e in a if isinstance(e, E.StepFinished)}
    tb = {e.step: e.tokens for e in b if isinstance(e, E.StepFinished)}
    return next((s for s in sorted(set(ta) & set(tb)) if ta[s] != tb[s]), None)

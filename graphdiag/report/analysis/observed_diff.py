"""A graphdiag run against a watched llama.cpp run: the decisions both can show, aligned step by step.

Each record is reduced to what llama.cpp exposes (graphdiag/llama/convert.py): per step, per graph compute,
its evictions of captured entries, its uid hit (ggml's "CUDA Graph id N reused": the cgraph's uid was the
entry's, no property comparison), its warmup transition, its phase (eager / capture / replay; graphs
disabled reads eager) and, for a capture, the captured graph's node count and whether the executable was
new (first instantiate), updated, or refused (with CUDA's result) and instantiated again. Graph entries are
renamed E1, E2, … in the order of their first capture on each side; a graphdiag key evicted and captured
again is a new entry, as the executable lineage llama.cpp's side is made of. An eager compute's entry is
not compared (llama.cpp shows none). Everything else (keys, uids, the changed field, chunks, fusions,
timings) is not compared, and `NOT_COMPARED` says so.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from ... import events as E

NOT_COMPARED = ("graph keys and uids", "which node and field changed", "chunk boundaries", "fusions",
                "timings", "tokens", "the entry of an eager compute",
                "evictions of entries never captured")

_PHASES = {"eager": "eager", "disabled": "eager", "incompatible": "eager", "capture": "capture",
           "replay": "replay"}


@dataclass(frozen=True)
class Decision:
    """One comparable decision: what (evicted | uid | warmup | phase | capture | executable), the entry (""
    not compared), and the outcome text."""

    what: str
    entry: str
    outcome: str

    def line(self) -> str:
        at = f" of {self.entry}" if self.entry else ""
        return f"{self.what}{at}: {self.outcome}"


@dataclass
class ObservedDiff:
    """first: (step, index in the step, control decision or None, test decision or None), None when equal."""

    control: str
    test: str
    steps_compared: int = 0
    decisions_compared: int = 0
    first: tuple | None = None
    control_step: list[str] = field(default_factory=list)   # the whole first differing step, each side
    excused: list[dict] = field(default_factory=list)        # pairs a known difference excused, in order
    known: dict[str, dict] = field(default_factory=dict)     # each excusing entry: its claim and evidence
    known_note: str = ""                                     # why no or not every known difference applied
    test_step: list[str] = field(default_factory=list)
    steps_only_in: dict[str, int] = field(default_factory=dict)
    not_compared: tuple = NOT_COMPARED
    chunk_note: str = ""

    @property
    def equal(self) -> bool:
        """The same decisions at every step, and the same steps (a step only one run has is a difference)."""
        return self.first is None and not self.steps_only_in

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.first is not None:
            step, i, a, b = self.first
            d["first"] = {"step": step, "index": i, "control": a.line() if a else None,
                          "test": b.line() if b else None}
        return d | {"equal": self.equal}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def observed_decisions(events: list[E.Event]) -> dict[int, list[Decision]]:
    """Per step, the decisions llama.cpp could show, in order."""
    entries: dict[tuple, str] = {}               # (device, key, generation) -> "E1"...
    generation: dict[tuple, int] = {}
    captured: set[tuple] = set()                 # (device, key) with a live captured executable
    out: dict[int, list[Decision]] = {}
    refused: dict[tuple, str] = {}

    def entry(ev) -> str:
        k = (ev.device, ev.key, generation.get((ev.device, ev.key), 0))
        return entries.setdefault(k, f"E{len(entries) + 1}")

    for ev in events:
        if isinstance(ev, E.StepStarted):
            out.setdefault(ev.step, [])
        add = out[ev.step].append if ev.step in out else _outside
        dk = (ev.device, ev.key)
        if isinstance(ev, E.Evicted):
            if dk in captured:                   # an entry without an executable leaves no trace upstream
                add(Decision("evicted", entry(ev), "executable destroyed"))
                captured.discard(dk)
            generation[dk] = generation.get(dk, 0) + 1
        elif isinstance(ev, E.UidHit):
            add(Decision("uid", "", "hit"))
        elif isinstance(ev, E.WarmupTransition):
            add(Decision("warmup", "", "complete" if ev.to_state == "warm" else "reset"))
        elif isinstance(ev, E.PhaseDecided) and ev.phase in _PHASES:
            ph = _PHASES[ev.phase]
            add(Decision("phase", "" if ph == "eager" else _peek(ev, entries, generation), ph))
        elif isinstance(ev, E.ChunkCaptured):
            entry(ev)
            captured.add(dk)
            add(Decision("capture", entry(ev), f"{ev.n_graph_nodes} graph nodes"))
        elif isinstance(ev, E.UpdateRefused):
            refused[dk] = ev.reason
        elif isinstance(ev, E.ChunkInstantiated):
            why = refused.pop(dk, None)
            add(Decision("executable", entry(ev), f"refused ({why}), instantiated again" if ev.after_refusal
                         else "instantiated (new)"))
        elif isinstance(ev, E.ChunkUpdated):
            add(Decision("executable", entry(ev), "updated"))
    return {s: _merge_new(d) for s, d in out.items()}


def _outside(d: Decision) -> None:
    """A decision outside any step (none are: the runtime decides inside steps) is not compared."""


def _peek(ev, entries: dict, generation: dict) -> str:
    """The entry a capture or replay decision is about: named now if its first capture comes later in
    this compute (it is numbered there)."""
    k = (ev.device, ev.key, generation.get((ev.device, ev.key), 0))
    return entries.get(k) or f"E{len(entries) + 1}"


def _merge_new(ds: list[Decision]) -> list[Decision]:
    """A new executable's first update (ggml instantiates, then updates what it just instantiated) is part
    of its instantiation: "instantiated (new)" followed by "updated" of the same entry reads as one."""
    out: list[Decision] = []
    for d in ds:
        if (d.what == "executable" and d.outcome == "updated" and out and out[-1].what == "executable"
                and out[-1].entry == d.entry and out[-1].outcome == "instantiated (new)"):
            continue
        out.append(d)
    return out


def diff_observed(control: tuple, test: tuple, names: tuple[str, str] = ("graphdiag", "llama.cpp"),
                  skip: tuple[str, ...] = (), excuse=None) -> ObservedDiff:
    """Align two records (RunHeader, events) by step and name the first decision that differs. `skip`:
    kinds of decision left out (added to `not_compared`). `excuse(step, i, x, y, a, b)` (a, b: each
    side's decisions per step) names the known difference a differing pair is, or None: a named pair is
    recorded in `excused` and the comparison goes on with the next decision (known.py)."""
    (ha, ea), (hb, eb) = control, test
    a, b = observed_decisions(ea), observed_decisions(eb)
    if skip:
        a = {s: [x for x in ds if x.what not in skip] for s, ds in a.items()}
        b = {s: [x for x in ds if x.what not in skip] for s, ds in b.items()}
    d = ObservedDiff(*names)
    d.not_compared = NOT_COMPARED + tuple(f"{w} decisions (left out)" for w in skip)
    common = sorted(set(a) & set(b))
    d.steps_only_in = {n: len(set(x) - set(y)) for n, x, y in ((names[0], a, b), (names[1], b, a)) if set(x) - set(y)}
    d.chunk_note = _chunks_note(ha, ea, hb, eb)
    for step in common:
        d.steps_compared += 1
        xs, ys = a[step], b[step]
        for i in range(max(len(xs), len(ys))):
            x = xs[i] if i < len(xs) else None
            y = ys[i] if i < len(ys) else None
            if x != y and excuse is not None and x is not None and y is not None \
                    and (name := excuse(step, i, x, y, a, b)):
                d.excused.append({"name": name, "step": step, "index": i, "control": x.line(), "test": y.line()})
            elif x != y:
                d.first = (step, i, x, y)
                d.control_step, d.test_step = [v.line() for v in xs], [v.line() for v in ys]
                return d
            d.decisions_compared += 1
    return d


def _chunks_note(ha, ea, hb, eb) -> str:
    """Upstream captures each split as one graph: a graphdiag run with chunks cannot match captures."""
    for h, ev, name in ((ha, ea, "control"), (hb, eb, "test")):
        if any(isinstance(e, E.ChunkBoundary) and e.chunk > 0 for e in ev):
            return (f"the {name} run captured in several chunks (chunk_size {h.settings.get('chunk_size')}): "
                    f"llama.cpp captures each split as one graph; rerun with --chunk-size 0")
    return ""

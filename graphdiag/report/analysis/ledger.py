"""Node-level facts of each captured graph, per key, from the decision events, and their comparison.

The runtime reports the identity ledger only through what changed (PropertyDiff: the first differing node,
its field and the new value; NodeCountChanged; KeyLookup's node count) and through what each capture did
(ChunkBoundary, FusionApplied, ConcurrentRegion, chunk outcomes). `capture_ledgers` folds these into one
fact table per capture: {(node, field): value}; `compare_ledgers` lists the facts that differ between two
runs, capture by capture, for keys matched by first-seen order. Captures are numbered per key and per step
phase ("decode #0"), as node_diff.py numbers them, so a run that also captured its prefill graph still
compares decode captures with decode captures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import events as E

Facts = dict[tuple[str, str], str]
CaptureId = tuple[str, int]          # (phase of the step, capture number of that key in that phase)


@dataclass
class LedgerChange:
    """One fact of the `capture`-th `phase` capture of key `key` (ordinal k1, k2…) that differs."""

    key: str
    capture: int
    node: str
    field: str
    control: str | None
    test: str | None
    phase: str = ""

    @property
    def change(self) -> str:
        return "added" if self.control is None else "removed" if self.test is None else "changed"


def _known_facts(ev: E.Event) -> Facts:
    """Facts about the graph's nodes that persist from step to step."""
    match ev:
        case E.KeyLookup() | E.NodeCountChanged():
            return {("graph", "n_nodes"): str(ev.n_nodes if isinstance(ev, E.KeyLookup) else ev.new)}
        case E.PropertyDiff():
            node = f"node {ev.node}"
            return {(node, "name"): ev.node_name, (node, "op"): ev.op, (node, ev.field): ev.new}
    return {}


def _capture_facts(ev: E.Event) -> Facts:
    """Facts about what one capture did."""
    match ev:
        case E.ChunkBoundary():
            moved = f" (moved by {ev.moved_by})" if ev.moved_by else ""
            return {(f"chunk {ev.chunk}", "nodes"): f"{ev.start_node}–{ev.end_node - 1}{moved}"}
        case E.FusionApplied():
            return {(f"node {ev.node}", "fusion"): f"{ev.pattern} +{ev.absorbed}"}
        case E.ConcurrentRegion():
            return {(f"node {ev.fork_node}", "concurrent"):
                    f"join {ev.join_node}, branches {list(ev.branch_sizes)}"}
        case E.ConcurrentRefused():
            where = f"node {ev.fork_node}" if ev.fork_node >= 0 else "split"
            return {(where, "concurrent refused"): ev.reason}
        case E.ChunkUpdated():
            return {(f"chunk {ev.chunk}", "outcome"): "updated"}
        case E.ChunkInstantiated():
            return {(f"chunk {ev.chunk}", "outcome"): "re-instantiated" if ev.after_refusal else "instantiated"}
        case E.UpdateRefused():
            return {(f"chunk {ev.chunk}", "refused"): ev.reason}
    return {}


def capture_ledgers(events: list[E.Event], key_name) -> dict[str, dict[CaptureId, Facts]]:
    """Per key (named by `key_name(key)`), one fact table per capture, in order, by (phase, number). A pool
    invalidation or an eviction forgets what was known about the entries it dropped."""
    known: dict[int, Facts] = {}
    during: dict[int, Facts] = {}
    phase: dict[int, str] = {}
    out: dict[str, dict[CaptureId, Facts]] = {}
    for ev in events:
        if isinstance(ev, E.StepStarted):
            phase[ev.step] = ev.phase
        elif isinstance(ev, E.PoolInvalidated):
            known.clear()
        elif isinstance(ev, E.Evicted):
            known.pop(ev.key, None)
        if not ev.key:
            continue
        if isinstance(ev, E.PhaseDecided):
            during[ev.key] = {}          # fusions seen in eager steps do not belong to the next capture
        known.setdefault(ev.key, {}).update(_known_facts(ev))
        during.setdefault(ev.key, {}).update(_capture_facts(ev))
        if isinstance(ev, E.CaptureRun):
            caps = out.setdefault(key_name(ev.key), {})
            p = phase.get(ev.step, "")
            caps[(p, sum(q == p for q, _ in caps))] = known[ev.key] | during.pop(ev.key)
    return out


def compare_ledgers(a_events: list[E.Event], a_canon, b_events: list[E.Event], b_canon) -> list[LedgerChange]:
    """Facts that differ between the runs' captures, matched by key ordinal and capture index."""
    la = _canonical(capture_ledgers(a_events, a_canon.key), a_canon)
    lb = _canonical(capture_ledgers(b_events, b_canon.key), b_canon)
    changes: list[LedgerChange] = []
    for key in dict.fromkeys([*la, *lb]):
        ca, cb = la.get(key, {}), lb.get(key, {})
        for (phase, i) in dict.fromkeys([*ca, *cb]):
            if (phase, i) not in ca or (phase, i) not in cb:
                changes.append(LedgerChange(key, i, "-", "captured", "yes" if (phase, i) in ca else None,
                                            "yes" if (phase, i) in cb else None, phase))
                continue
            changes += _compare_facts(key, (phase, i), ca[(phase, i)], cb[(phase, i)])
    return changes


def _canonical(ledgers: dict[str, dict[CaptureId, Facts]], canon) -> dict[str, dict[CaptureId, Facts]]:
    """Addresses in values become the run's ordinals (a1, a2…), as in the decision comparison."""
    def value(fld: str, v: str) -> str:
        return canon.name("a", v) if fld.endswith("data") and not v.startswith("0x") else canon.text(v)
    return {k: {c: {nf: value(nf[1], v) for nf, v in facts.items()} for c, facts in caps.items()}
            for k, caps in ledgers.items()}


def _compare_facts(key: str, capture: CaptureId, a: Facts, b: Facts) -> list[LedgerChange]:
    phase, number = capture
    out = []
    for node_field in sorted(set(a) | set(b), key=_order):
        va, vb = a.get(node_field), b.get(node_field)
        if va != vb:
            out.append(LedgerChange(key, number, node_field[0], node_field[1], va, vb, phase))
    return out


def _order(node_field: tuple[str, str]) -> tuple[Any, ...]:
    """graph facts first, then chunks and nodes by number."""
    node, fld = node_field
    kind, _, num = node.partition(" ")
    return (kind != "graph", kind, int(num) if num.isdigit() else -1, fld)

"""Node-level comparison of captured graphs: the `LedgerCaptured` rows of two captures, node by node.

Each capture's ledger is a tuple of rows (index, name, op, type, ne, nb, op_params digest, flags, data,
sources) with addresses already written as `bN+0xOFF`, so rows of two runs compare as they are. Nodes are
matched by index; a row becomes {field path: value} (`ne[1]`, `src[0].data`, ...) and every path whose
value differs is one `NodeChange`. Pure functions: the diff of two runs and of two steps of one run both
come here, and views/diff.py renders.

Captures are numbered per key and per step phase ("decode #0", "prefill #0"): a run whose batch makes it
capture its prefill graph too still compares its first decode capture with the other run's first decode
capture, not with a prefill graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ... import events as E

Row = tuple


@dataclass
class NodeChange:
    """One field of node `node` that differs: `change` is "changed", "added" (test only) or "removed"."""

    node: int
    name: str                       # the node's name (control's where both have the node)
    field: str                      # "ne[1]", "nb[2]", "op_params", "data", "src[0].data", "node", ...
    control: Any
    test: Any
    change: str = "changed"


@dataclass
class CaptureRef:
    """One capture of a key: `phase` capture number `number` of that key, made at `step`, of `n_nodes`."""

    phase: str
    number: int
    step: int
    n_nodes: int

    @property
    def label(self) -> str:
        return f"{self.phase} #{self.number}".lstrip()


@dataclass
class CaptureNodeDiff:
    """Two captures of key `key` (first-seen ordinal) compared; one side is None when only one run (or
    only one step) has the capture. `changes` lists every differing field, in node order."""

    key: str
    control: CaptureRef | None
    test: CaptureRef | None
    changes: list[NodeChange] = field(default_factory=list)

    @property
    def differs(self) -> bool:
        return self.control is None or self.test is None or bool(self.changes)


@dataclass
class _Capture:
    ref: CaptureRef
    rows: tuple


# -- rows to fields -------------------------------------------------------------------------------------------
def row_fields(row: Row) -> dict[str, Any]:
    """A ledger row as {field path: value}, in the order a person reads a node: name, op, type, ne[k],
    nb[k], op_params, flags, data, then per source src[j].ne[k], src[j].nb[k], src[j].data."""
    _, name, op, typ, ne, nb, params, flags, data, srcs = row
    out: dict[str, Any] = {"name": name, "op": op, "type": typ}
    out |= {f"ne[{k}]": v for k, v in enumerate(ne)}
    out |= {f"nb[{k}]": v for k, v in enumerate(nb)}
    out |= {"op_params": params, "flags": flags, "data": data}
    for j, s_ne, s_nb, s_data in srcs:
        out |= {f"src[{j}].ne[{k}]": v for k, v in enumerate(s_ne)}
        out |= {f"src[{j}].nb[{k}]": v for k, v in enumerate(s_nb)}
        out[f"src[{j}].data"] = s_data
    return out


def _node_summary(row: Row) -> str:
    return f"{row[1]} ({row[2]}) ne {list(row[4])} @ {row[8]}"


def _src_summary(src: tuple) -> str:
    _, ne, _, data = src
    return f"ne {list(ne)} @ {data}"


def compare_rows(a: tuple, b: tuple) -> list[NodeChange]:
    """Every field that differs between two ledgers, node by node (matched by index). A node only one
    side has is one "node" change; a source only one side has is one "src[j]" change."""
    out: list[NodeChange] = []
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b):
            row = b[i] if i >= len(a) else a[i]
            added = i >= len(a)
            out.append(NodeChange(i, row[1], "node", None if added else _node_summary(row),
                                  _node_summary(row) if added else None, "added" if added else "removed"))
            continue
        if a[i] != b[i]:
            out += _compare_node(a[i], b[i])
    return out


def _compare_node(ra: Row, rb: Row) -> list[NodeChange]:
    i, name = ra[0], ra[1]
    fa, fb = row_fields(ra), row_fields(rb)
    out = [NodeChange(i, name, f, fa[f], fb[f]) for f in fa if f in fb and fa[f] != fb[f]]
    sa, sb = {s[0]: s for s in ra[9]}, {s[0]: s for s in rb[9]}
    for j in sorted(set(sa) ^ set(sb)):
        added = j in sb
        out.append(NodeChange(i, name, f"src[{j}]", None if added else _src_summary(sa[j]),
                              _src_summary(sb[j]) if added else None, "added" if added else "removed"))
    return out


# -- captures of a run ----------------------------------------------------------------------------------------
def captures_by_key(events: list[E.Event], key_name: Callable[[int], str]) -> dict[str, list[_Capture]]:
    """Per key (named by `key_name`), its captures in order, numbered per step phase."""
    phase: dict[int, str] = {}
    out: dict[str, list[_Capture]] = {}
    for ev in events:
        if isinstance(ev, E.StepStarted):
            phase[ev.step] = ev.phase
        elif isinstance(ev, E.LedgerCaptured) and ev.key:
            caps = out.setdefault(key_name(ev.key), [])
            p = phase.get(ev.step, "")
            number = sum(c.ref.phase == p for c in caps)
            caps.append(_Capture(CaptureRef(p, number, ev.step, len(ev.nodes)), ev.nodes))
    return out


def _compare(key: str, a: _Capture | None, b: _Capture | None) -> CaptureNodeDiff:
    changes = compare_rows(a.rows, b.rows) if a is not None and b is not None else []
    return CaptureNodeDiff(key, a.ref if a else None, b.ref if b else None, changes)


def compare_run_captures(a_events: list[E.Event], a_key: Callable[[int], str], b_events: list[E.Event],
                         b_key: Callable[[int], str]) -> list[CaptureNodeDiff]:
    """The captures of two runs that differ, matched by key ordinal, phase and capture number; a capture
    only one run made is listed with the other side None."""
    ca, cb = captures_by_key(a_events, a_key), captures_by_key(b_events, b_key)
    out = []
    for key in dict.fromkeys([*ca, *cb]):
        by_a = {(c.ref.phase, c.ref.number): c for c in ca.get(key, [])}
        by_b = {(c.ref.phase, c.ref.number): c for c in cb.get(key, [])}
        for pn in dict.fromkeys([*by_a, *by_b]):
            d = _compare(key, by_a.get(pn), by_b.get(pn))
            if d.differs:
                out.append(d)
    return out


def compare_step_captures(events: list[E.Event], key_name: Callable[[int], str], step_i: int,
                          step_j: int) -> list[CaptureNodeDiff]:
    """Per key, the capture in force at step I (the last one at or before it) against the one in force at
    step J; keys whose two captures differ (or that have one at only one of the steps)."""
    out = []
    for key, caps in captures_by_key(events, key_name).items():
        a = _in_force(caps, step_i)
        b = _in_force(caps, step_j)
        if a is b:
            continue
        d = _compare(key, a, b)
        if d.differs:
            out.append(d)
    return out


def _in_force(caps: list[_Capture], step: int) -> _Capture | None:
    return next((c for c in reversed(caps) if c.ref.step <= step), None)

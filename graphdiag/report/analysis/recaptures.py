"""A trace's recaptures and refused updates, each with what graphdiag's ledger says changed (pure analysis).

A recapture is a capture of an entry captured before (since its last eviction). For each the trace shows in
a batch, graphdiag's recaptures in its replay of that batch are named by the first differing node and field
between the key's previous capture and this one (node_diff.compare_rows over the LedgerCaptured rows), with
how many fields of how many nodes differ; where nothing differs from the previous capture, the change that
reset the key's warmup in between (its last PropertyDiff) is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import events as E
from .node_diff import compare_rows


@dataclass
class Recapture:
    """A recapture or refused update the trace shows in batch `batch` (its index among the trace's batches),
    and what graphdiag's ledger says changed for each recapture graphdiag made in that batch."""

    batch: int
    trace: str
    graphdiag: list[str] = field(default_factory=list)


def recaptures(trace_events: list[E.Event], our_events: list[E.Event], trace_batch: dict[int, int],
               our_batch: dict[int, int], t_keep: dict[int, int], r_keep: dict[int, int],
               trace_index: list[int]) -> list[Recapture]:
    """Each recapture / refused update of the trace (by batch), with graphdiag's recaptures of that batch
    and the ledger's change behind each. *_batch: step -> batch index of each record (replay_diff's
    steps_by_batch); *_keep: batch index -> compared batch; trace_index: compared batch -> trace batch."""
    ours = _our_changes(our_events, our_batch, r_keep)
    out: list[Recapture] = []
    for j, text in _trace_recaptures(trace_events, trace_batch, t_keep):
        if out and out[-1].batch == trace_index[j] and out[-1].trace.split(":")[0] == text.split(":")[0]:
            out[-1].trace += "; " + text.split(": ", 1)[1]         # a capture and its refusal: one step
            continue
        out.append(Recapture(trace_index[j], text, ours.get(j, []) or ["graphdiag made no recapture in this batch"]))
    return out


def _trace_recaptures(events: list[E.Event], batch_of: dict[int, int], keep: dict[int, int]):
    """(compared batch, what the trace shows) for each capture of an entry captured before, and each
    refused update."""
    seen: set[tuple[int, int]] = set()
    refused: dict[int, E.UpdateRefused] = {}
    for ev in events:
        j = keep.get(batch_of.get(ev.step, -1))
        if isinstance(ev, E.UpdateRefused):
            refused[ev.step] = ev
        elif isinstance(ev, E.ChunkCaptured):
            again = (ev.device, ev.key) in seen
            seen.add((ev.device, ev.key))
            if again and j is not None:
                yield j, f"step {ev.step}: entry {ev.key} captured again ({ev.n_graph_nodes} graph nodes)"
        elif isinstance(ev, E.ChunkInstantiated) and ev.after_refusal and j is not None:
            r = refused.pop(ev.step, None)
            why = f"{r.reason}: {r.error_node}" if r is not None and r.error_node else r.reason if r else "?"
            yield j, f"step {ev.step}: its update refused ({why}), instantiated again"


def _our_changes(events: list[E.Event], batch_of: dict[int, int], keep: dict[int, int]) -> dict[int, list[str]]:
    """Per compared batch, one line per graphdiag recapture: the key's previous capture against this one."""
    rows: dict[tuple[int, int], tuple] = {}
    reset: dict[tuple[int, int], E.PropertyDiff] = {}     # the change behind the key's last warmup reset
    refused: set[tuple[int, int]] = set()
    found: list[tuple[int, E.LedgerCaptured, tuple, E.PropertyDiff | None]] = []
    for ev in events:
        k = (ev.device, ev.key)
        if isinstance(ev, E.UpdateRefused):
            refused.add((ev.step, ev.key))
        elif isinstance(ev, E.Evicted):          # a new entry from now on: its next capture is a first one
            rows.pop(k, None)
            reset.pop(k, None)
        elif isinstance(ev, E.PropertyDiff):
            reset[k] = ev
        elif isinstance(ev, E.LedgerCaptured) and ev.key:
            prev, rows[k] = rows.get(k), ev.nodes
            j = keep.get(batch_of.get(ev.step, -1))
            if prev is not None and j is not None:
                found.append((j, ev, prev, reset.get(k)))
    out: dict[int, list[str]] = {}
    for j, ev, prev, pd in found:
        line = change_line(compare_rows(prev, ev.nodes))
        if line == SAME and pd is not None:
            line += (f"; its warmup was reset at step {pd.step} by node {pd.node} {pd.node_name}: {pd.field} "
                     f"{pd.old} → {pd.new}, and changed back")
        out.setdefault(j, []).append(f"step {ev.step}: key {ev.key:#x} captured again"
                                     f"{' (update refused)' if (ev.step, ev.key) in refused else ''}: {line}")
    return out


SAME = "no node changed since its previous capture"


def change_line(changes: list) -> str:
    """The ledger's first change between two captures, and how much more changed."""
    if not changes:
        return SAME
    c = changes[0]
    what = (f"node {c.node} {c.name}: {c.field} {c.control} → {c.test}" if c.change == "changed"
            else f"node {c.node} {c.name} {c.change}")
    nodes = len({x.node for x in changes})
    more = f" (+{len(changes) - 1} more field{'s' if len(changes) != 2 else ''} over {nodes} node" \
           f"{'s' if nodes != 1 else ''})" if len(changes) > 1 else ""
    return what + more

"""Renders a ReplayDiff (analysis/replay_diff.py): graphdiag's replay of a trace's batches against the trace."""

from __future__ import annotations

from typing import TextIO

from ..analysis.replay_diff import ReplayDiff
from .verdict import write_excused, write_verdict


def render_replay_diff(d: ReplayDiff, out: TextIO, header_lines: list[str] = ()) -> None:
    """What ran, the verdict with the first differing decision and both sides' whole batch, the known
    differences excused, each recapture / refused update of the trace with graphdiag's ledger change, and
    what was not compared."""
    out.write(f"trace:  {d.trace}\nreplay: {d.replay}\n")
    for line in header_lines:
        out.write(f"{line}\n")
    out.write(f"compared: {d.decisions_compared} decisions over {d.batches_compared} llama_decode batches\n")
    for note in d.notes:
        out.write(f"note: {note}\n")
    write_excused(out, d.excused, d.known, "batch", lambda x: f" (replay: {x['replay']}; trace: {x['trace']})")
    write_verdict(out, d.first, bool(d.excused), "batch", ("replay", "trace"), (d.replay_batch, d.trace_batch),
                  "decisions: the same in every compared batch", whole_labels=("the replay", "the trace"))
    if d.recaptures:
        out.write(f"recaptures and refused updates in the trace ({len(d.recaptures)}), with what graphdiag's ledger "
                  f"says changed:\n")
        for r in d.recaptures:
            out.write(f"  batch {r.batch}: trace {r.trace}\n")
            for g in r.graphdiag:
                out.write(f"    graphdiag {g}\n")
    out.write("not compared (not observable in a trace): " + ", ".join(d.not_compared) + "\n")

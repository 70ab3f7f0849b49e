"""Renders a ReplayDiff (analysis/replay_diff.py): graphdiag's replay of a trace's batches against the trace."""

from __future__ import annotations

from typing import TextIO

from ..analysis.replay_diff import ReplayDiff


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
    if d.excused:
        out.write(f"known differences: {len(d.excused)} pair{'s' * (len(d.excused) != 1)} excused (every decision "
                  f"after each still compared; --no-known shows them as differences)\n")
        for x in d.excused:
            out.write(f"  batch {x['batch']}, decision {x['index'] + 1}: {x['name']} (replay: {x['replay']}; "
                      f"trace: {x['trace']})\n")
        for name, k in d.known.items():
            out.write(f"  {name}: {k['claim']}\n    evidence: {k['evidence']}\n")
    if d.first is None:
        out.write("decisions: the same in every compared batch" + (" but for the known differences above\n"
                                                                   if d.excused else "\n"))
    else:
        batch, i, a, b = d.first
        out.write(f"first difference: batch {batch}, decision {i + 1}\n")
        out.write(f"  replay: {a.line() if a else '(none)'}\n  trace:  {b.line() if b else '(none)'}\n")
        out.write(f"batch {batch} in the replay: " + ("; ".join(d.replay_batch) or "(no decisions)") + "\n")
        out.write(f"batch {batch} in the trace:  " + ("; ".join(d.trace_batch) or "(no decisions)") + "\n")
    if d.recaptures:
        out.write(f"recaptures and refused updates in the trace ({len(d.recaptures)}), with what graphdiag's ledger "
                  f"says changed:\n")
        for r in d.recaptures:
            out.write(f"  batch {r.batch}: trace {r.trace}\n")
            for g in r.graphdiag:
                out.write(f"    graphdiag {g}\n")
    out.write("not compared (not observable in a trace): " + ", ".join(d.not_compared) + "\n")

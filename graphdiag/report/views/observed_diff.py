"""Renders an ObservedDiff (analysis/observed_diff.py): a graphdiag run against real llama.cpp."""

from __future__ import annotations

from typing import TextIO

from ..analysis.observed_diff import ObservedDiff
from .verdict import write_excused, write_verdict


def render_observed_diff(d: ObservedDiff, out: TextIO) -> None:
    """The verdict, the first decision that differs with both sides' whole step, and what was not compared."""
    out.write(f"control: {d.control}\ntest:    {d.test}\n")
    out.write(f"compared: {d.decisions_compared} decisions over {d.steps_compared} steps (evictions of captured "
              f"entries, warmup, eager/capture/replay, graph nodes per capture, new/updated/refused executables)\n")
    for name, n in d.steps_only_in.items():
        out.write(f"steps only in {name}: {n} (the runs' plans differ: not the same decodes)\n")
    if d.chunk_note:
        out.write(f"note: {d.chunk_note}\n")
    if d.known_note:
        out.write(f"note: {d.known_note}\n")
    write_excused(out, d.excused, d.known, "step",
                  lambda x: f"\n    control: {x['control']}\n    test:    {x['test']}", each_alone=True)
    write_verdict(out, d.first, bool(d.excused), "step", ("control", "test"), (d.control_step, d.test_step),
                  "decisions: the same at every compared step")
    out.write("not compared (not observable in llama.cpp): " + ", ".join(d.not_compared) + "\n")

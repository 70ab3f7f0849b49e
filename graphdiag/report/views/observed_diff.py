"""Renders an ObservedDiff (analysis/observed_diff.py): a graphdiag run against real llama.cpp."""

from __future__ import annotations

from typing import TextIO

from ..analysis.observed_diff import ObservedDiff


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
    _excused(d, out)
    if d.first is None:
        out.write("decisions: the same at every compared step"
                  + (" but for the known differences above\n" if d.excused else "\n"))
    else:
        step, i, a, b = d.first
        out.write(f"first difference: step {step}, decision {i + 1}\n")
        out.write(f"  control: {a.line() if a else '(none)'}\n  test:    {b.line() if b else '(none)'}\n")
        out.write(f"step {step} in control: " + ("; ".join(d.control_step) or "(no decisions)") + "\n")
        out.write(f"step {step} in test:    " + ("; ".join(d.test_step) or "(no decisions)") + "\n")
    out.write("not compared (not observable in llama.cpp): " + ", ".join(d.not_compared) + "\n")


def _excused(d: ObservedDiff, out: TextIO) -> None:
    """Each pair a known difference excused (the comparison went on after it), then each entry's claim and
    evidence once."""
    if not d.excused:
        return
    out.write(f"known differences: {len(d.excused)} pair{'s' * (len(d.excused) != 1)} excused, each alone "
              f"(every decision after it still compared; --no-known shows them as differences)\n")
    for x in d.excused:
        out.write(f"  step {x['step']}, decision {x['index'] + 1}: {x['name']}\n"
                  f"    control: {x['control']}\n    test:    {x['test']}\n")
    for name, k in d.known.items():
        out.write(f"  {name}: {k['claim']}\n    evidence: {k['evidence']}\n")

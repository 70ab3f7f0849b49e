"""The parts a replay diff and an observed diff render alike: the known differences excused, and the verdict with
the first differing decision and both sides' whole step (or batch)."""

from __future__ import annotations

from typing import Callable, TextIO


def write_excused(out: TextIO, excused: list[dict], known: dict, where: str, pair: Callable[[dict], str],
                  each_alone: bool = False) -> None:
    """Each pair a known difference excused (the comparison went on after it), `pair` giving its sides, then
    each entry's claim and evidence once."""
    if not excused:
        return
    out.write(f"known differences: {len(excused)} pair{'s' * (len(excused) != 1)} excused"
              f"{', each alone' if each_alone else ''} (every decision after {'it' if each_alone else 'each'} "
              f"still compared; --no-known shows them as differences)\n")
    for x in excused:
        out.write(f"  {where} {x[where]}, decision {x['index'] + 1}: {x['name']}{pair(x)}\n")
    for name, k in known.items():
        out.write(f"  {name}: {k['claim']}\n    evidence: {k['evidence']}\n")


def write_verdict(out: TextIO, first, excused: bool, where: str, labels: tuple[str, str],
                  whole: tuple[list[str], list[str]], same: str, whole_labels: tuple[str, str] | None = None) -> None:
    """`same` (and "but for the known differences above" where some were excused), or the first difference with
    both sides' decision and their whole `where` (labels padded to one width; `whole_labels` name the sides
    in the whole-step lines where they read differently)."""
    if first is None:
        out.write(same + (" but for the known differences above\n" if excused else "\n"))
        return
    at, i, a, b = first
    width = max(map(len, labels)) + 1
    la, lb = (f"{x}:".ljust(width) for x in labels)
    out.write(f"first difference: {where} {at}, decision {i + 1}\n")
    out.write(f"  {la} {a.line() if a else '(none)'}\n  {lb} {b.line() if b else '(none)'}\n")
    names = whole_labels or labels
    heads = [f"{where} {at} in {label}:" for label in names]
    for head, steps in zip(heads, whole):
        out.write(f"{head.ljust(max(map(len, heads)))} " + ("; ".join(steps) or "(no decisions)") + "\n")

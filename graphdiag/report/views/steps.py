"""The per-step table of a run: kind, tokens in the ubatch, phase, synchronised wall time, GPU time and the
greedy tokens produced; long runs show their first and last steps."""

from __future__ import annotations

from typing import Iterable, TextIO

from rich.table import Table

from ... import events as E
from .tables import make_console
from ..analysis.measured import gpu_column


def step_rows(events: Iterable[E.Event]) -> list[tuple]:
    """(step, kind, n_tokens, mode, wall_ns, gpu_ns, tokens) per finished step, and per failed step with
    mode "FAILED" (no time, no tokens)."""
    started: dict[int, E.StepStarted] = {}
    rows = []
    for ev in events:
        if isinstance(ev, E.StepStarted):
            started[ev.step] = ev
        elif isinstance(ev, E.StepFinished):
            st = started.get(ev.step)
            rows.append((ev.step, st.phase if st else "?", st.n_tokens if st else 0, ev.mode, ev.duration_ns,
                         ev.gpu_ns, tuple(ev.tokens)))
        elif isinstance(ev, E.StepFailed):
            st = started.get(ev.step)
            rows.append((ev.step, ev.phase, st.n_tokens if st else 0, "FAILED", 0, 0, ()))
    return rows


def generated(events: Iterable[E.Event]) -> dict[int, list[int]]:
    """Every greedy token per sequence, in order: a prompt's last ubatch gives its sequence's first token
    (the one the first decode feeds), each decode step one per sequence (sequence = position in the step's
    batch). The plan (plan.py) prefills the prompts of sequences 0, 1, ... in turn before the first decode,
    and a timeline's prefill later is sequence 0's."""
    out: dict[int, list[int]] = {}
    prompts, decoded = 0, False
    for row in step_rows(events):
        if row[1] == "decode":
            decoded = True
            for seq, tok in enumerate(row[6]):
                out.setdefault(seq, []).append(tok)
        elif row[1] == "prefill" and row[6]:
            seq = 0 if decoded else prompts
            prompts += not decoded
            out.setdefault(seq, []).append(row[6][-1])
    return dict(sorted(out.items()))


NOT_COMPUTED = "not computed"


def render_steps(events: list[E.Event], file: TextIO | None = None, head: int = 8, tail: int = 4,
                 simulated: bool = False, tokens_computed: bool = True, text=None) -> None:
    """The steps table then the generated tokens. On the simulated driver the gpu column is the host's time
    in numpy (measured.gpu_column); in its decisions-only mode (`tokens_computed` False) no token was
    computed, and the table says so. `text(ids) -> str`: a model file's vocabulary, to show them as text."""
    rows = step_rows(events)
    if not rows:
        return
    con = make_console(file)
    t = Table(title="Steps", title_justify="left", box=None, pad_edge=False)
    gpu_col = gpu_column(simulated)
    for col in ("step", "kind", "tokens in", "phase", "wall", gpu_col, "tokens out"):
        t.add_column(col, justify="right" if col in ("step", "tokens in", "wall", gpu_col) else "left")
    shown = rows if len(rows) <= head + tail else rows[:head] + [None] + rows[-tail:]
    for r in shown:
        if r is None:
            t.add_row("…", f"{len(rows) - head - tail} more", "", "", "", "", "")
            continue
        step, kind, n_in, mode, wall, gpu, toks = r
        out = " ".join(map(str, toks[:8])) + (" …" if len(toks) > 8 else "") if tokens_computed else NOT_COMPUTED
        t.add_row(str(step), kind, str(n_in), mode, f"{wall / 1e3:.1f} µs" if wall else "-",
                  f"{gpu / 1e3:.1f} µs" if gpu else "-",
                  out)
    con.print("")
    con.print(t)
    if not tokens_computed:
        con.print(f"generated tokens: {NOT_COMPUTED} (the simulator ran decisions only: kernels modelled, no "
                  f"logits; --sim-mode compute computes them)", markup=False)
        return
    for seq, toks in generated(events).items():
        shown_toks = " ".join(map(str, toks[:32])) + (" …" if len(toks) > 32 else "")
        con.print(f"generated (seq {seq}): {shown_toks}", markup=False)
        if text is not None:
            con.print(f"generated (seq {seq}) as text: {text(toks)!r}", markup=False)

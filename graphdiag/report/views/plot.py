"""`graphdiag report RECORD --plot FILE.png|.svg`: a picture of where the time goes. Only draws what
analysis/accounting.py and the decision events say; matplotlib is the optional extra `graphdiag[plot]`.

Top: wall time per step (µs, log scale), coloured by phase, each recapture marked with its cause.
Bottom: update vs instantiate cost per chunk, in step order (refused updates marked).
"""

from __future__ import annotations

from pathlib import Path

from ... import events as E
from ...errors import UsageError
from ..analysis.accounting import Accounting

COLORS = {"prefill": "#8172B3", "eager": "#C44E52", "capture": "#DD8452", "replay": "#55A868", "cpu": "#999999"}


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'graphdiag[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def recaptures(events) -> list[tuple[int, str]]:
    """(step, cause) of every recapture: warmup resets with the property or node count that changed."""
    cause: dict[tuple[int, int], str] = {}
    out = []
    for ev in events:
        if isinstance(ev, E.PropertyDiff):
            cause[(ev.step, ev.key)] = f"{ev.node_name} {ev.field}"
        elif isinstance(ev, E.NodeCountChanged):
            cause[(ev.step, ev.key)] = f"nodes {ev.old}→{ev.new}"
        elif isinstance(ev, E.Evicted):
            out.append((ev.step, "evicted"))
        elif isinstance(ev, E.PoolInvalidated):
            out.append((ev.step, f"pool: {ev.reason}"))
        elif isinstance(ev, E.WarmupTransition) and ev.to_state != "warm":
            out.append((ev.step, cause.get((ev.step, ev.key), "warmup reset")))
    return out


def plot(acc: Accounting, events: list, path: str | Path, title: str = "", simulated: bool = False,
         source: str = "the record") -> Path:
    """Draw the figure to `path` (the suffix picks PNG or SVG); UsageError without matplotlib, or when
    `source` (the record, for the message) has no finished step to draw. `simulated`: the record's timings
    are the simulated driver's (the axis and the legend say what they are)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--plot writes .png or .svg, not {path.name!r}")
    if not acc.steps:
        raise UsageError(f"nothing to plot: {source} has no finished steps")
    plt = _matplotlib()
    fig = figure(plt, acc, events, title, simulated)
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise UsageError(f"cannot write the plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def figure(plt, acc: Accounting, events: list, title: str, simulated: bool):
    """The two panels (see the module docstring), as a matplotlib Figure."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), height_ratios=(3, 2), sharex=True)
    for phase, color in COLORS.items():
        steps = [s for s in acc.steps if s.phase == phase]
        if steps:
            top.bar([s.step for s in steps], [s.wall_ns / 1e3 for s in steps], color=color, width=0.8,
                    label=f"{phase} ({len(steps)})")
    if any(s.busy_ns for s in acc.steps):
        top.plot([s.step for s in acc.steps], [max(s.busy_ns, 1) / 1e3 for s in acc.steps], "k.", ms=4,
                 label=f"{'sim ' if acc.source == 'modelled' else ''}device busy ({acc.source})")
    top.set_yscale("log")
    top.set_ylabel(f"step wall time (µs{', host numpy time: SIMULATED' if simulated else ''})")
    top.set_xlabel("step")
    for k, (step, why) in enumerate(recaptures(events)):
        top.axvline(step, color="#444444", ls="--", lw=0.8)
        top.annotate(why, (step, 1), xycoords=("data", "axes fraction"), xytext=(3, -12 - 11 * (k % 4)),
                     textcoords="offset points", fontsize=7, rotation=0, va="top")
    if top.get_legend_handles_labels()[0]:      # an empty legend() warns
        top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top.set_title(title or "time per step by phase, recaptures marked with their cause", fontsize=10)
    _chunks(bottom, events, simulated)
    fig.tight_layout()
    return fig


def _chunks(ax, events, simulated: bool) -> None:
    ups = [e for e in events if isinstance(e, (E.ChunkUpdated, E.ChunkInstantiated, E.UpdateRefused))]
    styles = {E.ChunkUpdated: ("update", "#4C72B0", "o"), E.ChunkInstantiated: ("instantiate", "#DD8452", "s"),
              E.UpdateRefused: ("update refused", "#C44E52", "x")}
    for cls, (name, color, marker) in styles.items():
        xs = [(e.step, e.duration_ns / 1e3, e.chunk) for e in ups if isinstance(e, cls)]
        if xs:
            ax.scatter([x[0] for x in xs], [x[1] for x in xs], c=color, marker=marker, label=f"{name} ({len(xs)})")
    ax.set_ylabel(f"per chunk (µs{', host time: SIMULATED' if simulated else ''})")
    ax.set_xlabel("step")
    ax.set_title("update vs instantiate cost per chunk", fontsize=10)
    if ups:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no captures", ha="center", va="center", transform=ax.transAxes)

"""Tables of the time accounting (analysis/accounting.py): per phase, graph management, top kernels. Only draws."""

from __future__ import annotations

from rich.table import Table

from ..analysis.accounting import MGMT, Accounting
from ..analysis.eventlog import fmt_ns
from ..analysis.measured import device_label
from .tables import table


def _us(ns: int) -> str:
    return f"{ns / 1e3:.1f}"


def _t(title: str, *cols: str) -> Table:
    return table(title, *cols, left=("phase", "kernel", "nodes", "bound"))


def accounting_tables(acc: Accounting, simulated: bool, traced: bool = False) -> list[Table]:
    """Where the time goes, per phase (µs, medians per step), and the top kernels; none without steps. A trace
    observes no device time: its device columns say so ("-"), not 0."""
    if not acc.phases:
        return []
    dev = {"modelled": "device MODELLED by the simulated driver", "cupti": "device from CUPTI"}.get(
        acc.source, "device time not observable in a trace (host times of the graph calls)" if traced else
        "no device records (run --cupti on CUDA)")
    busy = (lambda ns: "-") if traced and not acc.source else _us
    host = ";\nwall: host times of numpy kernels" if simulated else ""
    t = _t("Time per step (µs, medians)", "phase", "steps", "wall", device_label("dev busy", acc.source),
           device_label("dev idle", acc.source), "bound", "graph mgmt")
    bound = ("\nbound: GPU when the device is busy for half the wall time or more, else host"
             if any(p.bound for p in acc.phases) else "")
    t.caption, t.caption_justify = f"{dev}{host}{bound}", "left"
    for p in acc.phases:
        t.add_row(p.phase, str(p.steps), _us(p.wall_ns), busy(p.busy_ns), busy(p.idle_ns), p.bound or "-",
                  _us(p.mgmt_ns))
    m = _t("Graph management per step (µs, medians)", "phase", *MGMT)
    for p in acc.phases:
        m.add_row(p.phase, *(_us(p.mgmt[k]) for k in MGMT))
    per_token = (f"graph management per token: {fmt_ns(acc.mgmt_per_token_ns)} ({fmt_ns(acc.mgmt_total_ns)} over "
                 f"{acc.tokens} tokens)" if acc.tokens else
                 f"graph management: {fmt_ns(acc.mgmt_total_ns)} in all (no tokens seen: none per token)")
    m.caption = (per_token
                 + ("\nsimulated: a graph launch runs the numpy kernels" if simulated else ""))
    m.caption_justify = "left"
    out = [t, m]
    if acc.top_kernels:
        k = _t(f"Top kernels by device time ({'MODELLED' if acc.source == 'modelled' else 'CUPTI'})", "kernel",
               "calls", "total µs", "µs/call", "nodes")
        k.caption, k.caption_justify = f"{acc.attributed}/{acc.kernels} kernels named by graph node", "left"
        k.columns[-1].max_width, k.columns[-1].overflow = 26, "ellipsis"
        for row in acc.top_kernels:
            k.add_row(row.kernel, str(row.count), _us(row.total_ns), _us(row.total_ns // max(row.count, 1)),
                      row.nodes)
        out.append(k)
    return out

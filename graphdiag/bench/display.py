"""Rendering of `bench steps`: a rich table of the rows (simulated timings labelled so) and a rich progress
display on stderr. Only draws what bench_steps returned."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn
from rich.table import Table

from .steps import Progress


def _ms(v) -> str:
    """A time given in ms, shown in µs (the unit of every graphdiag table)."""
    return "—" if v is None else f"{v * 1000:.1f}"


def _pct(v) -> str:
    return "—" if v is None else f"{v:+.1f} %"


def _x(v) -> str:
    return "—" if v is None else f"{v:.2f}×"


def decode_table(rows: list[dict]) -> Table:
    sim = any(r["simulated"] for r in rows)
    t = Table(title="decode step, batch 1 (µs, medians after warm-up; p90 in brackets)"
                    + (" — SIMULATED: host times of numpy kernels, not GPU results" if sim else ""))
    for col in ("preset", "replay", "eager", "graphs ×", "GPU replay", "host/replay", "to launch", "kernels",
                "roofline", "÷ roofline", "torch graph", "torch eager", "replay ÷ torch graph"):
        t.add_column(col, justify="left" if col == "preset" else "right")
    for r in rows:
        label = f"{r['model']} {r['wtype']}" + (" (sim)" if r["simulated"] else "")
        t.add_row(label, f"{_ms(r['replay_ms'])} ({_ms(r['replay_p90_ms'])})",
                  f"{_ms(r['eager_ms'])} ({_ms(r['eager_p90_ms'])})", _x(r["graph_speedup"]),
                  _ms(r["replay_gpu_ms"]), _ms(r["replay_host_ms"]), _ms(r.get("replay_to_launch_ms")),
                  str(r["kernels_per_step"] or "—"),
                  _ms(r["roofline_ms"]), _x(r["replay_over_roofline"]), _ms(r.get("torch_graph_ms")),
                  _ms(r.get("torch_eager_ms")), _x(r.get("replay_vs_torch_graph")))
    return t


def prefill_table(rows: list[dict]) -> Table:
    t = Table(title="prefill (µs, median of the timed prefills)")
    for col in ("preset", "tokens", "graphdiag", "torch", "graphdiag ÷ torch"):
        t.add_column(col, justify="left" if col == "preset" else "right")
    for r in rows:
        label = f"{r['model']} {r['wtype']}" + (" (sim)" if r["simulated"] else "")
        t.add_row(label, str(r["n_tokens"]), _ms(r["prefill_ms"]), _ms(r.get("torch_prefill_ms")),
                  _x(r.get("prefill_vs_torch")))
    return t


def _host_refs(console: Console, rows: list[dict]) -> None:
    """The host reference before each row (and before its PyTorch peer, which runs later): a ratio whose two
    sides were timed at different host speeds says so here."""
    def ref(r):
        peer = r.get("torch_host_ref_us")
        return f"{r['model']} {r['wtype']} {r['host_ref_us']:.0f}" + ("" if peer is None else f" / {peer:.0f}")
    refs = [ref(r) for r in rows if r.get("host_ref_us") is not None]
    if refs:
        peers = any(r.get("torch_host_ref_us") is not None for r in rows)
        console.print("host reference before each row" + (" / before its PyTorch peer" if peers else "")
                      + " (µs of a fixed piece of host Python; the host figures scale with it): " + ", ".join(refs))


def render(rows: list[dict], file=None) -> None:
    """The tables, then the copy bandwidth and the PyTorch peer's state, to `file` (stdout)."""
    console = Console(file=file)
    if not console.is_terminal:
        console.width = 200   # a file or a pipe: one table row per line
    dec = [r for r in rows if r["kind"] == "decode"]
    pre = [r for r in rows if r["kind"] == "prefill"]
    if dec:
        console.print(decode_table(dec))
        bw = dec[0].get("copy_GBps")
        console.print(f"roofline: (weight bytes + KV bytes read) / device-to-device copy "
                      f"{'—' if bw is None else f'{bw:.0f} GB/s'} measured in this run"
                      + (" (simulated: a host memcpy)" if dec[0]["simulated"] else ""))
        _host_refs(console, dec)
        shares = [f"{r['model']} {r['wtype']} {_pct(r.get('instr_share_pct'))}" for r in dec if "instr_share_pct" in r]
        if shares:
            live = any(r.get("instr_nvtx_live") for r in dec)
            console.print("instrumentation (event record, counters" + (", NVTX" if live else "; NVTX idle: no tool")
                          + ") on a replayed step: " + ", ".join(shares))
    if pre:
        console.print(prefill_table(pre))
        _host_refs(console, pre)
    peers = {r.get("torch") for r in rows if r.get("torch")}
    if peers:
        console.print("PyTorch: " + ", ".join(sorted(peers)))
    elif rows and rows[0]["simulated"]:
        console.print("PyTorch peer: skipped (simulated run)")


class RichProgress(Progress):
    """A bar per phase on stderr, with the weights' loading shown in the phase's line. It is drawn only when the
    benchmark reports progress (between steps, at most every REFRESH_S), never by rich's refresh thread: a
    redraw holds the interpreter for a millisecond or more, and one landing inside a timed step is in its
    time (a 25 ms prefill read 32 ms in the CLI)."""

    REFRESH_S = 0.1

    def __init__(self):
        self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=Console(stderr=True), auto_refresh=False)
        self.task, self.label = None, ""
        self._drawn = 0.0   # time.monotonic() of the last redraw

    def _draw(self, now: bool = False) -> None:
        t = time.monotonic()
        if now or t - self._drawn >= self.REFRESH_S:
            self.bar.refresh()
            self._drawn = t

    def __enter__(self) -> "RichProgress":
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def start(self, label: str, total: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=self.bar.tasks[-1].total)
        self.label = label
        self.task = self.bar.add_task(label, total=total)
        self._draw(now=True)

    def note(self, text: str) -> None:
        self.bar.update(self.task, description=f"{self.label} · {text}")
        self._draw()

    def advance(self, n: int = 1) -> None:
        self.bar.update(self.task, advance=n, description=self.label)
        self._draw()

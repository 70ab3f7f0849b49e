"""Rendering of `bench steps`: the rows as tables within 80 columns (one column per preset, one row per
figure; simulated timings labelled so) and progress on stderr: a rich bar on a terminal, plain lines
otherwise. Only draws what bench_steps returned."""

from __future__ import annotations

import time

from rich import box
from rich.console import Console
from rich.measure import Measurement
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


def _ratio(r: dict, key: str) -> str:
    """A ratio of the row, with the range over its rounds where it has several."""
    span = r.get(f"{key}_range")
    return _x(r.get(key)) + (f" ({span[0]:.2f}–{span[1]:.2f})" if span and r.get(key) is not None else "")


WIDTH = 80            # every table fits this many columns: presets go side by side only as far as they fit


def _label(r: dict) -> str:
    sim = " (sim: decisions only)" if r.get("decisions_only") else " (sim)"
    return f"{r['model']} {r['wtype']}" + (sim if r["simulated"] else "")


LLAMA_METRICS = [
    ("llama.cpp replay", lambda r: f"{_ms(r.get('llama_replay_ms'))} ({_ms(r.get('llama_replay_p90_ms'))})"),
    ("llama.cpp graphs off", lambda r: f"{_ms(r.get('llama_eager_ms'))} ({_ms(r.get('llama_eager_p90_ms'))})"),
    ("replay ÷ llama.cpp", lambda r: _ratio(r, "replay_vs_llama")),
    ("  fastest rounds", lambda r: _x(r.get("replay_vs_llama_fastest"))),      # shown with several rounds
    ("eager ÷ llama.cpp off", lambda r: _ratio(r, "eager_vs_llama")),
    ("  fastest rounds", lambda r: _x(r.get("eager_vs_llama_fastest"))),
    ("llama.cpp graphs ×", lambda r: _ratio(r, "llama_graph_speedup")),
]


def decode_metrics(sim: bool, llama: bool = False, rounds: bool = False) -> list[tuple[str, object]]:
    """(row name, cell of a result row) of the decode table, one row per figure; with the llama.cpp peer its
    rows follow graphdiag's replay and eager (the headline comparison), and with several rounds each ratio's
    comparison of both sides' fastest rounds under it. On the simulated driver the "GPU" part of a replayed
    step is the host's numpy time (its kernels run inside the driver calls)."""
    head = [
        ("replay (p90)", lambda r: f"{_ms(r['replay_ms'])} ({_ms(r['replay_p90_ms'])})"),
        ("eager (p90)", lambda r: f"{_ms(r['eager_ms'])} ({_ms(r['eager_p90_ms'])})"),
    ]
    peer = [m for m in LLAMA_METRICS if rounds or m[0] != "  fastest rounds"] if llama else []
    return head + peer + _rest(sim)


def _rest(sim: bool) -> list[tuple[str, object]]:
    return [
        ("graphs × (eager ÷ replay)", lambda r: _ratio(r, "graph_speedup")),
        ("numpy in replay (sim)" if sim else "GPU replay", lambda r: _ms(r["replay_gpu_ms"])),
        ("host outside numpy" if sim else "host/replay", lambda r: _ms(r["replay_host_ms"])),
        ("to launch", lambda r: _ms(r.get("replay_to_launch_ms"))),
        ("kernels", lambda r: str(r["kernels_per_step"] or "—")),
        ("roofline", lambda r: _ms(r["roofline_ms"])),
        ("replay ÷ roofline", lambda r: _ratio(r, "replay_over_roofline")),
        ("torch graph", lambda r: _ms(r.get("torch_graph_ms"))),
        ("torch eager", lambda r: _ms(r.get("torch_eager_ms"))),
        ("replay ÷ torch graph", lambda r: _x(r.get("replay_vs_torch_graph"))),
    ]


def _transposed(rows: list[dict], metrics: list[tuple[str, object]]) -> Table:
    """One column per result row (preset and weight type), one row per figure."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style=None)
    t.add_column("µs", justify="left", no_wrap=True)
    for r in rows:
        t.add_column(_label(r), justify="right", no_wrap=True)
    for name, cell in metrics:
        t.add_row(name, *(cell(r) for r in rows))
    return t


def fitted_tables(rows: list[dict], metrics: list[tuple[str, object]], console: Console,
                  width: int = WIDTH) -> list[Table]:
    """The transposed table of `rows`, split into as many tables as it takes for each to fit `width`
    columns (a row whose column alone is wider still gets a table of its own)."""
    wide = console.options.update(max_width=10 * width)      # the table's natural width, not the console's
    tables, group = [], []
    for r in rows:
        if group and Measurement.get(console, wide, _transposed(group + [r], metrics)).maximum > width:
            tables.append(_transposed(group, metrics))
            group = []
        group.append(r)
    return tables + ([_transposed(group, metrics)] if group else [])


def decode_title(rows: list[dict]) -> str:
    sim = any(r["simulated"] for r in rows)
    rounds = max(r.get("rounds", 1) for r in rows)
    return ("decode step, batch 1 (µs, medians after warm-up; p90 in brackets)"
            + (f"; {rounds} rounds" + (" in turn (graphdiag first, then llama.cpp first, ...)"
                                         if any(r.get("llama") for r in rows) else "")
               + ": times the rounds' medians; a ratio with a range in brackets is the median of the rounds' own "
               "ratios" if rounds > 1 else "")
            + (" — SIMULATED: host times of numpy kernels, not GPU results" if sim else ""))


PREFILL_METRICS = [("tokens", lambda r: str(r["n_tokens"])), ("graphdiag", lambda r: _ms(r["prefill_ms"])),
                   ("torch", lambda r: _ms(r.get("torch_prefill_ms"))),
                   ("graphdiag ÷ torch", lambda r: _x(r.get("prefill_vs_torch")))]


def _host_refs(console: Console, rows: list[dict]) -> None:
    """The host reference before each row, before its llama.cpp peer and before its PyTorch peer (which runs
    later): a ratio whose two sides were timed at different host speeds says so here (for llama.cpp, by
    steps.host_speed_differed: in how many rounds). One line per row, so no reference is broken."""
    from .steps import HOST_SPEED_TOLERANCE

    def ref(r):
        llama, peer, differed = r.get("llama_host_ref_us"), r.get("torch_host_ref_us"), r.get("host_speed_differed")
        line = f"  {r['model']} {r['wtype']} {r['host_ref_us']:.0f}"
        line += "" if llama is None else f" · llama.cpp {llama:.0f}"
        line += "" if peer is None else f" / {peer:.0f}"
        if differed and r.get("rounds", 1) > 1:
            line += f" ({differed} of {r['rounds']} rounds apart > {HOST_SPEED_TOLERANCE}×)"
        elif differed:
            line += f" (apart > {HOST_SPEED_TOLERANCE}×: its ratios compare host speeds)"
        return line
    refs = [ref(r) for r in rows if r.get("host_ref_us") is not None]
    if refs:
        llamas = any(r.get("llama_host_ref_us") is not None for r in rows)
        peers = any(r.get("torch_host_ref_us") is not None for r in rows)
        several = any(r.get("rounds", 1) > 1 for r in rows)
        console.print("host reference before each row" + (" (the median over its rounds)" if several else "")
                      + (" · its llama.cpp peer" if llamas else "")
                      + (" / before its PyTorch peer" if peers else "") + ":")
        for line in refs:
            console.print(line)
        console.print("  (µs of a fixed piece of host Python; the host figures scale with it)")


def render(rows: list[dict], file=None, console: Console | None = None) -> None:
    """The tables, then the copy bandwidth and the PyTorch peer's state, to `file` (stdout), within WIDTH
    columns."""
    console = console or Console(file=file, highlight=False)
    if not console.is_terminal:
        console.width = WIDTH
    dec = [r for r in rows if r["kind"] == "decode"]
    pre = [r for r in rows if r["kind"] == "prefill"]
    if dec:
        console.print(decode_title(dec))
        llama = any(r.get("llama") for r in dec)
        rounds = any(r.get("rounds", 1) > 1 for r in dec)
        for t in fitted_tables(dec, decode_metrics(any(r["simulated"] for r in dec), llama, rounds), console):
            console.print(t)
        bw = dec[0].get("copy_GBps")
        console.print(f"roofline: (weight bytes + KV bytes read) / device-to-device copy "
                      f"{'—' if bw is None else f'{bw:.0f} GB/s'} measured in this run"
                      + (" (simulated: a host memcpy)" if dec[0]["simulated"] else ""))
        _host_refs(console, dec)
        for r in rows:
            if r.get("decisions_only"):
                console.print(f"{r['model']} {r['wtype']} {r['kind']}: decisions only on the simulator (its default "
                              f"for a big model: kernels modelled, not computed), so no timings; the decisions "
                              f"(kernels a step) are real")
        shares = [f"  {r['model']} {r['wtype']} {_pct(r.get('instr_share_pct'))}" for r in dec if "instr_share_pct" in r]
        if shares:
            live = any(r.get("instr_nvtx_live") for r in dec)
            console.print("instrumentation (event record, counters" + (", NVTX" if live else "; NVTX idle: no tool")
                          + ") on a replayed step:")
            for line in shares:
                console.print(line)
    if pre:
        console.print("prefill (µs, median of the timed prefills)")
        for t in fitted_tables(pre, PREFILL_METRICS, console):
            console.print(t)
        _host_refs(console, pre)
    launchers = sorted({r["launcher"] for r in rows if r.get("launcher")})
    if launchers:
        console.print("eager launches: " + "; ".join(launchers))
    peered = [r for r in rows if r.get("llama")]
    if peered:
        files = any(r.get("model_types") for r in peered)
        presets = any(not r.get("model_types") for r in peered)
        what = " and ".join(x for x, on in (("each preset row's model exported as GGUF", presets),
                                            ("each file row's file itself", files)) if on)
        console.print(f"llama.cpp: 0.3.36 (llama-cpp-python) on {what}, the same plan and n_kv; llama_decode "
                      "through llama_synchronize, each mode in its own process, timed without CUPTI (graphs on: "
                      "which steps replayed read from a watched run of the same plan)")
    peers = {r.get("torch") for r in rows if r.get("torch")}
    if peers:
        console.print("PyTorch: " + ", ".join(sorted(peers)) + " — plain unfused PyTorch ops, F16 rows only; its "
                      "step leaves out graphdiag's input upload, logits read-back and argmax")
    elif rows and rows[0]["simulated"]:
        console.print("PyTorch peer: skipped (simulated run)")


class PlainProgress(Progress):
    """Progress as plain lines on a file that is not a terminal (a log, CI): 'bench steps: tiny f16 graphs
    on 3/65' when a phase starts, when it completes, and at most every EVERY_S in between (a line is a few
    µs of host time; a live bar would be redrawn into a file)."""

    EVERY_S = 10.0

    def __init__(self, file, clock=time.monotonic):
        self.file, self.clock = file, clock
        self.label, self.total, self.done, self._said = "", 0, 0, 0.0

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def _say(self, text: str) -> None:
        self.file.write(f"bench steps: {text}\n")
        self.file.flush()
        self._said = self.clock()

    def _due(self) -> bool:
        return self.clock() - self._said >= self.EVERY_S

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self._say(f"{label} 0/{total}")

    def note(self, text: str) -> None:
        if self._due():
            self._say(f"{self.label} · {text}")

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.done == self.total or self._due():
            self._say(f"{self.label} {self.done}/{self.total}")


def progress_for(stream) -> Progress:
    """A rich bar on a terminal, plain lines otherwise."""
    isatty = getattr(stream, "isatty", None)
    return RichProgress() if isatty is not None and isatty() else PlainProgress(stream)


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

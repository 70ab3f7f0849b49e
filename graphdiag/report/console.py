"""The terminal report (rich): run header, live event log with a progress bar, summary tables.

Everything renders into any file object. `make_console(file, plain=True)` gives a fixed-width console with
no colour and no terminal features, which is what tests and redirected output get.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Iterable, TextIO

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import events as E
from .eventlog import EventLog, fmt_ns
from .record import RunHeader, as_header
from .diagnoses_view import diagnosis_lines
from .measured import gpu_phrase, simulated_timings, timing_name
from .summary import Summary, disabled_cause

WIDTH = 120          # fixed width of plain (non-terminal) output


def make_console(file: TextIO | None = None, plain: bool | None = None) -> Console:
    """A console on `file` (stdout by default). plain=None: plain unless the file is a terminal."""
    file = file if file is not None else sys.stdout
    if plain is None:
        plain = not (hasattr(file, "isatty") and file.isatty())
    if plain:
        con = Console(file=file, width=WIDTH, color_system=None, force_terminal=False, highlight=False,
                      emoji=False, soft_wrap=True, no_color=True)
    else:
        con = Console(file=file, highlight=False, soft_wrap=True)
    con.on_broken_pipe = _broken_pipe        # rich would exit the process (SystemExit 1) before the record ends
    return con


def _broken_pipe() -> None:
    raise BrokenPipeError("output closed")


def header_lines(header: RunHeader) -> list[str]:
    """The run header: backend (SIMULATED said plainly, or the GPU's name), model, scenario, then every
    setting with where it came from when that is not the default."""
    if header.backend == "cpu":
        where = "backend cpu · no GPU (numpy kernels)"
    elif header.simulated:
        where = f"backend {header.backend} · SIMULATED GPU: {header.device}"
    else:
        where = f"backend {header.backend} · GPU: {header.device}"
    scen = f" · scenario {header.scenario}" if header.scenario else ""
    lines = [f"graphdiag {header.graphdiag_version} · {where} · model {header.model}{scen}",
             f"started {header.started}"]
    if header.note:
        lines.insert(1, f"note: {header.note}")
    lines += run_mode_lines(header)
    mf = header.model_file
    if mf:
        types = ", ".join(f"{n} ×{k}" for n, k in sorted(mf.get("types", {}).items()))
        lines.append(f"model file: {mf.get('path')} ({mf.get('arch')}, {mf.get('tensors')} tensors: {types}; "
                     f"{mf.get('bytes', 0):,} bytes of weights, memory-mapped; --wtype does not apply)")
    items = []
    for name, value in header.settings.items():
        src = header.sources.get(name, "default")
        items.append(f"{name}={_setting(value)}" + ("" if src == "default" else f" [{src}]"))
    return lines + _wrap_items("settings:", items)


def run_mode_lines(header: RunHeader) -> list[str]:
    """Which mode the simulated driver ran in (and why), and numpy's BLAS threads; none for an older record."""
    lines = []
    if header.sim_mode == "decisions":
        lines += [f"simulator: DECISIONS ONLY ({header.sim_mode_reason}) · no logits, no tokens "
                  f"(--sim-mode compute computes them)",
                  "  kernels modelled, not computed · device memory reserved, not materialised · the same decisions"]
    elif header.sim_mode == "compute":
        lines.append(f"simulator: computing ({header.sim_mode_reason}) · every kernel in numpy, every device "
                     f"byte in host memory")
    if header.blas:
        from ..config import BlasThreads
        lines.append(f"numpy BLAS threads: {BlasThreads(**header.blas).describe()}")
    return lines


def _wrap_items(first: str, items: list[str]) -> list[str]:
    """Join items with two spaces into lines of at most WIDTH, never breaking inside an item."""
    lines, line = [], first
    for item in items:
        sep = " " if line == first else "  "
        if len(line) + len(sep) + len(item) > WIDTH:
            lines.append(line)
            line, sep = "", "  "
        line += sep + item
    return lines + [line]


def _setting(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return "-" if v is None else str(v)


class ConsoleReporter:
    """An event sink printing the run header, the event log up to `verbosity` and a progress bar over
    `total_steps` (only on a terminal unless `progress` says otherwise). Without a header at construction,
    `start(header)` (the runner's on_header hook) prints it. Call `close()` at the end."""

    def __init__(self, header: RunHeader | dict | None = None, verbosity: int = 0, file: TextIO | None = None,
                 total_steps: int | None = None, progress: bool | None = None, console: Console | None = None):
        self.console = console or make_console(file)
        self.verbosity = verbosity
        self.log = EventLog()
        if progress is None:
            progress = self.console.is_terminal and bool(total_steps)
        self._want_progress, self._total = progress, total_steps
        self.progress: Progress | None = None
        self._header: RunHeader | None = None
        self._broken = self._told = False
        self.sink_name = "the terminal report"
        if header is not None:
            self.start(header)

    def start(self, header: RunHeader | dict) -> None:
        """Print the run header and start the progress bar (when wanted)."""
        self._header = as_header(header)
        self.log.gpu_label = gpu_phrase(simulated_timings(self._header))
        try:
            for line in header_lines(self._header):
                self.console.print(line, markup=False)
        except BrokenPipeError:
            self._broken = True
            return
        if self._want_progress and self.progress is None:
            self.progress = self._start_progress(self._total)

    def _start_progress(self, total: int | None) -> Progress:
        p = Progress(TextColumn("step"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     console=self.console, transient=True)
        self._task = p.add_task("steps", total=total)
        p.start()
        return p

    def __call__(self, ev: E.Event) -> None:
        if self._broken:
            if not self._told:             # the header found the pipe closed: end the run at its first event
                self._told = True
                raise BrokenPipeError("output closed")
            return
        if isinstance(ev, E.GraphsDisabled) and self._header is not None:
            ev = dataclasses.replace(ev, reason=disabled_cause(self._header, ev.reason))
        try:
            for level, line in self.log.feed(ev):
                if level <= self.verbosity:
                    self.console.print(line, markup=False)
            if self.progress is not None and isinstance(ev, E.StepFinished):
                self.progress.advance(self._task)
        except BrokenPipeError:
            self._broken = self._told = True   # the reader went away: say nothing more, let the run end
            raise

    def close(self) -> None:
        """Stop the progress bar (idempotent)."""
        if self.progress is not None:
            p, self.progress = self.progress, None
            try:
                p.stop()
            except BrokenPipeError:
                pass

    def __enter__(self) -> "ConsoleReporter":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def render_summary(summary: Summary, file: TextIO | None = None, console: Console | None = None) -> None:
    """Summary tables: overview, per key, timings, llama.cpp counters, graphdiag counters, notes."""
    con = console or make_console(file)
    con.print(_overview(summary), markup=False)
    tables = [_key_table(summary)] if summary.keys else []
    if summary.devices is not None:
        from .devices_view import device_table
        tables.append(device_table(summary.devices))
    tables += [_timing_table(summary)] if summary.timings else []
    from .accounting_view import accounting_tables
    tables += accounting_tables(summary.accounting, simulated_timings(summary.header))
    for t in tables + [_llama_table(summary), _counter_table(summary)]:
        con.print("")
        con.print(t)
    notes = _notes(summary)
    if notes:
        con.print("")
    for line in notes:
        con.print(line, markup=False)


def render_report(header: RunHeader, events: Iterable[E.Event], summary: Summary, file: TextIO | None = None,
                  verbosity: int = 0) -> None:
    """The whole offline report: header, event log at `verbosity`, summary (what `graphdiag report` prints)."""
    con = make_console(file)
    reporter = ConsoleReporter(header, verbosity, console=con, progress=False)
    for ev in events:
        reporter(ev)
    con.print("")
    render_summary(summary, console=con)


def _overview(s: Summary) -> str:
    modes = ", ".join(f"{n} {m}" for m, n in s.step_modes.items())
    failed = len(s.faults.failures)
    modes += f"{', ' if modes else ''}{failed} failed" if failed else ""
    mode = {"decisions": " · simulator decisions-only (tokens not computed)",
            "compute": " · simulator computing"}.get(s.header.sim_mode, "")
    return (f"{s.steps} steps ({modes or 'none'}) · {s.distinct_keys} graph key"
            f"{'s' if s.distinct_keys != 1 else ''} · max {s.max_chunks} chunks per graph{mode}")


TEXT_COLUMNS = ("key", "what", "counter", "setting", "node", "field", "change")


def table(title: str, *cols: str, left: tuple[str, ...] = ()) -> Table:
    """A borderless table; text columns (TEXT_COLUMNS and `left`) align left, numbers right."""
    t = Table(title=title, title_justify="left", title_style=None, box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, header_style=None)
    for c in cols:
        t.add_column(c, justify="left" if c in TEXT_COLUMNS or c in left else "right", no_wrap=True)
    return t


def _key_table(s: Summary) -> Table:
    """Fits 80 columns: keys as k1, k2… (the legend below gives their addresses), the number of splits."""
    dev = ("dev",) if s.devices is not None else ()      # several devices: whose cache holds the key
    t = table("Per graph key (steps per phase; chunk outcomes)", "key", *dev, "splits", "eager", "capt", "replay",
              "chunks", "upd", "inst", "refused", "resets", "evict")
    for i, k in enumerate(s.keys, 1):
        t.add_row(f"k{i}", *((str(k.device),) if dev else ()), str(len(k.splits)), str(k.steps_eager), str(k.steps_capture),
                  str(k.steps_replay), str(k.chunks), str(k.updates), str(k.instantiates),
                  str(sum(k.refusals.values())), str(k.warmup_resets), str(k.evictions))
    t.padding = (0, 1, 0, 0)
    t.caption = "  ".join(f"k{i} = {k.key:#x}" for i, k in enumerate(s.keys, 1))
    t.caption_justify = "left"
    return t


SIMULATED_TIMES = "SIMULATED driver: host times, not GPU times"


def timing_title(what: str, simulated: bool) -> str:
    """A timing table's title, saying so when its numbers come from the simulated driver."""
    return f"{what} — {SIMULATED_TIMES}" if simulated else what


def _timing_table(s: Summary) -> Table:
    sim = simulated_timings(s.header)
    t = table(timing_title("Timing (medians)", sim), "what", "median", "samples")
    for name, tm in s.timings.items():
        t.add_row(timing_name(name, sim), fmt_ns(tm.median_ns), str(tm.n))
    # like with like: synchronised decode steps, eager (warmup, graphs not used) against replayed; prefill
    # steps are eager too but process many tokens, so they are not in the comparison
    eager, replay = s.timings.get("step (eager decode)"), s.timings.get("step (replay)")
    if eager and replay and replay.median_ns:
        one = " (1 sample)" if min(eager.n, replay.n) == 1 else ""   # one step is not a measured speedup
        t.add_row(f"replay {'ratio' if one else 'speedup'} (eager decode step ÷ replay step)",
                  f"{eager.median_ns / replay.median_ns:.1f}×{one}", f"{eager.n}/{replay.n}")
    return t


def _llama_table(s: Summary) -> Table:
    t = table("llama.cpp counters", "counter", "value")
    for name, value in s.llama_counters.items():
        t.add_row(name, str(value))
    return t


def _counter_table(s: Summary) -> Table:
    t = table("graphdiag counters", "counter", "value", "counter", "value")
    names = [n for n in s.counters if n != "refusals_by_reason"]
    half = (len(names) + 1) // 2
    for left, right in zip(names[:half], names[half:] + [""]):
        t.add_row(left, str(s.counters[left]), right, str(s.counters[right]) if right else "")
    return t


def _notes(s: Summary) -> list[str]:
    notes = []
    for k in s.keys:
        if k.refusals:
            reasons = ", ".join(f"{r} ×{n}" for r, n in sorted(k.refusals.items()))
            notes.append(f"update refusals at key {k.key:#x}: {reasons}")
    if s.property_diff_fields:
        notes.append("fields that changed: " + ", ".join(s.property_diff_fields))
    notes += [f"graphs disabled: {r}" for r in s.disabled_reasons]
    notes += [f"incompatible: {r}" for r in s.incompatible]
    if s.devices is not None:
        from .devices_view import link_lines
        notes += link_lines(s.devices)
    notes += diagnosis_lines(s)
    if s.verify_checks:
        notes.append(f"verify: {s.verify_checks} checks, {s.verify_mismatches} mismatches")
    if s.oracle_checks:
        notes.append(f"oracle: {s.oracle_checks} checks, max relative error {s.oracle_max_rel_err:.3g} "
                     f"(bound {s.oracle_bound:g}), {s.oracle_failures} over the bound")
    notes += [f"cut off: {c} (every other output got every event)" for c in s.sinks_cut_off]
    notes += end_lines(s)
    return notes


def end_lines(s: Summary) -> list[str]:
    """How the run ended, when it did not simply complete."""
    e = s.ended
    if e is None:
        return ["run end not recorded: the record stops early (the run was killed, or an older record)"]
    if e.status == "complete":
        return []
    why = f": {e.reason}" if e.reason else ""
    return [f"run {e.status.upper()} at step {e.step} ({e.steps_done} steps finished){why}"]

"""The terminal report (rich): run header, event log, summary tables. Only draws; the live report (with its
progress bar) is sinks/console.py, fed from the bus.

Everything renders into any file object. `make_console(file, plain=True)` (tables.py) gives a fixed-width
console with no colour and no terminal features, which is what tests and redirected output get.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, TextIO

from rich.console import Console
from rich.table import Table

from ... import events as E
from ...events.checks import ORACLE_FLOOR, ORACLE_NOISE_FACTOR
from ..analysis.eventlog import EventLog, fmt_ns
from ..analysis.measured import gpu_phrase, simulated_timings, timing_name
from ..analysis.summary import Summary, disabled_cause
from ..record.header import RunHeader, as_header
from .accounting import accounting_tables
from .devices import device_table, link_lines
from .diagnoses import diagnosis_lines
from .tables import WIDTH, make_console, table, timing_title

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
    if header.launcher:
        lines.append(f"eager launches: {header.launcher}")
    mf = header.model_file
    if mf:
        types = ", ".join(f"{n} ×{k}" for n, k in sorted(mf.get("types", {}).items()))
        lines.append(f"model file: {mf.get('path')} ({mf.get('arch')}, {mf.get('tensors')} tensors: {types}; "
                     f"{mf.get('bytes', 0):,} bytes of weights, memory-mapped; --wtype does not apply)")
    lines += llama_lines(header)
    lines += trace_lines(header)
    items = []
    for name, value in header.settings.items():
        src = header.sources.get(name, "default")
        items.append(f"{name}={_setting(value)}" + ("" if src == "default" else f" [{src}]"))
    return lines + _wrap_items("settings:", items)


def llama_lines(header: RunHeader) -> list[str]:
    """A record converted from real llama.cpp: its own counters, and what it cannot show."""
    lm = header.llama
    if not lm:
        return []
    perf = lm.get("perf") or {}
    counts = ", ".join(f"{k} {v}" for k, v in perf.items())
    return ([f"llama.cpp {lm.get('llama_cpp', '')} (llama_perf_context: {counts or 'none recorded'}); "
             f"env: {' '.join(f'{k}={v}' for k, v in (lm.get('env') or {}).items()) or 'none set'}"]
            + _wrap_items("not observable in llama.cpp:", list(lm.get("not_observable") or [])))


def trace_lines(header: RunHeader) -> list[str]:
    """A record converted from `graphdiag trace -- CMD`: the command, what a step is, what it cannot show."""
    tr = header.trace
    if not tr:
        return []
    return ([f"traced: {' '.join(tr.get('cmd') or [])} (pids {', '.join(map(str, tr.get('pids') or [])) or 'none'}; "
             f"exit {tr.get('exit')}; raw {tr.get('raw')})", f"a step is {tr.get('step')}"]
            + ([f"no CUDA: {(tr.get('cmd') or ['CMD'])[0]} never initialised CUDA (a CPU build?); its "
                f"{tr['decode_batches']} llama_decode batches were recorded: `graphdiag replay` and `whatif "
                f"--pad-batches / --slots / --model-draft` run graphdiag's runtime on them"]
               if header.traced_without_cuda else [])
            + ([f"calls read through: {', '.join(tr['reads'])}"] if tr.get("reads") else [])
            + ([f"an excerpt: {tr['excerpt']}"] if tr.get("excerpt") else [])
            + [f"trace error: {e}" for e in tr.get("errors") or []]
            + _wrap_items("not observable in a trace:", list(tr.get("not_observable") or [])))


def run_mode_lines(header: RunHeader) -> list[str]:
    """Which mode the simulated driver ran in (and why), and numpy's BLAS threads; none for an older record."""
    from ...config import UPSTREAM_DATES
    lines = []
    if header.upstream:
        lines.append(f"rules: {header.rules or 'upstream ' + header.upstream} · "
                     f"{UPSTREAM_DATES.get(header.upstream, header.upstream)}"
                     + ("" if header.upstream == "0c1e57098" else " (--upstream: older rules)"))
    lines += header.article
    if header.sim_mode == "decisions":
        lines += [f"simulator: DECISIONS ONLY ({header.sim_mode_reason}) · no logits, no tokens "
                  f"(--sim-mode compute computes them)",
                  "  kernels modelled, not computed · device memory reserved, not materialised · the same decisions"]
    elif header.sim_mode == "compute":
        lines.append(f"simulator: computing ({header.sim_mode_reason}) · every kernel in numpy, every device "
                     f"byte in host memory")
    if header.blas:
        from ...config import BlasThreads
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


class RunLog:
    """Draws a run's header and its event log up to `verbosity` on `console`: what the live terminal report
    (sinks/console.py) and `graphdiag report` print, one line per decision the log shows."""

    def __init__(self, console: Console, verbosity: int = 0):
        self.console = console
        self.verbosity = verbosity
        self.log = EventLog()
        self.header: RunHeader | None = None

    def start(self, header: RunHeader) -> None:
        """Print the run header."""
        self.header = header
        self.log.gpu_label = gpu_phrase(simulated_timings(header))
        for line in header_lines(header):
            self.console.print(line, markup=False)

    def draw(self, ev: E.Event) -> None:
        """Print the lines `ev` gives at this verbosity (a GraphsDisabled says its cause in full)."""
        if isinstance(ev, E.GraphsDisabled) and self.header is not None:
            ev = dataclasses.replace(ev, reason=disabled_cause(self.header, ev.reason))
        for level, line in self.log.feed(ev):
            if level <= self.verbosity:
                self.console.print(line, markup=False)


def render_summary(summary: Summary, file: TextIO | None = None, console: Console | None = None) -> None:
    """Summary tables: overview, per key, timings, llama.cpp counters, graphdiag counters, notes."""
    con = console or make_console(file)
    con.print(_overview(summary), markup=False)
    tables = [_key_table(summary)] if summary.keys else []
    if summary.devices is not None:
        tables.append(device_table(summary.devices))
    tables += [_timing_table(summary)] if summary.timings else []
    tables += accounting_tables(summary.accounting, simulated_timings(summary.header), bool(summary.header.trace))
    tables += [_llama_table(summary)] if summary.llama_counters else []
    for t in tables + [_counter_table(summary)]:
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
    log = RunLog(con, verbosity)
    log.start(as_header(header))
    for ev in events:
        log.draw(ev)
    con.print("")
    render_summary(summary, console=con)


def _overview(s: Summary) -> str:
    modes = ", ".join(f"{n} {m}" for m, n in s.step_modes.items())
    failed = len(s.faults.failures)
    modes += f"{', ' if modes else ''}{failed} failed" if failed else ""
    mode = {"decisions": " · simulator decisions-only (tokens not computed)",
            "compute": " · simulator computing"}.get(s.header.sim_mode, "")
    article = "".join(f"\n{rule}" for rule in s.header.article)     # the article's rules, said again
    return (f"{s.steps} steps ({modes or 'none'}) · {s.distinct_keys} graph key"
            f"{'s' if s.distinct_keys != 1 else ''} · max {s.max_chunks} chunks per graph{mode}{article}")


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


def _oracle_note(s: Summary) -> str:
    """--oracle's line: the checks, the largest error, the bound (and the noise it follows), the failures."""
    if s.oracle_max_noise is not None:
        bound = (f"bound per step: {ORACLE_NOISE_FACTOR:g}× the model's own rounding noise (its oracle twins'), "
                 f"at least {ORACLE_FLOOR:g}; the noise reached {s.oracle_max_noise:.3g}, the closest step used "
                 f"{s.oracle_worst_share:.0%} of its bound")
    else:
        bound = f"bound {s.oracle_bound:g}"
    nonfinite = f" ({s.oracle_nonfinite} on NaN or inf logits)" if s.oracle_nonfinite else ""
    routed = [f"{n} {what}" for n, what in ((getattr(s, "oracle_followed", 0), "near-tie expert choice(s) followed"),
                                             (getattr(s, "oracle_refused", 0), "expert choice(s) beyond the noise"))
              if n]
    return (f"oracle: {s.oracle_checks} checks, max relative error {s.oracle_max_rel_err:.3g} ({bound}), "
            f"{s.oracle_failures} over the bound{nonfinite}" + "".join(f", {r}" for r in routed))


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
        notes += link_lines(s.devices)
    notes += diagnosis_lines(s)
    if s.verify_checks:
        notes.append(f"verify: {s.verify_checks} checks, {s.verify_mismatches} mismatches")
    if s.oracle_checks:
        notes.append(_oracle_note(s))
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

"""`graphdiag llama`'s body: settings resolved and checked, the watched run, its record, timeline, plot and
report — the same outputs `graphdiag run` gives, over what llama.cpp shows."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from .. import events as E
from ..errors import UsageError

# scenario expectations a converted record can answer (the rest need the key, the ledger, graphdiag's counters)
OBSERVABLE_EXPECT = ("captures", "replays", "eager_runs", "updates", "update_refusals", "instantiates",
                     "warmup_resets", "warmup_completions", "evictions", "uid_hits", "strict_failures")


def resolve_llama(model: str, settings: dict, scenario: str | None):
    """(RunConfig, Scenario or None): CLI > scenario > environment, as `graphdiag run`; the file is the model."""
    from ..config import resolve
    from ..scenario import load_scenario
    sc = load_scenario(scenario) if scenario else None
    environ = sc.environ(os.environ) if sc else os.environ
    cfg = resolve({**settings, "model": model}, sc.run if sc else None, environ=environ,
                  env_origins=sc.env_origins() if sc else None)
    return cfg, sc


def llama_cli(model: str, settings: dict, scenario: str | None = None, events_path: str | None = None,
              raw_path: str | None = None, timeline_path: str | None = None, plot_path: str | None = None,
              strict: bool = False, as_json: bool = False, verbosity: int = 0, out=None, **inject) -> int:
    """Run, write the record (--events) and the timeline (--timeline), draw the plot (--plot), report.
    Exit 0, or 1 when --strict or an observable scenario expectation fails. Output files are shown
    writable before llama.cpp loads (an unwritable path fails first) and left as they were until written."""
    from ..report.record.write import probe_output
    from .run import run_llama

    out = out or sys.stdout
    cfg, sc = resolve_llama(model, settings, scenario)
    if timeline_path and events_path and Path(timeline_path).resolve() == Path(events_path).resolve():
        raise UsageError(f"--events and --timeline name the same file ({events_path}): give each its own")
    for p, what in ((events_path, "the event record"), (timeline_path, "the timeline"),
                    (raw_path, "the raw llama-watch stream")):
        if p:
            probe_output(Path(p), what)
    res = run_llama(model, cfg, sc, raw_path=raw_path, **inject)
    return _outputs(res, sc, events_path, timeline_path, plot_path, strict, as_json, verbosity, out)


def raw_cli(raw_path: str, events_path: str | None = None, timeline_path: str | None = None,
            plot_path: str | None = None, strict: bool = False, as_json: bool = False, verbosity: int = 0,
            out=None) -> int:
    """`graphdiag llama --from-raw RAW`: a recorded stream converted, written and reported as a run's."""
    from .convert import convert_raw
    from .run import LlamaResult
    header, events = convert_raw(raw_path)
    return _outputs(LlamaResult(Path(raw_path), header, events), None, events_path, timeline_path, plot_path,
                    strict, as_json, verbosity, out or sys.stdout)


def _outputs(res, sc, events_path, timeline_path, plot_path, strict, as_json, verbosity, out) -> int:
    from ..report.record.write import JsonlWriter
    if events_path:
        with JsonlWriter(events_path, res.header) as w:
            for ev in res.events:
                w(ev)
    if timeline_path:
        write_timeline(timeline_path, res.header, res.events)
    if plot_path:
        _plot(plot_path, res)
    return _render(res, sc, strict, as_json, verbosity, out)


def write_timeline(path: str, header, events: list[E.Event]) -> None:
    """The trace-event timeline of a converted record: each decode a slice, the decisions as marks."""
    from ..report.sinks.timeline import TimelineWriter
    tw = TimelineWriter(path, simulated=False)
    tw.start(header.to_dict())
    started = {}
    for ev in events:
        if isinstance(ev, E.StepStarted):
            started[ev.step] = ev
            tw(E.SpanBegin(step=ev.step, t_ns=ev.t_ns, name="llama_decode", category="llama/decode",
                           payload=ev.step))
        tw(ev)
        if isinstance(ev, (E.StepFinished, E.StepFailed)) and ev.step in started:
            tw(E.SpanEnd(step=ev.step, t_ns=max(ev.t_ns, started.pop(ev.step).t_ns), name="llama_decode",
                         category="llama/decode"))
    tw.close()


def _plot(path: str, res) -> None:
    from ..report.analysis.summary import summarize
    from ..report.views.plot import plot
    s = summarize(res.header, res.events)
    plot(s.accounting, res.events, Path(path), title=f"llama.cpp: {Path(res.header.model).name} on "
         f"{res.header.device}", simulated=False, source=str(res.raw_path))


def _render(res, sc, strict: bool, as_json: bool, verbosity: int, out) -> int:
    import json

    from ..report.analysis.summary import summarize
    from ..report.views.console import render_report
    from ..scenario import check_expectations

    s = summarize(res.header, res.events)
    failures, skipped = [], []
    complete = s.ended is not None and s.ended.status == "complete"
    if sc is not None and complete:
        keep = {k: v for k, v in sc.expect.items() if _observable(k)}
        skipped = sorted(set(sc.expect) - set(keep))
        failures += [f"scenario {sc.name}: {f}" for f in check_expectations(dataclasses.replace(sc, expect=keep), s)]
    if strict and complete:
        failures += [f"strict: {f}" for f in s.strict]
    if as_json:
        d = json.loads(s.to_json()) | {"failures": failures, "expect_not_observable": skipped,
                                       "raw": str(res.raw_path)}
        out.write(json.dumps(d, indent=2) + "\n")
    else:
        render_report(res.header, res.events, s, out, verbosity=verbosity)
        out.write(f"raw stream: {res.raw_path}\n")
        if skipped:
            out.write(f"scenario {sc.name}: not checked (not observable in llama.cpp): {', '.join(skipped)}\n")
        for f in failures:
            out.write(f"FAILED: {f}\n")
    return 1 if failures else 0


def _observable(k: str) -> bool:
    if k in ("refusal_reasons", "no_replay", "graphs_disabled"):
        return True
    base = k.removesuffix("_min").removesuffix("_max")
    return base in OBSERVABLE_EXPECT

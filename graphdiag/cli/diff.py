"""`graphdiag diff`: compare two recorded runs, or two steps of one. Exit status like diff(1):
0 equal, 1 different, 2 trouble (so this command maps its own errors to 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import GraphdiagError, UsageError

_KNOWN_ONLY = "--no-known and --model apply to a comparison with a `graphdiag llama` record"


@click.command()
@click.argument("control", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("test", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--step", "steps", type=int, multiple=True, metavar="I",
              help="Give twice (--step I --step J) with one record to compare two of its steps.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--no-known", "no_known", is_flag=True,
              help="Against a `graphdiag llama` record: show the known differences as differences.")
@click.option("--model", "model", default=None, metavar="FILE.gguf",
              help="The GGUF both runs read, for the known differences that depend on it (default: the file a "
                   "record names, where it is here).")
@click.pass_context
def diff(ctx: click.Context, control: Path, test: Path | None, steps: tuple[int, ...], as_json: bool,
         no_known: bool, model: str | None) -> None:
    """Compare CONTROL and TEST records: settings, counters, timings, the first step where decisions
    diverge, capture facts, and node by node the ledger rows of each captured graph (per key and capture;
    with --step I --step J, the captures in force at the two steps). --json keeps every differing field.
    A record converted from real llama.cpp (`graphdiag llama`) is compared on what llama.cpp shows: per step,
    evictions, warmup, eager/capture/replay, graph nodes per capture, updated or refused executables;
    graphdiag's known differences from llama.cpp (report/analysis/known.py) are excused pair by pair, each
    shown with its evidence, every decision after it still compared (--no-known: shown as differences).
    Exit 0 when equal, 1 when different, 2 on error."""
    try:
        equal = _compare(control, test, steps, as_json, not no_known, model)
    except GraphdiagError as e:
        click.echo(f"graphdiag diff: error: {e}", err=True)
        ctx.exit(2)
    ctx.exit(0 if equal else 1)


def _compare(control: Path, test: Path | None, steps: tuple[int, ...], as_json: bool, known: bool = True,
             model: str | None = None) -> bool:
    from ..report.analysis.diff import diff_runs, diff_steps
    from ..report.views.diff import render_run_diff, render_step_diff
    from ..report.record.read import read_record

    out = sys.stdout
    if test is None and (model or not known):
        raise UsageError(_KNOWN_ONLY)
    if test is None:
        if len(steps) != 2:
            raise UsageError("give a second record, or two steps of one record: --step I --step J")
        d = diff_steps(read_record(control)[1], steps[0], steps[1])
        click.echo(d.to_json()) if as_json else render_step_diff(d, str(control), out)
        return d.equal
    if steps:
        raise UsageError("--step compares two steps of ONE record; give a single file with it")
    from ..trace.convert import read_record_or_raw
    a, b = read_record_or_raw(control), read_record_or_raw(test)
    if a[0].llama or b[0].llama or a[0].trace or b[0].trace:   # watched / traced: only what it shows is compared
        from ..report.analysis.known import diff_records
        from ..report.views.observed_diff import render_observed_diff
        od = diff_records(a, b, (str(control), str(test)), known, model)
        click.echo(od.to_json()) if as_json else render_observed_diff(od, out)
        return od.equal
    if model or not known:
        raise UsageError(_KNOWN_ONLY)
    d = diff_runs(a, b, (str(control), str(test)))
    click.echo(d.to_json()) if as_json else render_run_diff(d, out)
    return d.equal

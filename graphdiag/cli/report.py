"""`graphdiag report`: the report of a recorded run, rendered offline from its JSON-lines file."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.argument("record", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of tables.")
@click.option("-v", "--verbose", count=True,
              help="-v: chunk boundaries, updates, instantiates, refusals; -vv: every uid hit and launch.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw per-step time by phase, recaptures and chunk costs to FILE.png or FILE.svg "
                   "(needs graphdiag[plot]).")
def report(record: Path, as_json: bool, verbose: int, plot_path: Path | None = None) -> None:
    """Render the report of RECORD, a JSON-lines event file written by `graphdiag run --events`."""
    from ..report.views.console import render_report
    from ..report.analysis.summary import summarize
    from ..trace.convert import read_record_or_raw

    header, events = read_record_or_raw(record)
    summary = summarize(header, events)
    if plot_path is not None:
        from ..report.analysis.measured import simulated_timings
        from ..report.views.plot import plot, recaptures
        plot(summary.accounting, events, plot_path, title=f"{record.name}: {summary.header.model} on "
             f"{summary.header.device}" + (" (SIMULATED)" if summary.header.simulated else ""),
             simulated=simulated_timings(summary.header), source=str(record))
        # on stderr: --json keeps stdout JSON
        click.echo(f"graphdiag: plot of {record} ({len(summary.accounting.steps)} steps, "
                   f"{len(recaptures(events))} recaptures marked) written to {plot_path}", err=True)
    if as_json:
        click.echo(summary.to_json())
    else:
        render_report(header, events, summary, sys.stdout, verbosity=verbose)

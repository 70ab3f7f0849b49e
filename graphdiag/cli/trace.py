"""`graphdiag trace -- CMD`: the CUDA graphs of any process, unmodified, out of process."""

from __future__ import annotations

import click


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--events", "events_path", type=click.Path(dir_okay=False), default=None,
              help="Write the converted record (graphdiag's JSON lines) to this file.")
@click.option("--raw", "raw_path", type=click.Path(dir_okay=False), default=None,
              help="Keep the raw trace stream here (default: a temporary file, named in the report).")
@click.option("--timeline", "timeline_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome trace-event timeline: each step a slice, the decisions marked.")
@click.option("--strict", is_flag=True, help="Exit 1 (when CMD succeeded) on any trace diagnosis.")
@click.option("-v", "--verbose", count=True, help="-v: updates, instantiates, refusals; -vv: every launch.")
@click.option("--api", type=click.Choice(["auto", "cupti", "interpose"]), default=None,
              help="How CUDA's graph calls are read: interpose (libcudart's symbols, no CUPTI: the cheapest; "
                   "runtime calls of a shared libcudart only), cupti (CUPTI callbacks on the runtime and driver "
                   "API: any program), auto (interpose where CMD links a shared libcudart of CUDA 12 or later, "
                   "else cupti; the default, unless GRAPHDIAG_TRACE_API says otherwise).")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def trace(events_path, raw_path, timeline_path, strict, verbose, api, cmd):
    """Run CMD with graphdiag's CUDA injection library (CUPTI callbacks, or libcudart's calls interposed) and
    report its CUDA graphs: captures with their kernels, instantiates, updates (a refusal with the node),
    launches, destroys, synchronisations, and llama.cpp's graph log lines from its stderr. Exits with CMD's
    code."""
    from ..trace.command import trace_cli
    return trace_cli(list(cmd), events_path=events_path, raw_path=raw_path, timeline_path=timeline_path,
                     strict=strict, verbosity=verbose, api=api)

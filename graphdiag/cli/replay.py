"""`graphdiag replay`: a trace's llama_decode batches run through graphdiag's runtime, compared with the trace.
Exit status like diff(1): 0 the same decisions, 1 different, 2 trouble."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import GraphdiagError


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", "model", required=True, metavar="FILE.gguf", help="The GGUF file the traced program ran.")
@click.option("--backend", type=click.Choice(["auto", "sim", "cuda"]), default="auto", show_default=True,
              help="graphdiag's runtime on the simulated driver or the GPU (auto: the GPU where there is one).")
@click.option("--events", "events_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the replay's record (graphdiag's events, each batch's DecodeBatch before its steps).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--no-known", "no_known", is_flag=True, help="Show graphdiag's known differences from llama.cpp "
              "as differences.")
@click.pass_context
def replay(ctx: click.Context, trace: Path, model: str, backend: str, events_path: Path | None, as_json: bool,
           no_known: bool) -> None:
    """Feed TRACE's recorded llama_decode batches (tokens, positions, sequences, outputs, the idle time
    between them; a raw stream from `graphdiag trace --raw` or its record) to graphdiag's runtime on
    --model, then compare graphdiag's decisions with the trace's batch by batch, as `graphdiag diff` does
    for `graphdiag llama` records: what a trace shows (graph captures, updates, refusals, launches,
    evictions; uid hits and warmup where ggml logged them), graphdiag's known differences excused. For each
    recapture and refused update of the trace, the node and field graphdiag's ledger says changed.
    Exit 0 when the decisions are the same, 1 when not, 2 on error."""
    try:
        equal = _replay(trace, model, backend, events_path, as_json, not no_known)
    except GraphdiagError as e:
        click.echo(f"graphdiag replay: error: {e}", err=True)
        ctx.exit(2)
    ctx.exit(0 if equal else 1)


def _replay(trace: Path, model: str, backend: str, events_path: Path | None, as_json: bool, known: bool) -> bool:
    from ..report.analysis.known import model_facts
    from ..report.analysis.replay_diff import diff_replay
    from ..report.views.replay_diff import render_replay_diff
    from ..trace.replay import run_replay, write_record

    warn = lambda line: click.echo(f"graphdiag: warning: {line}", err=True)   # noqa: E731
    r = run_replay(trace, model, backend, warn=warn)
    if events_path is not None:
        write_record(r, events_path)
    d = diff_replay(r.trace, r.ours, model_facts(model), (str(trace), f"graphdiag on {model}"), known)
    d.notes += r.notes()
    if as_json:
        click.echo(d.to_json())
    else:
        render_replay_diff(d, sys.stdout, r.header_lines())
    return d.equal

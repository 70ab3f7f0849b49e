"""`graphdiag replay`: a trace's llama_decode batches run through graphdiag's runtime, compared with the trace.
Exit status like diff(1): 0 the same decisions, 1 different, 2 trouble."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..errors import GraphdiagError, UsageError


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", "model", required=True, metavar="FILE.gguf", help="The GGUF file the traced program ran.")
@click.option("--model-draft", "draft", default=None, metavar="DRAFT.gguf",
              help="llama-server's speculative decoding: replay its draft context's batches on this file too, "
                   "compared as the target's.")
@click.option("--backend", type=click.Choice(["auto", "sim", "cuda"]), default="auto", show_default=True,
              help="graphdiag's runtime on the simulated driver or the GPU (auto: the GPU where there is one).")
@click.option("--events", "events_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the replay's record (graphdiag's events, each batch's DecodeBatch before its steps; "
                   "the target context's).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--no-known", "no_known", is_flag=True, help="Show graphdiag's known differences from llama.cpp "
              "as differences.")
@click.option("--ignore-log", "ignore_log", is_flag=True, help="Leave out what the trace knows from ggml's log "
              "lines (uid hits, warmup, logged eager computes): for a program whose stderr came late.")
@click.pass_context
def replay(ctx: click.Context, trace: Path, model: str, draft: str | None, backend: str, events_path: Path | None,
           as_json: bool, no_known: bool, ignore_log: bool) -> None:
    """Feed TRACE's recorded llama_decode batches (tokens, positions, sequences, outputs, the idle time
    between them; a raw stream from `graphdiag trace --raw` or its record) to graphdiag's runtime on
    --model, then compare graphdiag's decisions with the trace's batch by batch, as `graphdiag diff` does
    for `graphdiag llama` records: what a trace shows (graph captures, updates, refusals, launches,
    evictions; uid hits and warmup where ggml logged them), graphdiag's known differences excused. For each
    recapture and refused update of the trace, the node and field graphdiag's ledger says changed.
    Exit 0 when the decisions are the same, 1 when not, 2 on error."""
    try:
        equal = _replay(trace, model, backend, events_path, as_json, not no_known, draft, not ignore_log)
    except GraphdiagError as e:
        click.echo(f"graphdiag replay: error: {e}", err=True)
        ctx.exit(2)
    ctx.exit(0 if equal else 1)


def _replay(trace: Path, model: str, backend: str, events_path: Path | None, as_json: bool, known: bool,
            draft: str | None = None, use_log: bool = True) -> bool:
    from ..report.views.replay_diff import render_replay_diff
    from ..trace.replay import load_trace

    loaded = load_trace(trace)
    tr = loaded[0].trace
    if loaded[0].traced_without_cuda:
        raise UsageError(f"{trace}: {(tr.get('cmd') or ['its program'])[0]} never initialised CUDA (a CPU build?): "
                         f"no graph decisions to compare its {tr['decode_batches']} batches with (whatif "
                         f"--pad-batches / --slots / --model-draft replay them)")
    runs = [("", model, False)] + ([("draft context", draft, True)] if draft else [])
    done = [(title, *_one(trace, m, backend, known, d, loaded, None if d else events_path, use_log))
            for title, m, d in runs]
    if as_json:
        both = {"target": done[0][1].to_dict(), "draft": done[1][1].to_dict()} if draft else done[0][1].to_dict()
        click.echo(json.dumps(both, indent=2))
    else:
        for title, d, lines in done:
            if title:
                sys.stdout.write(f"\n{title}:\n")
            render_replay_diff(d, sys.stdout, lines)
    return all(d.equal for _, d, _ in done)


def _one(trace: Path, model: str, backend: str, known: bool, draft: bool, loaded, events_path, use_log: bool):
    """(ReplayDiff, header lines) of one context's replay against the trace."""
    from ..report.analysis.known import model_facts
    from ..report.analysis.replay_diff import diff_replay
    from ..trace.replay import run_replay, write_record

    warn = lambda line: click.echo(f"graphdiag: warning: {line}", err=True)   # noqa: E731
    r = run_replay(trace, model, backend, warn=warn, draft=draft, loaded=loaded)
    if events_path is not None:
        write_record(r, events_path)
    d = diff_replay(r.trace, r.ours, model_facts(model), (str(trace), f"graphdiag on {model}"), known, use_log)
    d.notes += r.notes()
    return d, r.header_lines()

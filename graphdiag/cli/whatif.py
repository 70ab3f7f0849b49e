"""`graphdiag whatif`: a recorded run's graph sequence replayed offline under another graph-key policy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

ROWS = ("captures", "instantiates", "updates", "update_refusals", "replays", "eager_runs", "warmup_resets",
        "evictions", "distinct_keys", "graphs_held_peak", "graphs_held_end")


def _sizes(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"a comma-separated list of integers, not {value!r}") from None


@click.command()
@click.argument("record", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--key", "policy", default=None, metavar="POLICY",
              help="first-node (llama.cpp's), first-node+shape or content-hash.")
@click.option("--max-graphs", type=int, default=0, help="Cap the cache at N entries, least recently used "
              "evicted first (0: no cap, as llama.cpp).")
@click.option("--pad-batches", "pad", callback=_sizes, default=None, metavar="1,2,4,8",
              help="A trace or replay record: its decode batches padded up to the next of these sizes, run "
                   "again: captures saved against padded tokens computed.")
@click.option("--slots", callback=_sizes, default=None, metavar="1,2,4,8",
              help="A trace or replay record: its requests served again by each number of slots (-np N): "
                   "captures, refusals and graph memory per 1000 tokens.")
@click.option("--model", default=None, metavar="FILE.gguf", help="With --pad-batches / --slots / --model-draft: "
              "the GGUF the trace ran (default: the one a replay record names).")
@click.option("--model-draft", "draft", default=None, metavar="DRAFT.gguf",
              help="A trace of llama-server's speculative decoding: its draft context's batches replayed on "
                   "this file, its target's on --model: the warmup cycle per draft step.")
@click.option("--backend", type=click.Choice(["auto", "sim", "cuda"]), default="auto", show_default=True,
              help="With --pad-batches / --slots: graphdiag's runtime on the simulated driver or the GPU.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def whatif(record: Path, policy: str | None, max_graphs: int, pad: list[int] | None, slots: list[int] | None,
           model: str | None, draft: str | None, backend: str, as_json: bool) -> None:
    """Replay RECORD's graph_compute calls under another key POLICY, with the same warmup, ledger and
    eviction rules, and compare captures, instantiates, updates, replays, eager runs and graphs held with
    the recorded run (first-node is replayed too: it should reproduce the record). On a trace (or its
    `graphdiag replay --events` record): --pad-batches runs its batches again with each decode batch padded
    to a bucket, --slots its requests again under each number of server slots, through graphdiag's runtime
    on --model."""
    from ..errors import UsageError
    if sum(x is not None for x in (policy, pad, slots, draft)) != 1:
        raise UsageError("give one of --key POLICY, --pad-batches SIZES, --slots COUNTS or --model-draft FILE")
    if draft is not None:
        return _draft(record, model, draft, backend, as_json)
    if pad is not None or slots is not None:
        return _operator(record, pad, slots, model, backend, as_json)
    if model is not None or backend != "auto":
        raise UsageError("--model and --backend go with --pad-batches or --slots (--key replays the record offline)")
    _key_policy(record, policy, max_graphs, as_json)


def _operator(record: Path, pad, slots, model, backend: str, as_json: bool) -> None:
    from ..report.views.server_whatif import render_server_whatif
    from ..trace.operator import pad_whatif, slots_whatif
    w = pad_whatif(record, pad, model, backend) if pad is not None else slots_whatif(record, slots, model, backend)
    if as_json:
        click.echo(json.dumps(w.to_dict(), indent=2))
    else:
        render_server_whatif(w, sys.stdout)


VERIFY_SIZES_SHOWN = 6      # the commonest verify widths named; the rest counted together


def _draft(record: Path, model: str | None, draft: str, backend: str, as_json: bool) -> None:
    from ..trace.operator import draft_whatif
    c, device = draft_whatif(record, model, draft, backend)
    if as_json:
        click.echo(json.dumps(c.to_dict() | {"device": device}, indent=2))
        return
    out = sys.stdout
    out.write(f"whatif {record}: speculative decoding's warmup cycle, per draft step (graphdiag's runtime, "
              f"{device})\n")
    out.write(f"draft steps: {c.steps} (the draft's batches, the target's verify batch, the draft's "
              f"re-evaluation of it)\n")
    sizes = c.verify_sizes.most_common()
    rest = sizes[VERIFY_SIZES_SHOWN:]
    out.write("verify batch sizes: " + ", ".join(f"{n} ×{k}" for n, k in sizes[:VERIFY_SIZES_SHOWN])
              + (f", {sum(k for _, k in rest)} batches of {len(rest)} other sizes"
                 if rest else "") + "\n")
    for side, name in c.SIDES:
        counts = getattr(c, side)
        out.write(f"{name}, computes per draft step: " + (", ".join(
            f"{p} {c.per_step(side, p):.2f}" for p, _ in counts.most_common()) or "none") + "\n")
    for line in c.first:
        out.write(f"  {line}\n")
    for line in c.findings():
        out.write(f"finding: {line}\n")


def _key_policy(record: Path, policy: str, max_graphs: int, as_json: bool) -> None:
    from .. import events as E
    from ..config import DEFAULT_CHUNK_SIZE
    from ..errors import EventFileError, UsageError
    from ..report.record.read import read_record
    from ..report.analysis.whatif import POLICIES, what_if

    if policy not in POLICIES:
        raise UsageError(f"unknown key policy {policy!r} (known: {', '.join(POLICIES)})")
    header, events = read_record(record)
    if header.llama:
        raise UsageError(f"{record} comes from real llama.cpp: whatif replays each graph's key and node "
                         f"properties, which are not observable in llama.cpp (whatif the graphdiag run of the "
                         f"same plan instead)")
    chunk = header.settings.get("chunk_size", DEFAULT_CHUNK_SIZE)
    pols = ("first-node",) if policy == "first-node" else ("first-node", policy)
    try:
        w = what_if(events, pols, max_graphs, chunk if isinstance(chunk, int) else DEFAULT_CHUNK_SIZE)
    except EventFileError as e:
        raise EventFileError(f"{record}: {e}") from None
    if not any(isinstance(e, E.RunEnded) for e in events):
        last = max((e.step for e in events), default=0)
        click.echo(f"graphdiag: warning: {record} has no run end (the run was cut short?): the comparison "
                   f"covers its calls up to step {last}", err=True)
    if as_json:
        click.echo(json.dumps(w.to_dict(policy), indent=2))
        return
    out = sys.stdout
    names = ["recorded"] + [o.policy + (f" (max {max_graphs})" if max_graphs else "") for o in w.outcomes]
    width = max(len(n) for n in names) + 2
    out.write(f"whatif {record}: key policy {policy}" + (f", at most {max_graphs} graphs" if max_graphs else "")
              + "\n")
    out.write(f"{'':18}" + "".join(f"{n:>{width}}" for n in names) + "\n")
    for r in ROWS:
        vals = [w.baseline[r]] + [getattr(o, r) for o in w.outcomes]
        out.write(f"{r:18}" + "".join(f"{v:>{width}}" for v in vals) + "\n")
    for o in w.outcomes:
        if len(o.devices) > 1:               # a layer split: each device's cache apart
            out.write(f"{o.policy} per device: " + "; ".join(
                f"dev{d} {v['distinct_keys']} keys, {v['captures']} captures, {v['replays']} replays, "
                f"{v['eager_runs']} eager" for d, v in sorted(o.devices.items())) + "\n")
        if o.modelled_updates or o.estimated_chunks:
            out.write(f"{o.policy}: {o.modelled_updates} update outcomes modelled (not in the record), "
                      f"{o.estimated_chunks} chunk counts estimated\n")

"""`graphdiag whatif`: a recorded run's graph sequence replayed offline under another graph-key policy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

ROWS = ("captures", "instantiates", "updates", "update_refusals", "replays", "eager_runs", "warmup_resets",
        "evictions", "distinct_keys", "graphs_held_peak", "graphs_held_end")


@click.command()
@click.argument("record", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--key", "policy", required=True, metavar="POLICY",
              help="first-node (llama.cpp's), first-node+shape or content-hash.")
@click.option("--max-graphs", type=int, default=0, help="Cap the cache at N entries, least recently used "
              "evicted first (0: no cap, as llama.cpp).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def whatif(record: Path, policy: str, max_graphs: int, as_json: bool) -> None:
    """Replay RECORD's graph_compute calls under another key POLICY, with the same warmup, ledger and
    eviction rules, and compare captures, instantiates, updates, replays, eager runs and graphs held with
    the recorded run (first-node is replayed too: it should reproduce the record)."""
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

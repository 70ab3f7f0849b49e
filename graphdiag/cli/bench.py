"""`graphdiag bench`: measurements (the ledger check; step times by phase on the chosen backend)."""

from __future__ import annotations

import json

import click


@click.group()
def bench() -> None:
    """Benchmarks: measured here, never asserted by tests."""


@bench.command("ledger")
@click.option("--model", default="7b", help="Preset whose decode graph is checked (built without data).")
@click.option("--batch", type=int, default=1)
@click.option("--reps", type=int, default=50)
def ledger(model, batch, reps):
    """Time the full node-property ledger comparison (a uid miss) for a decode graph."""
    from ..bench import ledger_bench
    r = ledger_bench(model, batch, reps=reps)
    click.echo(f"{r['model']} decode graph: {r['n_nodes']} nodes, snapshot {r['snapshot_bytes'] / 1e6:.2f} MB")
    click.echo(f"  snapshot gather  {r['gather_us']:9.1f} us (median of {reps})")
    click.echo(f"  compare          {r['compare_us']:9.1f} us")
    click.echo(f"  gather + compare {r['check_us']:9.1f} us")


@bench.command("steps")
@click.option("--backend", type=click.Choice(["auto", "cuda", "sim", "cpu"]), default=None)
@click.option("--model", default=None)
@click.option("--wtype", type=click.Choice(["f16", "q8_0"]), default=None)
@click.option("--steps", type=int, default=64)
@click.option("--batch", type=int, default=None)
@click.option("--chunk-size", type=int, default=None)
@click.option("--prompt-tokens", type=int, default=None)
@click.option("--json", "as_json", is_flag=True)
def steps(as_json, **settings):
    """Median eager / capture / replay step times (graphs on) and eager steps with graphs off."""
    from ..bench import step_times
    from ..config import resolve
    from ..runner import run
    out = {}
    for label, extra in (("graphs", {}), ("no-graphs", {"graphs_disabled": True})):
        cfg = resolve({**settings, **extra, "nvtx": False})
        r = run(cfg)
        out[label] = {"device": r.header["device"], **step_times(r.events)}
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    for label, res in out.items():
        click.echo(f"[{label}] {res.pop('device')}")
        for k, v in res.items():
            click.echo(f"  {k:22s} {v}")

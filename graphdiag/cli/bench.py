"""`graphdiag bench`: measurements (the ledger check; decode and prefill step times against the HBM roofline
and, where it can run, PyTorch)."""

from __future__ import annotations

import json

import click

POSITIVE = click.IntRange(min=1)
MAX_LEDGER_REPS = 10_000     # ~20 s on 7b at ~2 ms a repetition; the medians settle long before
MAX_ROUNDS = 20              # each round of a 7b row with its llama.cpp peer takes about half a minute on the H200


@click.group()
def bench() -> None:
    """Benchmarks: measured here, never asserted by tests."""


@bench.command("ledger")
@click.option("--model", default="7b", help="Preset (or GGUF file, PATH.gguf) whose decode graph is checked "
                                             "(built without data).")
@click.option("--batch", type=POSITIVE, default=1, help="Sequences in the decode graph (>= 1).")
@click.option("--reps", type=click.IntRange(1, MAX_LEDGER_REPS), default=50,
              help=f"Timed repetitions (1 to {MAX_LEDGER_REPS}).")
def ledger(model, batch, reps):
    """Time the full node-property ledger comparison (a uid miss) for a decode graph."""
    from ..bench import ledger_bench
    from ..errors import UsageError
    from ..model.source import model_config
    n_ctx = model_config(model).n_ctx  # an unknown preset or a bad file is a one-line error before anything is built
    if batch > n_ctx:                  # a decode step of N sequences puts N tokens in the KV cache
        raise UsageError(f"--batch {batch}: model {model} has n_ctx {n_ctx} KV cells, and a decode step of "
                         f"{batch} sequences needs one each (at most --batch {n_ctx})")
    r = ledger_bench(model, batch, reps=reps)
    click.echo(f"{r['model']} decode graph: {r['n_nodes']} nodes, snapshot {r['snapshot_bytes'] / 1e6:.2f} MB")
    click.echo(f"  snapshot gather  {r['gather_us']:9.1f} us (median of {reps})")
    click.echo(f"  compare          {r['compare_us']:9.1f} us")
    click.echo(f"  gather + compare {r['check_us']:9.1f} us")


def _names(value: str, known, what: str, files: bool = False) -> tuple[str, ...]:
    """Comma-separated names, each one of `known` (or, with `files`, a PATH.gguf)."""
    from ..model.source import is_file
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in known and not (files and is_file(n))]
    if not names or bad:
        from ..errors import UsageError
        raise UsageError(f"unknown {what} {', '.join(bad) or repr(value)} (known: {', '.join(known)})")
    return names


@bench.command("steps")
@click.option("--backend", type=click.Choice(["auto", "cuda", "sim", "cpu"]), default=None)
@click.option("--model", "models", default="tiny",
              help="Presets or GGUF files, comma-separated (tiny,1b,PATH.gguf); a file runs in its own types.")
@click.option("--wtype", "wtypes", default=None, help="Weight types of the presets, comma-separated "
                                                     "(f16,q8_0,q4_k,...: any --wtype of run; default f16).")
@click.option("--steps", type=click.IntRange(min=8), default=64, help="Decode steps per run (>= 8).")
@click.option("--prompt-tokens", type=POSITIVE, default=None)
@click.option("--chunk-size", type=click.IntRange(min=0), default=None,
              help="Capture in chunks of N nodes: the design article's rule, not in upstream llama.cpp (default 0: "
                   "one graph per split, as upstream).")
@click.option("--prefill", type=click.IntRange(min=0), default=0,
              help="Also time prefills of this many tokens (e.g. 512), against PyTorch's (0: none).")
@click.option("--no-torch", is_flag=True, help="Skip the PyTorch peer even where torch is importable.")
@click.option("--peer", "peers", default="torch", help="Peers, comma-separated: torch (plain unfused PyTorch "
              "ops, F16 rows only), llama (real llama.cpp on the same GGUF, graphs on and off: needs "
              "graphdiag[llama]).")
@click.option("--devices", type=int, default=None, help="Split the layers across N GPUs (as `run --devices`).")
@click.option("--tensor-split", default=None, help="Share of the layers per device, comma-separated (e.g. 3,1).")
@click.option("--rounds", type=click.IntRange(1, MAX_ROUNDS), default=1,
              help=f"Measure each decode row (and its llama.cpp peer) this many times in turn (1-{MAX_ROUNDS}): "
                   "times the median of the rounds', ratios the median of the rounds' ratios with their range "
                   "(a lent host's speed drifts over minutes).")
@click.option("--json", "as_json", is_flag=True, help="One JSON row per line instead of the table.")
def steps(backend, models, wtypes, steps, prompt_tokens, chunk_size, prefill, no_torch, peers, devices,
          tensor_split, rounds, as_json):
    """Decode step times per preset and weight type: replay and eager (median, p90), GPU time, kernels per
    step, host time of a replayed step, the HBM roofline and step ÷ roofline, and PyTorch eager / CUDA graph
    on the same shapes when torch is importable. Progress goes to stderr (plain lines when it is not a
    terminal)."""
    from ..bench import StepsOptions, bench_steps
    import sys

    from ..bench.display import progress_for, render
    from ..config import resolve
    from ..model.presets import PRESETS, WEIGHT_TYPES
    split = {k: v for k, v in (("devices", devices), ("tensor_split", tensor_split)) if v is not None}
    peer = _names(peers, ("torch", "llama"), "peer")
    from ..backends.device_set import check_devices
    # a bad --devices / --tensor-split, or a backend this machine lacks: one line, before any run
    check_devices(resolve({"backend": backend, **split}))
    names = _names(models, PRESETS, "preset", files=True)
    _no_wtype_for_files(names, wtypes)
    opts = StepsOptions(names, _names(wtypes or "f16", [w for w in WEIGHT_TYPES if w != "f32"], "weight type"),
                        backend, steps, prompt_tokens, chunk_size, prefill, not no_torch and "torch" in peer, settings=split,
                        llama="llama" in peer, rounds=rounds)
    with progress_for(sys.stderr) as progress:      # plain lines when stderr is not a terminal
        rows = bench_steps(opts, progress)
    if as_json:
        for r in rows:
            click.echo(json.dumps(r))
    else:
        render(rows)


def _no_wtype_for_files(names: tuple[str, ...], wtypes: str | None) -> None:
    """--wtype chooses the presets' weight types; with files only it would choose nothing (each file has its
    own types): refused, as `run --model FILE --wtype` is."""
    from ..errors import UsageError
    from ..model.source import is_file, model_config
    for n in names:
        if is_file(n):
            model_config(n)             # a missing or bad file: one line now, not after the other rows
    if wtypes is not None and all(is_file(n) for n in names):
        raise UsageError(f"--wtype {wtypes} chooses the presets' weight types, and {', '.join(names)} "
                         f"{'has its' if len(names) == 1 else 'have their'} own types (drop --wtype)")


@bench.command("trace", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--rounds", type=click.IntRange(1, MAX_ROUNDS), default=3,
              help=f"Rounds, each running CMD plain and traced in turn (1-{MAX_ROUNDS}).")
@click.option("--json", "as_json", is_flag=True, help="One JSON row per test instead of the table.")
@click.option("--api", type=click.Choice(["auto", "cupti", "interpose"]), default=None,
              help="The trace's reading of CUDA's calls, as graphdiag trace --api (default auto).")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def trace_overhead(rounds, as_json, api, cmd):
    """What `graphdiag trace` costs CMD: CMD run plain and traced in turn, --rounds times. For llama-bench the
    tokens per second of each of its tests (its -o jsonl output), for any other program its wall time."""
    import sys

    from ..config import kernel_cache_dir
    from ..trace import build
    from ..trace.command import check_device, resolve_cmd, trace_environ
    from ..trace.overhead import bench_trace, render
    from ..errors import UsageError
    if not cmd:
        raise UsageError("give the command to measure after --: graphdiag bench trace -- CMD [ARGS...]")
    resolve_cmd(list(cmd))
    environ = trace_environ(list(cmd), api)
    library, cupti = build.library(kernel_cache_dir(), environ), build.cupti_library(environ)
    check_device()
    rows = bench_trace(list(cmd), rounds, library, cupti,
                       progress=lambda line: print(line, file=sys.stderr, flush=True), environ=environ)
    if as_json:
        for r in rows:
            click.echo(json.dumps(r))
    else:
        render(rows, list(cmd), click.echo)

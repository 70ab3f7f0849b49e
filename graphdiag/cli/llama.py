"""`graphdiag llama`: real llama.cpp's CUDA graph decisions on a GGUF file, as a graphdiag record."""

from __future__ import annotations

import click

from .run import _one_scenario


@click.command()
@click.argument("model", type=str, required=False)
@click.option("--from-raw", "from_raw", type=click.Path(dir_okay=False), default=None,
              help="Convert and report a raw llama-watch stream already recorded (no llama.cpp is run).")
@click.option("--seed", type=int, default=None, help="Prompt seed (the same prompt tokens as graphdiag run).")
@click.option("--prompt-tokens", type=int, default=None, help="Prompt length prefilled per sequence.")
@click.option("--prompt-ids", default=None, help="The prompt as token ids, comma-separated (each sequence's).")
@click.option("--steps", type=int, default=None, help="Decode steps.")
@click.option("--batch", type=int, default=None, help="Sequences decoded together (tokens per decode step).")
@click.option("--no-fusion", "fusion", flag_value=False, default=None, help="Sets GGML_CUDA_DISABLE_FUSION=1.")
@click.option("--concurrent-streams", "concurrent_streams", flag_value=True, default=None,
              help="Sets GGML_CUDA_GRAPH_OPT=1.")
@click.option("--no-graphs", "graphs_disabled", flag_value=True, default=None,
              help="Sets GGML_CUDA_DISABLE_GRAPHS=1.")
@click.option("--no-reuse", "reuse_disabled", flag_value=True, default=None,
              help="Sets LLAMA_GRAPH_REUSE_DISABLE=1.")
@click.option("--swa-full", "swa_full", flag_value=True, default=None,
              help="A sliding-window model's SWA cache at full context size (llama.cpp's swa_full).")
@click.option("--scenario", multiple=True, callback=lambda ctx, param, v: _one_scenario(v),
              help="A scenario (name or .toml path) whose timeline llama.cpp can express; its observable "
                   "expectations are checked.")
@click.option("--events", "events_path", type=click.Path(dir_okay=False), default=None,
              help="Write the converted record (graphdiag's JSON lines) to this file.")
@click.option("--raw", "raw_path", type=click.Path(dir_okay=False), default=None,
              help="Keep the raw llama-watch stream here (default: a temporary file, named in the report).")
@click.option("--timeline", "timeline_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome trace-event timeline: each llama_decode a slice, the decisions marked.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw per-step time by phase to FILE.png or FILE.svg (needs graphdiag[plot]).")
@click.option("--strict", is_flag=True, help="Fail (exit 1) on thrash, captures never replayed, refusal floods.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("-v", "--verbose", count=True, help="-v: updates, instantiates, refusals; -vv: every launch.")
def llama(model, from_raw, scenario, events_path, raw_path, timeline_path, plot_path, strict, as_json, verbose,
          **settings):
    """Run MODEL.gguf on real llama.cpp (llama-cpp-python's CUDA build, in this process) through the same
    plan as `graphdiag run`, watch its CUDA graph calls (CUPTI callbacks) and log, and report the decisions
    it took. What llama.cpp does not expose (the graph key, the field that changed) is named, not guessed.
    Compare with a graphdiag run: graphdiag diff REPRO.jsonl LLAMA.jsonl."""
    from ..errors import UsageError
    from ..llama.command import llama_cli, raw_cli
    if from_raw:
        if model or scenario or raw_path or any(v is not None for v in settings.values()):
            raise UsageError("--from-raw converts a recorded stream: give no MODEL, plan options or --raw with it")
        return raw_cli(from_raw, events_path=events_path, timeline_path=timeline_path, plot_path=plot_path,
                       strict=strict, as_json=as_json, verbosity=verbose)
    if not model:
        raise UsageError("give MODEL.gguf (or --from-raw RAW.jsonl)")
    return llama_cli(model, settings, scenario=scenario, events_path=events_path, raw_path=raw_path,
                     timeline_path=timeline_path, plot_path=plot_path, strict=strict, as_json=as_json,
                     verbosity=verbose)

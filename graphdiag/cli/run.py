"""`graphdiag run`: one decode run through the graph runtime, reported as it goes."""

from __future__ import annotations

import click


def _one_scenario(given: tuple[str, ...]) -> str | None:
    """--scenario at most once: click would keep the last one and drop the others silently."""
    from ..errors import UsageError
    if len(given) > 1:
        raise UsageError(f"--scenario given {len(given)} times ({', '.join(given)}): a run runs one scenario")
    if given and not given[0].strip():
        raise UsageError(f"--scenario {given[0]!r}: give a scenario name or a .toml path (graphdiag scenarios "
                         f"lists them)")
    return given[0] if given else None


@click.command()
@click.option("--backend", type=click.Choice(["auto", "cuda", "sim", "cpu"]), default=None,
              help="cuda: the GPU; sim: the simulated driver; cpu: numpy only. Default: cuda when a GPU is "
                   "present, else sim (announced as simulated).")
@click.option("--model", default=None, help="Model preset (tiny, small, 1b, 7b, moe-tiny, qwen3moe-tiny, gpt-oss-tiny, "
              "gemma3-tiny) or a GGUF file (PATH.gguf: "
              "its own hyper-parameters, weight types and vocabulary; --wtype does not apply).")
@click.option("--wtype", default=None, help="Weight type of a preset's mat-mul weights and embedding: f16, bf16, "
              "f32, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q3_k, q4_k, q5_k, q6_k (a K-quant or IQ4_XS falls "
              "back where rows are no multiple of 256, as llama.cpp's quantizer), or llama.cpp's mix q2_k (its "
              "Q2_K), q3_k_m, q4_k_s, q4_k_m, q5_k_s, q5_k_m (Q4_K_M, ...) or mxfp4_moe (MXFP4_MOE: MXFP4 experts, "
              "Q8_0 elsewhere).")
@click.option("--seed", type=int, default=None, help="Weight and prompt seed.")
@click.option("--prompt-tokens", type=int, default=None, help="Prompt length prefilled per sequence.")
@click.option("--prompt-ids", default=None, help="The prompt as token ids, comma-separated (each sequence's; "
              "default: seeded random tokens).")
@click.option("--prompt", default=None,
              help="The prompt as text, tokenized through the model file's vocabulary as llama.cpp's "
                   "llama_tokenize (add_special, parse_special) does: SPM (bigram merges by score, byte "
                   "fallback) and byte-level BPE (pre-tokenizers llama3/llama-bpe, qwen2, smollm, gpt-4o, tekken, "
                   "deepseek-llm, gpt2, default and their aliases). Needs --model FILE.gguf; not with --prompt-ids.")
@click.option("--steps", type=int, default=None, help="Decode steps.")
@click.option("--batch", type=int, default=None, help="Sequences decoded together (tokens per decode step).")
@click.option("--chunk-size", type=int, default=None,
              help="Capture each split in chunks of N nodes: the design article's rule, not in upstream llama.cpp "
                   "(default 0: one graph per split, as upstream). Env: GGML_CUDA_GRAPH_CHUNK_SIZE.")
@click.option("--no-fusion", "fusion", flag_value=False, default=None, help="Env: GGML_CUDA_DISABLE_FUSION.")
@click.option("--concurrent-streams", "concurrent_streams", flag_value=True, default=None,
              help="Run the Q/K/V fan-out on extra streams. Env: GGML_CUDA_GRAPH_OPT=1.")
@click.option("--no-graphs", "graphs_disabled", flag_value=True, default=None,
              help="Disable CUDA graphs. Env: GGML_CUDA_DISABLE_GRAPHS (any value).")
@click.option("--no-reuse", "reuse_disabled", flag_value=True, default=None,
              help="Disable llama.cpp's graph reuse. Env: LLAMA_GRAPH_REUSE_DISABLE.")
@click.option("--swa-full", "swa_full", flag_value=True, default=None,
              help="Give a sliding-window model's SWA cache the full context (llama.cpp --swa-full; default off).")
@click.option("--upstream", type=click.Choice(["0c1e57098", "d99724f2"]), default=None,
              help="The upstream commit whose rules to follow: llama.cpp 0c1e57098 (default) or ggml d99724f2.")
@click.option("--ubatch-size", "ubatch_size", type=int, default=None,
              help="llama.cpp's n_ubatch (default 512, at most n_batch 2048): a longer prompt is decoded in "
                   "ubatches of this many tokens, only the last with an output.")
@click.option("--n-cpu-moe", type=int, default=None, help="Put the experts of the first N MoE layers on the CPU.")
@click.option("--devices", type=int, default=None,
              help="Split the layers across N GPUs (llama.cpp --split-mode layer), each with its own graph cache.")
@click.option("--tensor-split", default=None,
              help="Share of the layers per device, comma-separated (e.g. 3,1; default: by free memory).")
@click.option("--pool-cap", type=int, default=None, help="Bytes the temporary pool may hold on the device.")
@click.option("--pool-max-buffers", type=int, default=None, help="Buffers the pool caches (ggml: 256).")
@click.option("--pool-invalidation", "pool_invalidation", flag_value=True, default=None,
              help="A pool flush invalidates every captured graph: the design article's rule, not in upstream "
                   "llama.cpp (default off).")
@click.option("--cc", "compute_capability", default=None, help="Compute capability of the simulated GPU (e.g. 6.1).")
@click.option("--sim-mode", "sim_mode", type=click.Choice(["compute", "decisions"]), default=None,
              help="Simulated driver: compute every kernel in numpy, or decisions only (kernels modelled, memory "
                   "reserved, no logits or tokens; the same decisions). Default: decisions for 1b and 7b unless "
                   "--verify or --oracle needs results, else compute.")
@click.option("--verify", is_flag=True, default=None, help="Recompute every replayed step eagerly and compare.")
@click.option("--oracle", is_flag=True, default=None, help="Check every step's logits against the numpy oracle.")
@click.option("--no-nvtx", "nvtx", flag_value=False, default=None, help="Emit no NVTX ranges.")
@click.option("--scenario", multiple=True, callback=lambda ctx, param, v: _one_scenario(v),
              help="Run a scenario (name or .toml path) and check its expectations.")
@click.option("--events", "events_path", type=click.Path(dir_okay=False, writable=True, allow_dash=True),
              default=None, help="Write every event as JSON lines to this file; '-': to stdout (the report then "
                                 "goes to stderr).")
@click.option("--timeline", "timeline_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write a Chrome trace-event timeline (open it in ui.perfetto.dev): host scopes, decisions, "
                   "device kernels (CUPTI on CUDA, modelled on the simulated driver).")
@click.option("--cupti", is_flag=True, help="Record device activity with CUPTI on CUDA for the time accounting "
                                            "(implied by --timeline; needs graphdiag[gpu]).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--strict", is_flag=True, help="Fail (exit 1, the cause named) on an unexplained eager fallback, "
              "key thrash, a capture never replayed or a flood of update refusals.")
@click.option("-v", "--verbose", count=True, help="-v: chunks, updates, instantiates; -vv: every uid hit and launch.")
@click.option("--against-llama", is_flag=True, help="Also run the same plan on real llama.cpp (graphdiag llama) "
              "and diff the decisions (exit 1 if they differ). Needs --model PATH.gguf.")
def run(events_path, as_json, verbose, scenario, timeline_path, cupti, strict, against_llama, **settings):
    """Run prefill and decode steps through the CUDA-graph runtime and report every decision."""
    from ..runner import run_cli
    if against_llama:
        from ..errors import UsageError
        if as_json or timeline_path or cupti or strict:
            raise UsageError("--against-llama takes --events, the plan and -v; run graphdiag llama for the rest")
        from ..llama.against import run_against_llama
        return run_against_llama(settings, scenario, events_path, verbosity=verbose)
    return run_cli(settings, timeline_path=timeline_path, cupti=cupti, scenario=scenario, events_path=events_path, as_json=as_json, verbosity=verbose,
                   strict=strict)

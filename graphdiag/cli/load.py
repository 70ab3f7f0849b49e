"""`graphdiag load URL`: a bounded streaming load on an OpenAI-compatible server (llama-server)."""

from __future__ import annotations

import click

from ..load.config import MAX_CLIENTS, MAX_REQUESTS


@click.command()
@click.argument("url")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default=None,
              help="/v1/completions or /v1/chat/completions (default: the URL's path, else completions).")
@click.option("--clients", type=click.IntRange(1, MAX_CLIENTS), default=4, show_default=True,
              help="Concurrent streaming clients.")
@click.option("--requests", "n_requests", type=click.IntRange(1, MAX_REQUESTS), default=32, show_default=True,
              help="Requests in all.")
@click.option("--prompt-tokens", default="16-256", show_default=True,
              help="Prompt length range A-B (or N), drawn per request (exact through the server's /tokenize, "
                   "else about one word a token).")
@click.option("--output-tokens", default="16-128", show_default=True,
              help="Output length range A-B (or N), drawn per request (max_tokens, with ignore_eos).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="A file of prompts, one a line, used in turn instead of synthetic text.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the length and text draws.")
@click.option("--deadline", type=click.FloatRange(0, 86400, min_open=True), default=600, show_default=True,
              help="Seconds for the whole run: requests in flight then are cut, the rest not sent.")
@click.option("--request-timeout", type=click.FloatRange(0, 86400, min_open=True), default=120,
              show_default=True, help="Seconds for one request, from sending it to its last byte.")
@click.option("--tokenize", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="Size prompts exactly with the server's /tokenize (auto: when it has one).")
@click.option("--no-ignore-eos", is_flag=True, help="Let the model stop before the drawn output length.")
@click.option("--model", default=None, help="The request's model field (llama-server ignores it).")
@click.option("--allow-host", default=None, help="Send load to this non-loopback host (it must be the URL's).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of the tables.")
def load(url, endpoint, clients, n_requests, prompt_tokens, output_tokens, prompts_file, seed, deadline,
         request_timeout, tokenize, no_ignore_eos, model, allow_host, as_json):
    """Send a bounded load to URL (http://127.0.0.1:8080, or its /v1/completions or /v1/chat/completions):
    --requests streamed requests on --clients concurrent clients, prompt and output lengths drawn from their
    ranges with --seed. Reports per request the time to first token, tokens per second (after the first) and
    errors, with llama-server's own timings. Loopback only unless --allow-host names the host. Exits 0 when
    every request completed, 1 when any failed or the deadline cut the run, 2 when the endpoint is dead or is
    not a streaming completions endpoint."""
    from ..load import config as C
    from ..load.display import progress_for, render, render_json
    from ..load.prompts import plan_requests
    from ..load.results import Collector

    base, endpoint = C.split_url(url, endpoint, allow_host)
    cfg = C.LoadConfig(base, endpoint, clients, n_requests, C.parse_range(prompt_tokens, "--prompt-tokens"),
                       C.parse_range(output_tokens, "--output-tokens"), prompts_file, seed, deadline,
                       request_timeout, model=model, tokenize=tokenize, ignore_eos=not no_ignore_eos)
    prompts = C.read_prompts(prompts_file) if prompts_file else None
    from ..load.client import run                       # needs httpx: after the input is checked
    collector, progress = Collector(n_requests), progress_for()
    try:
        run(cfg, plan_requests(n_requests, cfg.prompt_tokens, cfg.output_tokens, seed, prompts),
            lambda e: (collector(e), progress(e)))
    except KeyboardInterrupt:                   # Ctrl-C or SIGTERM: what was measured so far, then exit 130/143
        progress.close()
        if collector.result.rows:
            (render_json if as_json else render)(collector.result)
        raise
    (render_json if as_json else render)(collector.result)
    return 0 if collector.result.complete else 1

"""`graphdiag load`: a bounded serving load against an OpenAI-compatible server (llama-server's /v1/completions
and /v1/chat/completions), streaming, with per-request time to first token, tokens per second and errors.

config.py (LoadConfig, validation of URL, loopback rule and ranges: pure), prompts.py (seeded prompt and output
lengths, synthetic text, approximate and exact token sizing), sse.py (a streamed response's lines to chunks: pure),
events.py (what happened to each request), client.py (the only httpx importer: the probe and the concurrent
clients), results.py (events to per-request rows and a summary: pure), display.py (live progress, table, JSON).
"""

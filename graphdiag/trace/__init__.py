"""`graphdiag trace -- CMD`: the CUDA graphs of any process, unmodified, out of process.

gdtrace.c (the injection library the CUDA driver loads into CMD) and build.py (compiling it on first use);
raw.py (its JSON-lines stream), convert.py (the stream as a graphdiag record), command.py (starting CMD,
passing its output through, reading llama.cpp's graph log lines from its stderr). What a trace's
llama_decode batches are then used for: replay_plan.py (the batches as graphdiag plan steps), replay.py
(`graphdiag replay`: graphdiag's runtime on them), server_sim.py (padded batches, the requests under other
slot counts) and operator.py (`graphdiag whatif --pad-batches / --slots / --model-draft`).
"""

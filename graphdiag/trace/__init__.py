"""`graphdiag trace -- CMD`: the CUDA graphs of any process, unmodified, out of process.

gdtrace.c (the injection library the CUDA driver loads into CMD) and build.py (compiling it on first use);
raw.py (its JSON-lines stream), convert.py (the stream as a graphdiag record), command.py (starting CMD,
passing its output through, reading llama.cpp's graph log lines from its stderr).
"""

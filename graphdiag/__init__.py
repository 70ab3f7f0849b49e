"""graphdiag: diagnostics for CUDA-graph capture/replay in LLM decode.

A faithful reproduction of llama.cpp's CUDA graph path (graph keys, uid fast path, node-property ledger,
compatibility, warmup, chunked capture with fusion and concurrent streams, update vs instantiate) over a
reference decode workload, reporting every decision it takes as an event.
"""

__version__ = "0.1.0"

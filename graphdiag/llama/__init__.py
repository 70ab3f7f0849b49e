"""Real llama.cpp, watched: its CUDA graph calls and log lines (graphdiag llama).

`graphdiag llama MODEL.gguf` drives llama-cpp-python's low-level API in this process (driver.py, run.py),
watch.py (CUPTI callbacks on the runtime graph calls, llama.cpp's log callback) writes the raw stream
(raw.py), and convert.py turns it into a graphdiag record of the same schema, so report, diff, --timeline,
--plot and --strict work on it. units.py groups one decode's calls into graph computes; expressible.py says
which plans llama.cpp can run; batches.py makes each step's llama_batch from graphdiag's own plan.
"""

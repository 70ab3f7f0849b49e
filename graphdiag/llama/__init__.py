"""Real llama.cpp, watched: its CUDA graph calls and log lines (graphdiag llama)."""

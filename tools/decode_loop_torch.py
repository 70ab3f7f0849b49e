"""A decode-like loop on PyTorch, for `graphdiag bench trace -- python tools/decode_loop_torch.py`: what tracing
costs a program whose every token is one CUDA graph replay, without building llama.cpp.

Per token: the token copied in (pinned host → device), a captured graph of 80 small kernels (mul and add on
256 Ki floats, ~2 µs each) replayed, one value read back (a device → host copy and a synchronisation), as
llama.cpp's decode does. 300 tokens of warm-up, then three timed runs of 1000; prints llama-bench's JSON line
(n_prompt 0, n_gen 1000, avg_ts: their mean tokens per second), which bench trace reads as llama-bench's.
Needs torch with CUDA.
"""

import json
import time

import torch


def main() -> None:
    x = torch.ones(262144, device="cuda")
    y = torch.empty_like(x)
    tok = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y.copy_(x * 2)                                  # warm up on a side stream, as torch asks before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(40):
            torch.mul(x, 1.0001, out=y)
            torch.add(y, tok, out=x)
    host = torch.zeros(1).pin_memory()

    def run(n: int) -> None:
        for i in range(n):
            host[0] = float(i & 7)
            tok.copy_(host, non_blocking=True)
            graph.replay()
            float(x[0].item())

    run(300)
    rates = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(1000)
        rates.append(1000 / (time.perf_counter() - t0))
    print(json.dumps({"n_prompt": 0, "n_gen": 1000, "avg_ts": sum(rates) / len(rates)}))


if __name__ == "__main__":
    main()

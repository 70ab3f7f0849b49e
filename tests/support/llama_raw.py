"""Synthetic llama-watch raw streams, written line by line as ggml 0c1e57098's CUDA backend makes its calls
(until the lead's recorded fixtures replace them): each helper appends one graph compute's lines."""

from __future__ import annotations

import json
from pathlib import Path

from graphdiag.plan import n_ubatches


class RawStream:
    """Builds a raw stream. Ids: CUPTI graph ids count from 1, executable ids from 1."""

    def __init__(self, env: dict | None = None, batch: int = 1, **header):
        self.given = set(header)
        self.t = 1_000_000
        self.graphs = 0
        self.execs = 0
        self.lines = [{"raw": "llama-watch", "version": 1, "model": "/m/tiny.gguf", "model_sha256": "ab" * 32,
                       "llama_cpp": "0.3.36", "env": env or {}, "device": "NVIDIA H200", "cc": 90,
                       "n_ctx": 4096, "n_batch": 512, "n_ubatch": 512, "flash_attn": True, "batch": batch,
                       "steps": 0, "prompt_tokens": 16, "plan": [], **header}]
        self.step = -1

    def _tick(self, dt: int = 1000) -> tuple[int, int]:
        t0 = self.t
        self.t += dt
        return t0, self.t

    def _api(self, fn: str, dt: int = 1000, **kw) -> None:
        t0, t1 = self._tick(dt)
        self.lines.append({"ev": "api", "fn": fn, "t0_ns": t0, "t1_ns": t1, "ret": 0, **kw})

    def log(self, text: str) -> "RawStream":
        self.lines.append({"ev": "log", "level": 1, "text": text, "t_ns": self._tick()[0]})
        return self

    def begin(self, n_tokens: int = 1, n_seqs: int = 1, n_outputs: int | None = None) -> "RawStream":
        self.step += 1
        self.lines.append({"ev": "decode_begin", "step": self.step, "n_tokens": n_tokens, "n_seqs": n_seqs,
                           "n_outputs": n_tokens if n_outputs is None else n_outputs, "t_ns": self._tick()[0]})
        return self

    def finish(self, ret: int = 0, host_ns: int = 190_000, gpu_ns: int | None = 150_000) -> "RawStream":
        self.lines.append({"ev": "decode_end", "step": self.step, "ret": ret, "host_ns": host_ns,
                           "gpu_ns": gpu_ns, "t_ns": self._tick()[0]})
        return self

    def decode(self, *computes, **kw) -> "RawStream":
        """One llama_decode: begin, each compute (a callable of this stream), end."""
        self.begin(**{k: kw.pop(k) for k in ("n_tokens", "n_seqs", "n_outputs") if k in kw})
        for c in computes:
            c(self)
        return self.finish(**kw)

    # one graph compute each (ggml_backend_cuda_graph_compute)
    def eager(self) -> None:
        """A cold entry whose properties changed: eager, nothing logged."""

    def warmup_reset(self) -> None:
        self.log("ggml_backend_cuda_graph_compute: CUDA graph warmup reset\n")

    def capture(self, nodes: int = 61, kernel_nodes: int = 61, new_entry: bool = False, uid: int = 0,
                result: int = 0, exec_id: int = 0, warmup: bool = True) -> int:
        """A capture; new_entry: the entry's first (instantiate, then the update ggml always makes).
        result != 0: the update refused, the executable destroyed and instantiated again. Returns the
        executable launched."""
        if uid:
            self.log(f"CUDA Graph id {uid} reused\n")
        if warmup:
            self.log("ggml_backend_cuda_graph_compute: CUDA graph warmup complete\n")
        self.graphs += 1
        self._api("cudaStreamBeginCapture")
        self._api("cudaStreamEndCapture", 50_000, graph=self.graphs, kernel_nodes=kernel_nodes, nodes=nodes)
        if new_entry:
            self.execs += 1
            exec_id = self.execs
            self._api("cudaGraphInstantiate", 300_000, graph=self.graphs, exec=exec_id)
        self._api("cudaGraphExecUpdate", 100_000, exec=exec_id, graph=self.graphs, update_result=result,
                  error_node=result not in (0, 2))
        if result:
            self._api("cudaGraphExecDestroy", exec=exec_id)
            self.execs += 1
            exec_id = self.execs
            self._api("cudaGraphInstantiate", 300_000, graph=self.graphs, exec=exec_id)
        self._api("cudaGraphLaunch", 5_000, exec=exec_id)
        return exec_id

    def replay(self, exec_id: int, uid: int = 0) -> None:
        if uid:
            self.log(f"CUDA Graph id {uid} reused\n")
        self._api("cudaGraphLaunch", 5_000, exec=exec_id)

    def evict(self, exec_id: int) -> None:
        """The cache lookup after 10 s idle: the entry's executable destroyed."""
        self._api("cudaGraphExecDestroy", exec=exec_id)

    def end(self, status: str = "complete", n_reused: int = 0) -> "RawStream":
        self.lines.append({"ev": "perf", "n_reused": n_reused, "n_eval": self.step, "n_p_eval": 16})
        self.lines.append({"ev": "end", "status": status, "t_ns": self._tick()[0]})
        return self

    def write(self, path: Path) -> Path:
        """The stream as a file; its header's `steps` as the driver writes it (the plan's steps after each
        sequence's prompt, a prompt as many decodes as it has ubatches), unless the header gave them."""
        h = self.lines[0]
        if "steps" not in self.given:
            h["steps"] = self.step + 1 - h["batch"] * n_ubatches(h["prompt_tokens"], h["n_ubatch"])
        path.write_text("".join(json.dumps(ln) + "\n" for ln in self.lines))
        return path


def steady(steps: int = 6, uid: int = 4, nodes: int = 58) -> RawStream:
    """Prefill (eager), decode 1 eager (properties changed), capture at decode 2, replays after (graphdiag's
    tiny captures 58 graph nodes after a 16-token prompt; 59 under --upstream d99724f2, the mask cast too)."""
    r = RawStream()
    r.decode(RawStream.eager, n_tokens=16, n_outputs=1)
    r.decode(RawStream.eager)
    box = {}
    r.decode(lambda s: box.setdefault("x", s.capture(new_entry=True, uid=uid, nodes=nodes, kernel_nodes=nodes)))
    for _ in range(steps - 3):
        r.decode(lambda s: s.replay(box["x"], uid=uid))
    return r.end(n_reused=steps - 2)


def moe_capture_stream(nodes: list[int], results: list[int], tokens=(2, 8, 9)) -> RawStream:
    """One entry captured at each token count (new at the first), llama.cpp's update results after the first:
    the shape of the MoE cuBLAS cases (an eager first compute, then a warmup reset before each recapture)."""
    r, box = RawStream(), {}
    r.decode(RawStream.eager, n_tokens=tokens[0], n_seqs=tokens[0])
    r.decode(lambda s: box.__setitem__("x", s.capture(new_entry=True, nodes=nodes[0], kernel_nodes=nodes[0])),
             n_tokens=tokens[0], n_seqs=tokens[0])
    for n, res, t in zip(nodes[1:], results, tokens[1:]):
        r.decode(RawStream.warmup_reset, n_tokens=t, n_seqs=t)
        r.decode(lambda s, n=n, res=res: box.__setitem__("x", s.capture(result=res, exec_id=box["x"], nodes=n,
                                                                           kernel_nodes=n)), n_tokens=t, n_seqs=t)
    return r.end()

"""A stand-in for llama_cpp's low-level API and for the CUPTI/log watcher, for CPU tests of the driver.

FakeLlama's llama_decode walks ggml 0c1e57098's graph path in miniature for one split: graph reuse while
(n_tokens, n_seqs, n_outputs, padded n_kv) stay the same (then the uid repeats and "CUDA Graph id N reused"
is logged), the warmup state machine, capture / instantiate / update with a refusal when the token count
crosses 1 (the fusions change the topology), and it tells the watcher's emit each call it makes."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np


class FakeWatcher:
    """What watch.py's Watcher is to the driver: made with the raw stream's emit; start / close."""

    instances: list["FakeWatcher"] = []

    def __init__(self, emit):
        self.emit, self.started, self.closed = emit, False, False
        FakeWatcher.instances.append(self)

    def start(self):
        self.started = True

    def close(self):
        self.closed = True


class FakeLlama:
    """The llama_cpp functions the driver calls. `gpu`: whether the build has a GPU backend."""

    def __init__(self, n_vocab: int = 4096, gpu: bool = True, fail_at: int = -1):
        self.n_vocab, self.gpu, self.fail_at = n_vocab, gpu, fail_at
        self.calls: list[str] = []
        self.batches: list[tuple] = []
        self.t = 0
        self.uid = 0
        self.last_params = None
        self.warm, self.instance, self.execs, self.last_n_tok = False, 0, 0, None
        self.logits = np.zeros(n_vocab, np.float32)
        self.freed = []

    # loading
    def llama_supports_gpu_offload(self):
        return self.gpu

    def llama_backend_init(self):
        self.calls.append("backend_init")

    def llama_model_default_params(self):
        return SimpleNamespace(n_gpu_layers=0)

    def llama_model_load_from_file(self, path, params):
        self.model_params = params
        return 1

    def llama_model_get_vocab(self, model):
        return 2

    def llama_vocab_n_tokens(self, vocab):
        return self.n_vocab

    def llama_context_default_params(self):
        return SimpleNamespace()

    def llama_init_from_model(self, model, params):
        self.ctx_params = params
        return 3

    def llama_batch_init(self, n, embd, n_seq_max):
        return SimpleNamespace(n_tokens=0, token=[0] * n, pos=[0] * n, n_seq_id=[0] * n,
                               seq_id=[[0] for _ in range(n)], logits=[0] * n)

    # decoding
    def llama_decode(self, ctx, b):
        n = b.n_tokens
        self.batches.append((list(b.token[:n]), list(b.pos[:n]), [s[0] for s in b.seq_id[:n]], list(b.logits[:n])))
        if len(self.batches) - 1 == self.fail_at:
            return -3
        cells = max(p for _, ps, _, _ in self.batches for p in ps) + 1
        params = (n, len(set(s[0] for s in b.seq_id[:n])), sum(b.logits[:n]), max(256, -(-cells // 256) * 256))
        if params != self.last_params:
            self.uid += 2                      # a rebuilt graph: a new split uid
            changed = True
        else:
            self.log(f"CUDA Graph id {self.uid} reused\n")
            changed = False
        self.last_params = params
        self._compute(changed, n)
        return 0

    def _compute(self, changed: bool, n: int) -> None:
        if not self.warm:
            if changed:
                return                          # eager, nothing logged
            self.warm = True
            self.log("ggml_backend_cuda_graph_compute: CUDA graph warmup complete\n")
            self._capture(n)
        elif changed:
            self.warm = False
            self.log("ggml_backend_cuda_graph_compute: CUDA graph warmup reset\n")
        elif self.instance == 0:
            self._capture(n)
        else:
            self.api("cudaGraphLaunch", exec=self.instance)

    def _capture(self, n: int) -> None:
        nodes = 61 if n == 1 else 74
        self.api("cudaStreamBeginCapture")
        self.api("cudaStreamEndCapture", graph=1, nodes=nodes, kernel_nodes=nodes)
        if self.instance == 0:
            self.execs += 1
            self.instance = self.execs
            self.api("cudaGraphInstantiate", graph=1, exec=self.instance)
        refused = self.last_n_tok is not None and (self.last_n_tok == 1) != (n == 1)
        self.api("cudaGraphExecUpdate", exec=self.instance, graph=1, update_result=2 if refused else 0,
                 error_node=False)
        if refused:
            self.api("cudaGraphExecDestroy", exec=self.instance)
            self.execs += 1
            self.instance = self.execs
            self.api("cudaGraphInstantiate", graph=1, exec=self.instance)
        self.last_n_tok = n
        self.api("cudaGraphLaunch", exec=self.instance)

    def emit(self, obj):
        for w in FakeWatcher.instances[-1:]:
            if w.started and not w.closed:
                w.emit(obj)

    def api(self, fn, **kw):
        self.t += 1000
        self.emit({"ev": "api", "fn": fn, "t0_ns": self.t, "t1_ns": self.t + 500, "ret": 0, **kw})

    def log(self, text):
        self.emit({"ev": "log", "level": 1, "text": text})

    def llama_synchronize(self, ctx):
        pass

    def llama_get_logits_ith(self, ctx, i):
        self.logits[:] = 0
        self.logits[(7 * len(self.batches) + i) % self.n_vocab] = 1
        return self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def llama_perf_context(self, ctx):
        return SimpleNamespace(n_reused=sum(1 for _ in self.batches) - self.uid // 2, n_eval=len(self.batches),
                               n_p_eval=0)

    # freeing
    def llama_batch_free(self, b):
        self.freed.append("batch")

    def llama_free(self, ctx):
        self.freed.append("ctx")

    def llama_model_free(self, m):
        self.freed.append("model")


class OneTokenBatcher:
    """A batcher for graphdiag.llama.driver.walk: every step one decode token of one sequence, no idle time."""

    def batch(self, p):
        return SimpleNamespace(idle_s=0, n_tokens=1, n_seqs=1, outputs=[0], kind="decode")

    def took(self, b, toks):
        pass

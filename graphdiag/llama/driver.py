"""Real llama.cpp in this process, through llama-cpp-python's low-level ctypes API: one llama_decode per
step of graphdiag's plan, timed, with an NVTX range around each, while a watcher records the graph calls.

Loading: llama-cpp-python's CUDA build ships libggml-cuda.so with a private copy of libstdc++ code that it
exports; libllama's iostream calls then bind to that copy and crash in llama_model::print_info. Loading the
system libstdc++.so.6 with RTLD_GLOBAL before `import llama_cpp` puts the system library first in the
global symbol scope, so every library binds to it (the in-process equivalent of LD_PRELOAD).

The watcher (watch.py's Watch through LeadWatcher, imported lazily; a test hands in a fake) is made as
`watcher(emit)`, with `emit` the raw stream's writer: it subscribes CUPTI callbacks for the graph calls and
llama.cpp's log callback in `start()` and stops in `close()`. The driver writes decode_begin / decode_end /
perf / end itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import events as E
from ..config import N_UBATCH
from ..errors import NoDeviceError, UsageError

NO_LLAMA = ("llama_cpp is not installed (or not loadable): pip install '.[llama]' — a CUDA build of "
            "llama-cpp-python 0.3.36, see docs/commands/llama.md")


def preload_libstdcxx() -> str:
    """dlopen the system libstdc++ with RTLD_GLOBAL (see the module docstring); its name, '' if none."""
    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return ""
    return name


def require_llama_cpp() -> None:
    """UsageError (one line) when llama_cpp is not installed at all: said before any GPU is asked for."""
    import importlib.util
    if importlib.util.find_spec("llama_cpp") is None:
        raise UsageError(NO_LLAMA)


def load_llama_cpp():
    """The llama_cpp module, loaded after the libstdc++ fix; UsageError (one line) when it cannot be."""
    preload_libstdcxx()
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError) as e:
        raise UsageError(f"{NO_LLAMA} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    with contextlib.suppress(Exception):       # its own log callback prints every line until the watcher's
        from llama_cpp import _logger           # replaces it: errors only
        _logger.set_verbose(False)
    return llama_cpp


def check_gpu(ll) -> None:
    """A CUDA build with a GPU, else NoDeviceError (exit 2, one line)."""
    if not ll.llama_supports_gpu_offload():
        raise NoDeviceError("this llama_cpp has no GPU backend (a CPU-only build): rebuild it with "
                            "CMAKE_ARGS=-DGGML_CUDA=on, see docs/commands/llama.md")


@dataclass(frozen=True)
class ContextParams:
    """What llama_context_params gets: n_ctx cells, n_batch tokens per llama_decode (llama.cpp's 2048, or
    a larger step's), n_ubatch (graphdiag's --ubatch-size: every step has at most that many tokens, so each
    llama_decode is one ubatch, as graphdiag's step), n_seq_max sequences, flash attention on, one unified KV cache (graphdiag's cells are
    shared by every sequence), SWA caches full size only with swa_full (graphdiag's --swa-full)."""

    n_ctx: int
    n_batch: int
    n_seq_max: int
    flash_attn: bool = True
    swa_full: bool = False
    n_ubatch: int = N_UBATCH


class LlamaSession:
    """A loaded model, its context and one batch; `close()` frees them in reverse order."""

    def __init__(self, ll, path: str, cp: ContextParams):
        self.ll, self.cp = ll, cp
        self.model = self.ctx = self.batch = None
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 999                      # every layer on the GPU
        self.model = ll.llama_model_load_from_file(os.fsencode(path), mp)
        if not self.model:
            raise UsageError(f"{path}: llama.cpp could not load this model (see its log above)")
        try:
            self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
            p = ll.llama_context_default_params()
            p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max
            p.flash_attn_type = 1 if cp.flash_attn else 0        # LLAMA_FLASH_ATTN_TYPE_ENABLED / DISABLED
            p.swa_full, p.kv_unified, p.no_perf = cp.swa_full, True, False
            self.ctx = ll.llama_init_from_model(self.model, p)
            if not self.ctx:
                raise UsageError(f"{path}: llama.cpp could not create a context (n_ctx {cp.n_ctx})")
            self.batch = ll.llama_batch_init(cp.n_batch, 0, 1)
        except BaseException:
            self.close()
            raise

    def decode(self, b) -> tuple[int, int, list[int]]:
        """(llama_decode's return, host ns through llama_synchronize, greedy token per output)."""
        bt, ll = self.batch, self.ll
        bt.n_tokens = b.n_tokens
        for i, (t, p, q, f) in enumerate(zip(b.tokens, b.pos, b.seqs, b.logits)):
            bt.token[i], bt.pos[i], bt.n_seq_id[i], bt.logits[i] = t, p, 1, int(f)
            bt.seq_id[i][0] = q
        t0 = time.perf_counter_ns()
        ret = ll.llama_decode(self.ctx, bt)
        ll.llama_synchronize(self.ctx)
        host = time.perf_counter_ns() - t0
        if ret != 0:
            return ret, host, []
        return ret, host, [self._argmax(i) for i in b.outputs]

    def _argmax(self, i: int) -> int:
        ptr = self.ll.llama_get_logits_ith(self.ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

    def perf(self) -> dict:
        d = self.ll.llama_perf_context(self.ctx)
        return {"n_reused": int(d.n_reused), "n_eval": int(d.n_eval), "n_p_eval": int(d.n_p_eval)}

    def close(self) -> None:
        ll = self.ll
        if self.batch is not None:
            ll.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            ll.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None


class LeadWatcher:
    """The watcher as the driver uses it: made with the raw stream's emit; start() subscribes CUPTI and routes
    llama.cpp's log lines, drain() hands over what the library wrote, close() lets go. The watch is graphdiag's
    injection library in this process (inject.py: C callbacks, as `graphdiag trace`), or, where it cannot be
    built (no C compiler or CUDA headers) or GRAPHDIAG_WATCHER=python asks, cupti-python's callbacks
    (watch.py); `kind` says which. With GGML_CUDA_DISABLE_GRAPHS set llama.cpp makes no graph call, so no
    CUPTI subscriber is made (watch.LogWatch: its log lines alone): CUPTI's dispatch around the callbacks a
    subscriber enables (the synchronisations among them) costs every watched step time, which is what a
    graphs-off run of `bench steps --peer llama` measures (the injection library's callbacks took a traced
    llama-bench from 5232 to 4597 tokens/s on the H100, 2026-12-07, of which its own code ~5 us a token).
    GRAPHDIAG_WATCHER=log: the log alone with graphs on too (bench's llama.cpp peer times a run so, its
    decisions read from a watched run of the same plan). GRAPHDIAG_WATCHER=interpose: the same library's
    interposing build, loaded before llama_cpp (run.py: inject.preload_interposer; `interposer` its path), reads
    the runtime's graph calls without a CUPTI subscriber, as `graphdiag trace` does by default."""

    def __init__(self, emit, llama_cpp_module, interposer: Path | None = None):
        names = os.environ.get("GRAPHDIAG_WATCH_KERNEL_NAMES", "") not in ("", "0")
        self.ll, self.watch, self.kind = llama_cpp_module, None, "cupti-python"
        from .watch import LogWatch
        if "GGML_CUDA_DISABLE_GRAPHS" in os.environ:     # ggml reads its presence (convert.py)
            self.watch, self.kind = LogWatch(emit), "none: graphs off, no graph calls to watch"
        elif os.environ.get("GRAPHDIAG_WATCHER", "") == "log":
            self.watch, self.kind = LogWatch(emit), "none: log lines only (GRAPHDIAG_WATCHER=log)"
        elif os.environ.get("GRAPHDIAG_WATCHER", "") != "python":
            from ..config import kernel_cache_dir
            from ..errors import TraceError
            from ..trace import build
            from .inject import InjectedWatch
            if interposer is not None:
                self.watch = InjectedWatch(emit, interposer, kernel_names=names, interpose=True)
                self.kind = "injection library, interposing"
            else:
                with contextlib.suppress(TraceError):
                    self.watch = InjectedWatch(emit, build.library(kernel_cache_dir()), kernel_names=names)
                    self.kind = "injection library"
        if self.watch is None:
            from .watch import Watch
            self.watch = Watch(emit, kernel_names=names)

    def start(self) -> None:
        self.watch.attach_log(self.ll)
        self.watch.start()
        if getattr(self.watch, "interpose", False) and self.watch.reads != "interpose":
            self.kind = "injection library, CUPTI (the runtime's symbols were not the interposer's)"

    def drain(self) -> None:
        if hasattr(self.watch, "drain"):
            self.watch.drain()

    def own_ns(self) -> int:
        """ns the watcher has spent in its own callbacks so far."""
        return self.watch.own_ns

    def close(self) -> None:
        self.watch.stop()
        _RETIRED.append(self.watch)          # llama.cpp keeps calling its log callback until the process ends


_RETIRED: list = []     # watches whose ctypes log callback llama.cpp still holds: never freed


def nvtx_sink():
    """graphdiag's NVTX sink (a no-op without a tool attached), or None without the nvtx package."""
    with contextlib.suppress(ImportError):
        from ..report.sinks.nvtx_sink import NvtxSink
        return NvtxSink()
    return None


def walk(session: LlamaSession, plan, batcher, emit, nvtx=None, gpu_ns=None, own_ns=None, drain=None) -> int:
    """Decode every step of `plan` (StepPlans) with `batcher`'s batches: decode_begin, llama_decode in an
    NVTX range, decode_end. Idle time is slept before its step (real time: llama.cpp's eviction clock is
    the wall clock). `drain()`, when the watcher has one, hands over the calls it wrote since its last drain:
    made before each decode_begin and decode_end. `gpu_ns()`, when the watcher has one, gives the GPU time of
    the decode just made
    (None: not measured); `own_ns()`, the ns the watcher has spent in its own callbacks so far: what a
    decode spent there is taken out of its host_ns (llama.cpp's step time) and recorded as watch_ns.
    Returns the steps decoded successfully."""
    done = 0
    for step, p in enumerate(plan):
        b = batcher.batch(p)
        if b.idle_s:
            time.sleep(b.idle_s)
        if drain is not None:
            drain()
        emit({"ev": "decode_begin", "step": step, "n_tokens": b.n_tokens, "n_seqs": b.n_seqs,
              "n_outputs": len(b.outputs), "phase": b.kind, "t_ns": time.perf_counter_ns()})
        if nvtx is not None:
            nvtx(E.SpanBegin(step=step, name="llama_decode", category="llama/decode", payload=step))
        own0 = own_ns() if own_ns is not None else 0
        try:
            ret, host, toks = session.decode(b)
        finally:
            if nvtx is not None:
                nvtx(E.SpanEnd(step=step, name="llama_decode", category="llama/decode"))
        watched = own_ns() - own0 if own_ns is not None else 0
        if drain is not None:
            drain()
        emit({"ev": "decode_end", "step": step, "ret": ret, "host_ns": max(host - watched, 0), "watch_ns": watched,
              "gpu_ns": gpu_ns() if gpu_ns is not None else None, "tokens": toks, "t_ns": time.perf_counter_ns()})
        batcher.took(b, toks)
        done += ret == 0
    return done

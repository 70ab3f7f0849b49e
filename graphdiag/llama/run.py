"""One watched llama.cpp run: settings and a GGUF file in, the raw stream written, the converted record out.

Every check comes first, before llama.cpp loads anything: the file is a GGUF, the plan is expressible
(expressible.py), the prompt's ids are in the file's vocabulary, the plan's KV demand fits the context, llama_cpp loads and has a GPU. Then the
environment the settings mean is set (ggml reads it once per process), the model and context are made,
the watcher starts, every step is decoded (driver.walk), and the stream ends with llama_perf_context and
how the run ended — however it ended.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import events as E
from ..config import N_BATCH
from ..errors import Terminated, UsageError, WatchError
from ..model.gguf_io import read_gguf
from ..plan import kv_demand, max_sequences, plan_steps
from ..report.record.header import RunHeader
from .batches import Batcher
from .convert import convert_raw
from .driver import (ContextParams, LeadWatcher, LlamaSession, check_gpu, load_llama_cpp, nvtx_sink,
                     require_llama_cpp, walk)
from .expressible import check_expressible, check_gguf, context_length, llama_env
from .raw import RawWriter

LLAMA_CPP_VERSION = "0.3.36"


@dataclass
class LlamaResult:
    raw_path: Path
    header: RunHeader
    events: list[E.Event]


def prepare(model: str, cfg, scenario=None) -> tuple[Path, list, ContextParams]:
    """(file, plan, context params) with every check that needs no llama.cpp made."""
    path = check_gguf(model)
    reader = read_gguf(path)          # truncated or corrupt (alignment 0, a tensor named twice): one line, here
    check_expressible(cfg, scenario)
    n_vocab = file_vocab_size(reader)
    if n_vocab is not None:           # before the raw stream is opened (and again against llama.cpp's count)
        _check_prompt(cfg, n_vocab)
    plan = list(plan_steps(cfg, scenario))
    n_ctx = context_length(path)
    demand = kv_demand(plan, n_ctx)
    if demand.overflow_step is not None:
        raise UsageError(f"step {demand.overflow_step} needs {demand.cells} KV cells, more than the context's "
                         f"{n_ctx} (the file's context length, at most graphdiag's): fewer steps or tokens")
    # each step is one llama_decode of at most n_ubatch tokens (plan.py splits prompts as llama.cpp would),
    # so llama.cpp makes it exactly one ubatch: graphdiag's step i is llama.cpp's ubatch i
    n_batch = max([N_BATCH] + [p.tokens for p in plan])
    n_seq = max_sequences(plan)
    # swa_full as graphdiag's run has it (off unless --swa-full, as llama-server; the C API's default is on)
    return path, plan, ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq, swa_full=bool(cfg.swa_full),
                                     n_ubatch=cfg.ubatch_size)


def gpu_identity() -> tuple[str, int]:
    """The GPU llama.cpp will run on (device 0: its default main GPU); NoDeviceError without one."""
    from ..backends.drivers.cuda import device_identity
    return device_identity(0)


def run_llama(model: str, cfg, scenario=None, raw_path: str | Path | None = None, lib=None,
              watcher=None, gpu=gpu_identity) -> LlamaResult:
    """Run the plan on real llama.cpp and convert its stream. `lib` (the llama_cpp module), `watcher` (a
    factory `watcher(emit)`) and `gpu` (() -> (name, cc)) are for tests; by default llama_cpp is imported
    with the libstdc++ fix, watch.py's Watcher records the graph calls, and the GPU is asked for first."""
    path, plan, cp = prepare(model, cfg, scenario)
    if lib is None:
        require_llama_cpp()
    device, cc = gpu()
    env = llama_env(cfg)
    os.environ.update(env)                    # before llama.cpp loads: ggml reads these once per process
    interposer = None
    graphs = "GGML_CUDA_DISABLE_GRAPHS" not in os.environ
    if lib is None and graphs and os.environ.get("GRAPHDIAG_WATCHER") == "interpose":
        from ..config import kernel_cache_dir
        from .inject import preload_interposer
        interposer = preload_interposer(kernel_cache_dir())      # before libllama: see LeadWatcher
    ll = lib if lib is not None else load_llama_cpp()
    check_gpu(ll)
    raw_path = Path(raw_path) if raw_path else Path(tempfile.mkstemp(prefix="llama-", suffix=".raw.jsonl")[1])
    writer = RawWriter(raw_path, _raw_header(path, cfg, scenario, cp, env, plan) | {"device": device, "cc": cc})
    try:
        _session(ll, path, cp, cfg, plan, writer, watcher or (lambda emit: LeadWatcher(emit, ll, interposer)))
    finally:
        writer.close()
    header, events = convert_raw(raw_path)
    return LlamaResult(raw_path, header, events)


def _session(ll, path: Path, cp: ContextParams, cfg, plan, writer: RawWriter, make_watcher) -> None:
    """Load, watch, walk, and end the stream with how it ended (a model llama.cpp cannot load included)."""
    status, session = "failed: llama.cpp could not load the model", None
    try:
        session = LlamaSession(ll, str(path), cp)
        _check_prompt(cfg, session.n_vocab)
        w = make_watcher(writer.emit)
        try:
            status = "failed: llama.cpp's graph calls could not be watched (CUPTI)"
            w.start()                      # a watcher that fails to start is closed too (its log callback kept)
            if getattr(w, "kind", None):
                writer.emit({"ev": "watcher", "kind": w.kind})
            status = "failed: stopped inside a decode"
            walk(session, plan, Batcher(cfg, session.n_vocab), writer.emit, nvtx_sink(), getattr(w, "gpu_ns", None),
                 getattr(w, "own_ns", None), getattr(w, "drain", None))
            status = "complete"
        except KeyboardInterrupt as e:
            status = f"interrupted: {'SIGTERM' if isinstance(e, Terminated) else 'Ctrl-C'}"
            raise
        except WatchError:
            raise                          # the status already says it
        except Exception as e:
            status = f"failed: {type(e).__name__}: {e}"
            raise
        finally:
            w.close()
            writer.emit({"ev": "perf", **session.perf()})
    finally:
        writer.emit({"ev": "end", "status": status})
        if session is not None:
            session.close()


def file_vocab_size(reader) -> int | None:
    """The vocabulary size llama.cpp will report for the file (llama_vocab_n_tokens: its token list), else
    the token embedding's rows; None when the file has neither."""
    f = reader.fields.get("tokenizer.ggml.tokens")
    if f is not None:
        return len(f.data)
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    return int(embd.shape[1]) if embd is not None and len(embd.shape) >= 2 else None


def _check_prompt(cfg, n_vocab: int) -> None:
    if cfg.prompt_ids and max(cfg.prompt_ids) >= n_vocab:
        raise UsageError(f"prompt id {max(cfg.prompt_ids)} is not in the model's vocabulary ({n_vocab} tokens)")


def _raw_header(path: Path, cfg, scenario, cp: ContextParams, env: dict, plan) -> dict:
    return {"model": str(path), "model_sha256": _sha256(path), "llama_cpp": LLAMA_CPP_VERSION, "env": env,
            "n_ctx": cp.n_ctx, "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch,
            "n_seq_max": cp.n_seq_max, "flash_attn": cp.flash_attn, "swa_full": cp.swa_full,
            "batch": cfg.batch, "steps": cfg.steps, "prompt_tokens": cfg.prompt_tokens, "seed": cfg.seed,
            "scenario": getattr(scenario, "name", None),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "plan": [dataclasses.asdict(p) for p in plan[:4096]]}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()

"""Watch real llama.cpp's CUDA graph calls through graphdiag's injection library (trace/gdtrace.c) loaded into
this process: the same C callbacks `graphdiag trace` uses, instead of cupti-python's Python callbacks (watch.py).

The library is loaded with ctypes and told where to write (gdtrace_attach, before llama.cpp's first CUDA call;
CUPTI allows one subscriber per process, taken at the first attach); its callbacks run in C on llama.cpp's
thread and append one JSON line per graph call to that file. `drain()` reads what was written since the last
drain and hands the graph calls to the sink in the watch format (raw.py), merged in time order with llama.cpp's
log lines (held until then): the driver drains before each decode_begin and decode_end, so every call lands
inside the decode that made it, as the Python watcher's live events did. Synchronisations, which the library
also records, are not part of a `graphdiag llama` stream and are dropped. Both clocks are CLOCK_MONOTONIC
(gdtrace's now_ns, Python's perf_counter_ns).
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import WatchError
from ..trace.build import API_ENV            # what the library's start reads (gdtrace.c, start)
from .raw import API_FUNCTIONS
from .watch import LogTap

# what a graphdiag llama api line keeps of a gdtrace line (the rest: pid, tid, device, stream, memory, ...)
_KEEP = ("fn", "t0_ns", "t1_ns", "ret", "graph", "exec", "update_result", "nodes", "kernel_nodes",
         "error_node_index", "error_node_kernel", "error_from_kernel")


def api_line(ln: dict, kernel_names: bool) -> dict | None:
    """A gdtrace api line as a graphdiag llama api line; None for a call the llama stream does not carry."""
    if ln.get("ev") != "api" or ln.get("fn") not in API_FUNCTIONS:
        return None
    out = {"ev": "api", **{k: ln[k] for k in _KEEP if k in ln}}
    if "error_node" in ln:
        out["error_node"] = bool(ln["error_node"])
    if kernel_names and "kernel_names" in ln:
        out["kernel_names"] = ln["kernel_names"]
    return out


def preload_interposer(cache_dir: Path | None) -> Path | None:
    """GRAPHDIAG_WATCHER=interpose: the interposing build (GD_INTERPOSE) loaded into this process's global scope
    before llama_cpp loads libllama, so that libggml-cuda's calls of the CUDA runtime's graph and sync functions
    bind to its definitions (the global scope is searched before a library's own dependencies) and reach
    libcudart through it, with no CUPTI subscriber. None where llama_cpp is loaded already (its calls may be
    bound to libcudart by now and would pass unseen) or the library cannot be built: the CUPTI watcher then."""
    import sys

    from ..errors import TraceError
    from ..trace import build
    if "llama_cpp" in sys.modules:
        return None
    try:
        path = build.library(cache_dir, {API_ENV: "interpose"})
    except TraceError:
        return None
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    return path


class InjectedWatch:
    """watch.py's Watch over the injection library: attach_log, start, drain, stop, own_ns. `interpose`: the
    library was loaded by preload_interposer; its start interposes where it can (`reads` says how the calls
    were read once started: "interpose", or CUPTI's library where the runtime's symbols were not its own)."""

    def __init__(self, sink: Callable[[dict], None], library: Path, kernel_names: bool = False,
                 interpose: bool = False):
        self.sink, self.kernel_names, self.interpose = sink, kernel_names, interpose
        self.reads: str | None = None
        self._so = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL if interpose else ctypes.DEFAULT_MODE)
        self._so.gdtrace_attach.argtypes, self._so.gdtrace_attach.restype = [ctypes.c_char_p], ctypes.c_int
        self._so.gdtrace_own_ns.restype = ctypes.c_int64
        self._so.gdtrace_detach.restype = None
        self._so.gdtrace_flush.restype = None
        self._path, self._f, self._rest, self._early = None, None, b"", []
        self._logs: list[dict] = []
        self._log_ns, self._base_ns = 0, 0
        self._log_tap = None

    def attach_log(self, llama_cpp_module, echo: bool = False) -> None:
        self._log_tap = LogTap(llama_cpp_module, self._logs.append, self._spent, echo)

    def _spent(self, ns: int) -> None:
        self._log_ns += ns

    @property
    def own_ns(self) -> int:
        """ns spent in the library's callbacks (since start) and in the log callback."""
        return self._so.gdtrace_own_ns() - self._base_ns + self._log_ns

    def start(self) -> None:
        fd, path = tempfile.mkstemp(prefix="graphdiag-watch-", suffix=".raw.jsonl")
        os.close(fd)
        self._path = Path(path)
        self._base_ns = self._so.gdtrace_own_ns()
        before = os.environ.get(API_ENV)
        if self.interpose:                    # read once, by the library's start at the first attach
            os.environ[API_ENV] = "interpose"
        try:
            rc = self._so.gdtrace_attach(str(self._path).encode())
        finally:
            if before is None:
                os.environ.pop(API_ENV, None)
            else:
                os.environ[API_ENV] = before
        if rc == -2:
            raise WatchError("this process is already traced (graphdiag trace set CUDA_INJECTION64_PATH): "
                             "graphdiag llama's watcher cannot subscribe beside it")
        if rc == -1:
            raise WatchError(f"graphdiag llama's watch file {self._path} could not be opened")
        self._f = open(self._path, "rb")
        if rc != 1:
            errors = [ln.get("text", "") for ln in self._read() if ln.get("ev") == "error"]
            self.stop()
            raise WatchError(f"graphdiag's injection library did not start: {'; '.join(errors) or 'no reason'}")
        self._early = self._read()            # its start line (how the calls are read), before any graph call
        self.reads = next((ln.get("text") for ln in self._early if ln.get("ev") == "start"), None)

    def _read(self) -> list[dict]:
        self._so.gdtrace_flush()              # the library buffers its per-token lines
        data = self._rest + (self._f.read() if self._f else b"")
        *lines, self._rest = data.split(b"\n")
        return [json.loads(x) for x in lines if x.strip()]

    def drain(self) -> None:
        """Hand what was written since the last drain to the sink: graph calls and log lines, in time order."""
        lines, self._early = self._early + self._read(), []
        calls = [a for a in (api_line(ln, self.kernel_names) for ln in lines) if a is not None]
        n = len(self._logs)                   # lines the log callback appends meanwhile wait for the next drain
        logs = self._logs[:n]
        del self._logs[:n]
        for ev in sorted(calls + logs, key=lambda e: e.get("t0_ns", e.get("t_ns", 0))):
            self.sink(ev)

    def stop(self) -> None:
        if self._f is None:
            return
        self.drain()
        self._so.gdtrace_detach()
        self._f.close()
        self._f = None
        self._path.unlink(missing_ok=True)

"""The raw stream of a watched llama.cpp run: what `graphdiag llama` records before conversion.

JSON lines (UTF-8): a header `{"raw": "llama-watch", "version": 1, "model": PATH, ...}`, then in time order
`decode_begin` / `api` / `log` / `decode_end` per llama_decode (an `idle` line where the plan slept before
one), a `watcher` line (how the graph calls are read, once the watcher started), a `perf` line
(llama_perf_context) and an `end` line. decode_end carries the greedy tokens as `tokens`
(a list, one per output) or `argmax` (one token). `api` lines are the CUDA runtime graph calls CUPTI's callbacks saw (ids are CUPTI graph and
graph-exec ids, small integers), `log` lines what llama.cpp's log callback got. The watcher (watch.py)
writes api and log lines, the driver the rest. `read_raw` checks every line it uses and turns any defect
into one EventFileError line naming the file and line.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable

from ..errors import EventFileError
from ..rawstream import read_lines, require_fields

RAW_NAME = "llama-watch"
RAW_VERSION = 1

API_FUNCTIONS = ("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
                 "cudaGraphExecUpdate", "cudaGraphLaunch", "cudaGraphExecDestroy")

# the fields each line must carry (optional ones are read with .get)
_REQUIRED = {
    "decode_begin": ("step", "n_tokens"),
    "decode_end": ("step", "ret", "host_ns"),
    "api": ("fn",),
    "log": ("text",),
    "perf": (),
    "idle": (),                    # the driver slept this many seconds ("s") before the next decode
    "watcher": ("kind",),          # how the graph calls were read (driver.LeadWatcher.kind), once it started
    "end": ("status",),
}
_API_REQUIRED = {"cudaStreamEndCapture": ("graph",), "cudaGraphInstantiate": ("exec",),
                 "cudaGraphExecUpdate": ("exec", "update_result"), "cudaGraphLaunch": ("exec",),
                 "cudaGraphExecDestroy": ("exec",)}


def read_raw(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, lines) of a raw stream. Raises EventFileError (one line) on anything malformed."""
    header, rows = read_lines(path, RAW_NAME, RAW_VERSION)
    return header, [_checked(Path(path), n, obj) for n, obj in rows]


def _checked(path: Path, n: int, obj) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("ev") not in _REQUIRED:
        ev = obj.get("ev") if isinstance(obj, dict) else None
        raise EventFileError(f"{path}:{n}: unknown raw line {ev!r} (known: {', '.join(_REQUIRED)})")
    need = _REQUIRED[obj["ev"]]
    if obj["ev"] == "api":
        if obj.get("fn") not in API_FUNCTIONS:
            raise EventFileError(f"{path}:{n}: api line for {obj.get('fn')!r}, not one of the watched graph "
                                 f"calls ({', '.join(API_FUNCTIONS)})")
        need = _API_REQUIRED.get(obj["fn"], ())
    return require_fields(path, n, obj, need)


class RawWriter:
    """Writes a raw stream as it happens: `emit(obj)` from any thread (CUPTI callbacks and llama.cpp's log
    callback come from the threads that make the calls), one line per object, flushed at decode_end so a
    killed run's stream stops at a decode boundary."""

    def __init__(self, path: str | Path, header: dict[str, Any]):
        from ..report.record.write import open_output
        self.path = Path(path)
        self._f = open_output(self.path, "the raw llama-watch stream")
        self._lock = threading.Lock()
        self.emit({"raw": RAW_NAME, "version": RAW_VERSION, **header})

    def emit(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self._lock:
            if self._f is None:
                return
            self._f.write(line)
            if obj.get("ev") in ("decode_end", "end") or "raw" in obj:
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            f, self._f = self._f, None
        if f is not None:
            f.close()


Emit = Callable[[dict[str, Any]], None]

"""The raw stream of `graphdiag trace`: what gdtrace.c and the stderr reader write before conversion.

JSON lines (UTF-8). The first line is graphdiag's header `{"raw": "graphdiag-trace", "version": 1, "cmd":
[...], ...}`; then, appended as they happen by every traced process (O_APPEND, whole lines; gdtrace.c buffers
its per-token lines up to 20 ms):
  {"ev": "start", "pid", "t0_ns", "text": libcupti}          the library subscribed in a process
  {"ev": "error", "pid", "t0_ns", "text"}                    it could not (no CUPTI, another subscriber)
  {"ev": "api", "fn", "api": "runtime"|"driver", "pid", "tid", "device", "t0_ns", "t1_ns", "ret", + per call:
     stream, graph, exec (CUPTI ids), nodes, kernel_nodes, kernel_names (a capture's kernels in
     cuGraphGetNodes order), update_result, error_node (bool), error_node_index (in the new graph's
     cuGraphGetNodes order), error_node_kernel_index (among its kernel nodes), error_node_kernel,
     error_from_kernel, mem_free_before / mem_free_after (cuMemGetInfo around an instantiate)}
  {"ev": "batch", "pid", "tid", "ctx", "t0_ns", "t1_ns", "ret", "n_tokens", "tokens" | "embd": true, "pos",
     "seq", "out"}                                           one llama_decode call (interposed; arrays null where
                                                             the caller passed NULL; out: the rows with logits)
  {"ev": "log", "t_ns", "text"}                              a graph line of CMD's stderr (as graphdiag read it)
  {"ev": "own", "pid", "t_ns", "own_ns"}                     the library's own time in that process's CUDA
                                                             calls (its callbacks and writes), at its exit
  {"ev": "end", "t_ns", "status", "code"}                    how CMD ended (graphdiag writes it last)
`fn` is the runtime name for both APIs (cuGraphLaunch is "cudaGraphLaunch"), except "cuCtxSynchronize".
Times are CLOCK_MONOTONIC ns in every writer. `read_raw` turns any defect into one EventFileError line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import EventFileError
from ..rawstream import read_lines, require_fields

RAW_NAME = "graphdiag-trace"
RAW_VERSION = 1
API_FUNCTIONS = ("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate", "cudaGraphExecUpdate",
                 "cudaGraphLaunch", "cudaGraphExecDestroy", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                 "cuCtxSynchronize")
_REQUIRED = {"start": ("pid",), "error": ("pid", "text"), "api": ("fn", "pid", "t0_ns", "t1_ns", "ret"),
             "log": ("t_ns", "text"), "end": ("status",), "own": ("pid", "own_ns"),
             "batch": ("pid", "t0_ns", "t1_ns", "ret", "n_tokens")}
_API_REQUIRED = {"cudaStreamEndCapture": ("stream",), "cudaGraphExecUpdate": ("exec",),
                 "cudaGraphLaunch": ("exec", "stream"), "cudaGraphExecDestroy": ("exec",),
                 "cudaStreamSynchronize": ("stream",)}


def read_raw(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, lines) of a trace stream (EventFileError, one line, on anything malformed)."""
    header, rows = read_lines(path, RAW_NAME, RAW_VERSION)
    return header, [_checked(Path(path), n, obj) for n, obj in rows]


def _checked(path: Path, n: int, obj) -> dict[str, Any]:
    ev = obj.get("ev") if isinstance(obj, dict) else None
    if ev not in _REQUIRED:
        raise EventFileError(f"{path}:{n}: unknown trace line {ev!r} (known: {', '.join(_REQUIRED)})")
    need = _REQUIRED[ev]
    if ev == "api":
        if obj.get("fn") not in API_FUNCTIONS:
            raise EventFileError(f"{path}:{n}: api line for {obj.get('fn')!r}, not a traced call")
        need = need + _API_REQUIRED.get(obj["fn"], ())
    require_fields(path, n, obj, need)
    if ev == "batch":
        _check_batch(path, n, obj)
    return obj


def _ints(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _check_batch(path: Path, n: int, obj: dict[str, Any]) -> None:
    """A batch line's arrays: tokens (unless embd), pos and out as integer lists or null, seq a list of them;
    n_tokens -1 (a batch the library could not mirror) with every array null."""
    k = obj["n_tokens"]
    if k == -1 and all(obj.get(f) is None for f in ("tokens", "pos", "seq", "out")):
        return
    checks = [("pos", obj.get("pos") is None or (_ints(obj["pos"]) and len(obj["pos"]) == k)),
              ("seq", obj.get("seq") is None or (isinstance(obj["seq"], list) and len(obj["seq"]) == k
                                                 and all(map(_ints, obj["seq"])))),
              ("out", obj.get("out") is None or _ints(obj["out"])),
              ("tokens", obj.get("embd") is True or (_ints(obj.get("tokens")) and len(obj["tokens"]) == k))]
    for field, ok in checks:
        if not ok or field not in obj and field != "tokens":
            raise EventFileError(f"{path}:{n}: batch line without a valid {field} "
                                 f"({json.dumps(obj.get(field))[:40]})")

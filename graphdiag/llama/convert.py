"""A raw llama-watch stream -> a graphdiag record of the same schema as `graphdiag run --events`.

Per llama_decode one step: StepStarted, then per graph compute (units.py) its evictions, uid hit, warmup
transition, phase, and for a capture the captured graph (its node count), the first instantiate, the
update or the refusal (with CUDA's result name) and the re-instantiate; StepFinished with the host and GPU
time llama_decode took. Everything comes from a call CUPTI saw or a line llama.cpp logged; what neither
shows (NOT_OBSERVABLE) is absent from the record and named in its header, never guessed.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from .. import events as E
from ..backends.drivers.base import UpdateResult
from ..errors import EventFileError
from ..plan import N_UBATCH, n_ubatches
from ..report.record.header import RunHeader
from .raw import read_raw
from .units import Grouper, Unit

SOURCE = "llama.cpp"

# what a graphdiag record has that watching llama.cpp cannot give (each named in the report)
NOT_OBSERVABLE = (
    "graph key (the first node's address)", "which node and field changed (the ledger)",
    "chunk boundaries (upstream captures each split as one graph)", "fusions", "split layout",
    "the graph entry of an eager compute", "eager computes that log nothing (one per decode assumed only "
    "when nothing was launched)", "context graph reuse per step (llama_perf_context's total only)",
    "n_kv per step", "device activity per kernel", "eager compute times (the decode's host time only)",
    "device memory per executable", "key thrash (it needs the keys and graph digests)",
)


def convert_raw(path: str | Path) -> tuple[RunHeader, list[E.Event]]:
    """Read a raw stream and convert it (EventFileError on a malformed stream)."""
    raw_header, lines = read_raw(path)
    return convert(raw_header, lines, source=str(path))


def convert(raw_header: dict[str, Any], lines: list[dict[str, Any]], source: str = "") -> tuple[RunHeader, list[E.Event]]:
    """(header, events) of the converted record."""
    decodes, perf, end = _split(lines, source)
    watcher = next((ln.get("kind") for ln in lines if ln.get("ev") == "watcher"), None)
    env = raw_header.get("env") or {}
    disabled = "GGML_CUDA_DISABLE_GRAPHS" in env       # ggml checks presence (getenv != nullptr)
    grouper, events = Grouper(), []
    for begin, body, finish in decodes:
        events += _step(begin, grouper.decode(body), finish, disabled)
    steps_done = sum(1 for _, _, f in decodes if f is not None and f.get("ret", 0) == 0)
    status, reason = _status(end)
    last = max((b["step"] for b, _, _ in decodes), default=-1)
    events.append(E.RunEnded(step=last + 1, t_ns=_t(end or {}), status=status, steps_done=steps_done,
                             reason=reason))
    return _header(raw_header, perf, source, len(decodes), watcher), events


def _split(lines: list[dict[str, Any]], source: str):
    """(decode_begin, the lines until its decode_end, decode_end or None) per decode; perf; end."""
    decodes, perf, end, open_ = [], {}, None, None
    for ln in lines:
        ev = ln["ev"]
        if ev == "decode_begin":
            if open_ is not None:
                decodes.append((*open_, None))
            if decodes and ln["step"] <= decodes[-1][0]["step"]:
                raise EventFileError(f"{source}: decode step {ln['step']} after step {decodes[-1][0]['step']}")
            open_ = (ln, [])
        elif ev == "decode_end":
            if open_ is None or ln["step"] != open_[0]["step"]:
                raise EventFileError(f"{source}: decode_end of step {ln['step']} without its decode_begin")
            decodes.append((*open_, ln))
            open_ = None
        elif ev in ("api", "log"):
            if open_ is not None:             # calls outside a decode: loading or freeing, not decisions
                open_[1].append(ln)
        elif ev == "perf":
            perf = {k: v for k, v in ln.items() if k != "ev"}
        elif ev == "end":
            end = ln
    if open_ is not None:
        decodes.append((*open_, None))
    return decodes, perf, end


def _status(end: dict[str, Any] | None) -> tuple[str, str]:
    if end is None:
        return "failed", "the raw stream has no end line (llama.cpp was cut short?)"
    s = end["status"]
    if s == "complete":
        return "complete", ""
    if s.startswith("interrupted"):
        return "interrupted", s.partition(":")[2].strip()
    return "failed", s.partition(":")[2].strip() or s


def _t(ln: dict[str, Any]) -> int:
    return int(ln.get("t_ns", ln.get("t0_ns", 0)) or 0)


def _step(begin: dict[str, Any], units: list[Unit], finish: dict[str, Any] | None, disabled: bool) -> list[E.Event]:
    step = begin["step"]
    n_tok = begin["n_tokens"]
    phase = begin.get("phase") or ("decode" if begin.get("n_outputs", n_tok) == n_tok and
                                   begin.get("n_seqs", 1) == n_tok else "prefill")
    out: list[E.Event] = [E.StepStarted(step=step, t_ns=_t(begin), phase=phase, n_tokens=n_tok,
                                        n_seqs=begin.get("n_seqs", 1), n_kv=0)]
    for u in units:
        u.t_ns = u.t_ns or _t(begin)           # a compute nothing marked: at the decode's start
        out += _unit(step, u, disabled)
    if finish is None:
        out.append(E.StepFailed(step=step, t_ns=_t(begin), error="llama_decode did not return (the stream "
                                "ends inside it)", status=-3, phase=phase))
        return out
    if finish["ret"] != 0:
        out.append(E.StepFailed(step=step, t_ns=_t(finish), error=f"llama_decode returned {finish['ret']}",
                                status=finish["ret"], recoverable=finish["ret"] > 0, phase=phase))
        return out
    modes = {u.phase for u in units}
    mode = next(m for m in ("eager", "capture", "replay") if m in modes)
    out.append(E.StepFinished(step=step, t_ns=_t(finish) or _t(begin) + finish["host_ns"],
                              duration_ns=finish["host_ns"], gpu_ns=finish.get("gpu_ns") or 0,
                              tokens=_tokens(finish), mode=mode))
    return out


def _tokens(finish: dict[str, Any]) -> tuple:
    toks = finish.get("tokens")
    if toks is None and isinstance(finish.get("argmax"), int):
        toks = [finish["argmax"]]
    return tuple(toks or ())


def _unit(step: int, u: Unit, disabled: bool) -> list[E.Event]:
    """The events of one graph compute; its split is 0 (the split index is not observable)."""
    key, t = u.entry, u.t_ns
    ev = lambda cls, **kw: cls(step=step, split=0, key=key, uid=u.uid, t_ns=t, **kw)
    out = []
    for e in u.evicted:
        out.append(E.Evicted(step=step, split=0, key=e, t_ns=t, n_chunks=1))
    if u.uid:
        out.append(ev(E.UidHit))
    if u.warmup == "complete":
        out.append(ev(E.WarmupTransition, from_state="cold", to_state="warm",
                      why="warmup complete (llama.cpp's log)"))
    elif u.warmup == "reset":
        out.append(ev(E.WarmupTransition, from_state="warm", to_state="cold",
                      why="warmup reset: properties changed (llama.cpp's log; which ones is not observable)"))
    if u.phase == "eager" and disabled:
        out += [ev(E.GraphsDisabled, reason="env GGML_CUDA_DISABLE_GRAPHS"),
                ev(E.PhaseDecided, phase="disabled", why="env GGML_CUDA_DISABLE_GRAPHS")]
    else:
        out.append(ev(E.PhaseDecided, phase=u.phase, why=_why(u)))
    if u.phase == "eager":
        return out + [ev(E.EagerRun)]
    if u.phase == "replay":
        return out + [ev(E.ReplayLaunched, n_chunks=1, duration_ns=u.launch_ns)]
    return out + _capture(u, ev)


def _why(u: Unit) -> str:
    if u.phase == "replay":
        return "observed: graph launched without a capture"
    if u.phase == "capture":
        return "observed: stream captured" + (" (warmup complete)" if u.warmup == "complete" else "")
    if u.warmup == "reset":
        return "observed: warmup reset (llama.cpp's log)"
    return "observed: nothing launched during this decode" if not u.seen else "observed: no launch"


def _capture(u: Unit, ev) -> list[E.Event]:
    c = u.capture
    out = [ev(E.ChunkCaptured, chunk=0, n_graph_nodes=c.nodes, capture_ns=c.capture_ns)]
    if c.instantiate_ns is not None:
        out.append(ev(E.ChunkInstantiated, chunk=0, duration_ns=c.instantiate_ns))
    if c.update_result == 0:
        out.append(ev(E.ChunkUpdated, chunk=0, duration_ns=c.update_ns))
    elif c.update_result is not None:
        out.append(ev(E.UpdateRefused, chunk=0, reason=_result_name(c.update_result),
                      error_node="(a node; CUPTI does not name it)" if c.error_node else "",
                      duration_ns=c.update_ns))
        out.append(ev(E.ChunkInstantiated, chunk=0, duration_ns=c.reinstantiate_ns or 0, after_refusal=True))
    out.append(ev(E.CaptureRun, n_chunks=1, n_launches=c.kernel_nodes,
                  duration_ns=c.capture_ns + (c.instantiate_ns or 0) + c.update_ns + u.launch_ns))
    return out


def _result_name(code: int) -> str:
    try:
        return UpdateResult(code).name
    except ValueError:
        return f"RESULT_{code}"


def _count(raw: dict[str, Any], name: str) -> int | None:
    v = raw.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _steps(raw: dict[str, Any], batch: int, n_decodes: int) -> int:
    """The run's steps after its prompts, as graphdiag run's header counts them: the raw header's `steps`
    (the plan's), else the decodes past the prompts, each prompt as many decodes as it has ubatches (the
    driver decodes a ubatch at a time; plan.py's numbering); one a prompt where the stream gave no length."""
    if _count(raw, "steps") is not None:
        return raw["steps"]
    prompt, n_ubatch = _count(raw, "prompt_tokens"), _count(raw, "n_ubatch") or N_UBATCH
    return max(n_decodes - batch * (n_ubatches(prompt, n_ubatch) if prompt else 1), 0)


def _header(raw: dict[str, Any], perf: dict[str, Any], source: str, n_steps: int,
            watcher: str | None = None) -> RunHeader:
    batch = _count(raw, "batch") or 1             # the plan's first steps prefill each of `batch` sequences
    plan = raw.get("plan")
    settings = {"model": raw.get("model", ""), "steps": _steps(raw, batch, n_steps), "batch": batch,
                "prompt_tokens": raw.get("prompt_tokens"), "n_ctx": raw.get("n_ctx"),
                "n_batch": raw.get("n_batch"), "ubatch_size": raw.get("n_ubatch"),    # graphdiag run's name
                "flash_attn": raw.get("flash_attn"), "chunk_size": 0,
                "graphs_disabled": "GGML_CUDA_DISABLE_GRAPHS" in (raw.get("env") or {}),
                "reuse_disabled": "LLAMA_GRAPH_REUSE_DISABLE" in (raw.get("env") or {})}
    llama = {"llama_cpp": raw.get("llama_cpp", ""), "raw": source, "plan": plan if isinstance(plan, str) else "", "env": raw.get("env") or {},
             "perf": perf, "cc": raw.get("cc"), "model_sha256": raw.get("model_sha256", ""),
             "not_observable": list(NOT_OBSERVABLE)} | ({"watcher": watcher} if watcher else {})
    how = ("by interposing its CUDA runtime calls" if watcher and watcher.endswith("interposing")
           else "through CUPTI callbacks")
    return RunHeader(backend="cuda", device=raw.get("device", ""), simulated=False,
                     model=str(raw.get("model", "")), settings=settings, scenario=raw.get("scenario"),
                     note=f"real {SOURCE} {raw.get('llama_cpp', '')} watched {how} and its log",
                     started=raw.get("started") or datetime.datetime.now().isoformat(timespec="seconds"),
                     llama=llama)


def is_llama_record(header: RunHeader) -> bool:
    """Whether a record was converted from a watched llama.cpp run."""
    return bool(header.llama)

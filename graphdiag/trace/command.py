"""`graphdiag trace -- CMD`'s body: check CMD, build the library, run CMD under it, convert and report.

CMD runs in its own process group (so Ctrl-C reaches it once, forwarded by graphdiag; where graphdiag owns the
terminal, CMD's group gets the foreground while it runs). Its stdout is CMD's own; its stderr passes through
graphdiag, which records llama.cpp's graph lines from it. graphdiag exits with CMD's code (128 + signal if
it died), or 1 when CMD succeeded and --strict found something. Bad input (CMD not found, not executable; no
compiler, headers, CUPTI, driver or GPU; CUPTI refused in CMD) is one line and exit 2, and nothing is written.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..errors import TraceError, UsageError
from .build import API_ENV
from .raw import RAW_NAME, RAW_VERSION

# llama.cpp's graph lines, and each context's size (a replay's KV cells)
GRAPH_LINES = ("CUDA Graph id", "CUDA graph", "disabling CUDA graphs", "llama_context: n_ctx ")


def resolve_cmd(cmd: list[str]) -> str:
    """CMD's executable (TraceError: not found, not executable)."""
    if not cmd:
        raise UsageError("give the command to trace after --: graphdiag trace -- CMD [ARGS...]")
    exe = cmd[0]
    if os.sep in exe:
        if not os.path.exists(exe):
            raise TraceError(f"{exe}: no such file")
        if os.path.isdir(exe) or not os.access(exe, os.X_OK):
            raise TraceError(f"{exe}: not executable")
        return exe
    found = shutil.which(exe)
    if found is None:
        raise TraceError(f"{exe}: command not found")
    return found


API_VALUES = ("auto", "cupti", "interpose", "driver", "none", "off")   # the last three: bench trace's knobs


def shared_cudart_major(exe: str) -> int | None:
    """The major version of the shared libcudart exe (or a library it needs) loads, from ldd's listing (None: none,
    or ldd absent or failing)."""
    try:
        out = subprocess.run(["ldd", exe], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"libcudart\.so\.(\d+)", out)
    return int(m.group(1)) if m else None


def trace_environ(cmd: list[str], api: str | None, environ=None) -> dict[str, str]:
    """The environment CMD is traced in, its GRAPHDIAG_TRACE_API settled: `interpose` (the runtime's graph and sync
    calls read through libcudart's symbols, no CUPTI: gdtrace.c, GD_INTERPOSE), `cupti` (CUPTI callbacks on the
    runtime and driver API), or `auto`: interpose where CMD's executable links a shared libcudart of CUDA 12 or
    later (llama.cpp's programs; the interposers take CUDA 12's signatures), else CUPTI (a Python program's
    runtime is found only once it runs). None (no --api): the value the user set (interpose, cupti, or the
    measurement knobs driver, none, off), else auto."""
    env = dict(os.environ if environ is None else environ)
    if api is None:
        api = env.get(API_ENV) or "auto"
        if api not in API_VALUES:
            raise TraceError(f"{API_ENV}={api}: expected one of {', '.join(API_VALUES)}")
        if api not in ("auto", "cupti", "interpose"):
            return env                  # a measurement knob, read by the library itself
    if api == "auto":
        major = shared_cudart_major(resolve_cmd(cmd))
        api = "interpose" if major is not None and major >= 12 else "cupti"
    if api == "interpose":
        env[API_ENV] = "interpose"
    else:
        env.pop(API_ENV, None)
    return env


def check_device() -> None:
    """A CUDA driver and at least one GPU (TraceError otherwise)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise TraceError("no CUDA driver (libcuda.so.1 not found): graphdiag trace needs an NVIDIA GPU") from None
    n = ctypes.c_int(0)
    rc = cuda.cuInit(0)
    if rc != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
        raise TraceError(f"no usable GPU (cuInit returned {rc}, {n.value} devices): graphdiag trace needs one")


def preload(library: str, existing: str | None) -> str:
    """LD_PRELOAD for CMD: the library first (it interposes llama_decode in programs linked against libllama;
    its CUPTI side starts only when the driver calls InitializeInjection), then what the user preloads."""
    return " ".join([library, *(existing or "").split()]) if existing else library


def run_traced(cmd: list[str], raw_path: Path, library: Path, cupti: Path, echo=None, stdout=None,
               environ=None) -> int:
    """Run CMD under the library, its raw stream in raw_path; returns CMD's exit code (128 + signal). CMD's
    stdout is graphdiag's unless `stdout` (a file) is given; its stderr goes to `echo` (default graphdiag's).
    `environ`: CMD's environment before the library's variables (default graphdiag's: see trace_environ)."""
    environ = os.environ if environ is None else environ
    exe = resolve_cmd(cmd)
    fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        _line(fd, {"raw": RAW_NAME, "version": RAW_VERSION, "cmd": cmd, "library": str(library),
                   "cupti": str(cupti), "started": datetime.datetime.now().isoformat(timespec="seconds")})
        env = dict(environ, CUDA_INJECTION64_PATH=str(library), GRAPHDIAG_TRACE_OUT=str(raw_path),
                   GRAPHDIAG_CUPTI_PATH=str(cupti))
        if Path(library).is_file():
            env["LD_PRELOAD"] = preload(str(library), environ.get("LD_PRELOAD"))
        proc = subprocess.Popen([exe, *cmd[1:]], env=env, stdout=stdout, stderr=subprocess.PIPE, process_group=0)
        reader = threading.Thread(target=_pass_stderr, args=(proc.stderr, fd, echo or sys.stderr.buffer),
                                  daemon=True)
        reader.start()
        code, status = _wait(proc)
        reader.join(timeout=5)
        _line(fd, {"ev": "end", "t_ns": time.monotonic_ns(), "status": status, "code": code})
    finally:
        os.close(fd)
    return code


def _line(fd: int, obj: dict) -> None:
    os.write(fd, (json.dumps(obj, separators=(",", ":")) + "\n").encode())


def _pass_stderr(pipe, fd: int, echo) -> None:
    """CMD's stderr, line by line: passed through, and llama.cpp's graph lines recorded (as read)."""
    for raw in iter(pipe.readline, b""):
        t = time.monotonic_ns()
        try:
            echo.write(raw)
            echo.flush()
        except (OSError, ValueError):
            pass
        text = raw.decode("utf-8", "replace").rstrip("\n")
        if any(m in text for m in GRAPH_LINES):
            _line(fd, {"ev": "log", "t_ns": t, "text": text})


def _wait(proc: subprocess.Popen) -> tuple[int, str]:
    """Wait for CMD, forwarding Ctrl-C and SIGTERM to its process group; (exit code, how it ended)."""
    got: list[int] = []

    def forward(sig, _frame):
        got.append(sig)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    tty = _give_terminal(proc.pid)
    try:
        rc = proc.wait()
    finally:
        _give_terminal(os.getpgrp(), tty)
        for s, h in old.items():
            signal.signal(s, h)
    if rc < 0:
        name = signal.Signals(-rc).name
        kind = "interrupted" if -rc in (signal.SIGINT, signal.SIGTERM) else "failed"
        return 128 - rc, f"{kind}: CMD died of {name}"
    if got:
        return rc, f"interrupted: {signal.Signals(got[0]).name} forwarded, CMD exited with {rc}"
    return rc, "complete" if rc == 0 else f"failed: CMD exited with {rc}"


def _give_terminal(pgid: int, fd: int | None = None) -> int | None:
    """Make pgid the terminal's foreground group where graphdiag holds the terminal (the fd used, or None)."""
    try:
        fd = sys.stdin.fileno() if fd is None else fd
        if not os.isatty(fd) or os.tcgetpgrp(fd) not in (os.getpgrp(), pgid):
            return None
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, old)
        return fd
    except (OSError, ValueError, AttributeError):
        return None


def trace_cli(cmd: list[str], events_path=None, raw_path=None, timeline_path=None, strict=False, verbosity=0,
              out=None, api=None) -> int:
    """The whole command: checks, build, run, convert, write, report. Returns graphdiag's exit code."""
    from ..config import kernel_cache_dir
    from ..llama.command import _render
    from ..llama.run import LlamaResult
    from . import build
    from .convert import convert_raw

    resolve_cmd(cmd)
    check_outputs(events_path, timeline_path, raw_path)
    environ = trace_environ(cmd, api)
    library, cupti = build.library(kernel_cache_dir(), environ), build.cupti_library(environ)
    check_device()
    raw = Path(raw_path) if raw_path else Path(tempfile.mkstemp(prefix="graphdiag-trace-", suffix=".raw.jsonl")[1])
    code = run_traced(cmd, raw, library, cupti, environ=environ)
    header, events = convert_raw(raw)
    if header.trace.get("errors"):
        raise TraceError(f"the trace of {cmd[0]} failed: {header.trace['errors'][0]} (raw stream: {raw})")
    if not header.trace.get("pids") and not header.trace.get("decode_batches"):
        raise TraceError(f"{cmd[0]} never initialised CUDA (the driver never loaded graphdiag's library); "
                         f"nothing to trace (raw stream: {raw})")
    res = LlamaResult(raw, header, events)
    write_outputs(res, events_path, timeline_path)
    rc = _render(res, None, strict, False, verbosity, out or sys.stdout)
    return code if code != 0 else rc


def write_outputs(res, events_path, timeline_path) -> None:
    """The record (--events) and the trace-event timeline (--timeline: each step a slice)."""
    from .. import events as E
    from ..report.record.write import JsonlWriter
    from ..report.sinks.timeline import TimelineWriter
    if events_path:
        with JsonlWriter(events_path, res.header) as w:
            for ev in res.events:
                w(ev)
    if timeline_path:
        tw = TimelineWriter(timeline_path, simulated=False)
        tw.start(res.header.to_dict())
        started = {}
        for ev in res.events:
            if isinstance(ev, E.StepStarted):
                started[ev.step] = ev
                tw(E.SpanBegin(step=ev.step, t_ns=ev.t_ns, name="graph step", category="trace/step", payload=ev.step))
            tw(ev)
            if isinstance(ev, E.StepFinished) and ev.step in started:
                tw(E.SpanEnd(step=ev.step, t_ns=max(ev.t_ns, started.pop(ev.step).t_ns), name="graph step",
                             category="trace/step"))
        tw.close()


def check_outputs(events_path, timeline_path, raw_path) -> None:
    """Each output names its own file and takes bytes (UsageError, EventWriteError: one line), shown before
    anything is built or run and without touching the file: the raw stream is opened when CMD starts, the
    record and the timeline once the trace is converted, so a trace refused or failed before then leaves an
    existing file as it was and creates none."""
    from ..report.record.write import probe_output
    named = [(p, flag) for p, flag in ((events_path, "--events"), (timeline_path, "--timeline"),
                                       (raw_path, "--raw")) if p]
    for i, (p, flag) in enumerate(named):
        for q, other in named[:i]:
            if _same_file(p, q):
                raise UsageError(f"{other} and {flag} name the same file ({p}): give each its own")
    for p, what in ((events_path, "the event record"), (timeline_path, "the timeline"),
                    (raw_path, "the raw trace stream")):
        if p:
            probe_output(Path(p), what)


def _same_file(a: str, b: str) -> bool:
    """Two paths naming one file (by path, link or hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)

"""The JSON-lines event record: a header line, then one line per decision event.

File layout (UTF-8, one JSON object per line):

    {"schema": "graphdiag-events", "version": 1, "graphdiag_version": "0.1.0", "backend": "sim", ...}
    {"kind": "step_started", "step": 0, "split": -1, "key": 0, "uid": 0, "t_ns": 1200, ...}
    ...

The header is a `RunHeader`; each following line is an event's `to_dict()` (spans are not recorded: they
exist for NVTX timelines). `read_record` turns any defect into an `EventFileError` with one clear line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .. import __version__
from .. import events as E
from ..errors import EventFileError, EventWriteError

SCHEMA_NAME = "graphdiag-events"


@dataclass
class RunHeader:
    """What a run was: the first line of a record, and the top of every report.

    backend: "cuda" | "sim" | "cpu"; device: the GPU's name or "simulated GPU (cc 9.0)";
    settings: RunConfig.settings(); sources: RunConfig.sources (setting -> "default" | "env NAME" |
    "scenario" | "cli"); started: ISO-8601 local time; scenario: the scenario's name or None."""

    backend: str = "sim"
    device: str = ""
    simulated: bool = True
    model: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    started: str = ""
    scenario: str | None = None
    note: str = ""                 # what the runner wants said, e.g. "no GPU (...); using the SIMULATED driver"
    sim_mode: str = ""             # the simulated driver's mode: "compute" | "decisions" ("": not simulated)
    sim_mode_reason: str = ""      # why, e.g. "default for model 7b", "--sim-mode", "--verify needs computed results"
    blas: dict[str, Any] = field(default_factory=dict)   # config.BlasThreads.to_dict(): numpy's BLAS threads
    model_file: dict[str, Any] = field(default_factory=dict)   # a GGUF model: path, arch, tensor types, bytes
    graphdiag_version: str = __version__
    schema: str = SCHEMA_NAME
    version: int = E.SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The header as the record's first JSON object (schema and version first)."""
        d = dataclasses.asdict(self)
        head = {"schema": d.pop("schema"), "version": d.pop("version")}
        return head | d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunHeader":
        """Build from a header object; unknown fields (from a newer writer) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def as_header(header: "RunHeader | dict[str, Any]") -> RunHeader:
    """A RunHeader from either a RunHeader or the header dict the runner builds."""
    return header if isinstance(header, RunHeader) else RunHeader.from_dict(header)


_ENCODER = json.JSONEncoder(separators=(",", ":"))   # made once: json.dumps(separators=...) builds one a call


def open_output(path: Path, what: str) -> TextIO:
    """`path` opened for writing (UTF-8) once it is shown to take bytes: a regular file gets a byte, flushed
    and truncated away (a full disk fails here), a device that is not a terminal a newline (/dev/full fails,
    /dev/null takes it); a pipe or a terminal is not probed (the probe would reach its reader). Any failure
    is an EventWriteError naming `what` and the path, raised before a run starts."""
    try:
        f = path.open("w", encoding="utf-8")
    except OSError as e:
        raise EventWriteError(f"cannot write {what} {path}: {e.strerror or e}") from None
    try:
        mode = os.fstat(f.fileno()).st_mode
        if stat.S_ISREG(mode) or (stat.S_ISCHR(mode) and not f.isatty()):
            f.write("\n")
            f.flush()
            if stat.S_ISREG(mode):
                f.seek(0)
                f.truncate()
    except OSError as e:
        try:
            f.close()
        except OSError:
            pass                          # the probe's byte cannot be written either: the error says so
        raise EventWriteError(f"cannot write {what} {path}: {e.strerror or e}") from None
    return f


_FLUSH_AFTER = (E.StepFinished, E.RunEnded)


def _closed() -> BrokenPipeError:
    """The reader of `--events -` went away. Without an errno: click turns an EPIPE OSError into exit 1,
    main() turns this one into the quiet exit 141 (as the terminal report's)."""
    return BrokenPipeError("output closed")


class JsonlWriter:
    """An event sink writing the record. Subscribe it WITHOUT spans, as essential (its errors end the
    run: the record is the user's artifact); call `close()` (or use `with`).

    The header line is written by the constructor, or later by `start(header)` (the runner's on_header
    hook) when it is not known yet; events that arrive before it are held back until then. The file is
    shown writable when opened (open_output: /dev/full or a full disk fails before the run), the header
    flushed at once, and the events flushed as each step's StepFinished (and the RunEnded) is written: a
    killed run's record stops at a step boundary (one write per step, no fsync). `stream` writes to an
    open file instead (`--events -`: stdout), which close() flushes but leaves open. Any failure to open
    or write is an EventWriteError naming the file, except a reader that went away (BrokenPipeError,
    passed on as it is: the output was closed); after either, the writer stays shut."""

    def __init__(self, path: str | Path, header: RunHeader | dict[str, Any] | None = None,
                 stream: TextIO | None = None):
        self.path = Path(path)
        self._owned = stream is None
        self._f: TextIO | None = open_output(self.path, "the event record") if stream is None else stream
        self.sink_name = f"the event record {self.path}"
        self._early: list[E.Event] | None = []
        if header is not None:
            self.start(header)

    def _error(self, e: OSError) -> EventWriteError:
        return EventWriteError(f"cannot write the event record {self.path}: {e.strerror or e}")

    def start(self, header: RunHeader | dict[str, Any]) -> None:
        """Write the header line, then any events held back."""
        self._write(as_header(header).to_dict())
        self._flush()
        early, self._early = self._early or [], None
        for ev in early:
            self(ev)

    def _write(self, obj: dict[str, Any]) -> None:
        if self._f is None:
            return
        try:
            self._f.write(_ENCODER.encode(obj) + "\n")
        except BrokenPipeError:
            self._abandon()
            raise _closed() from None
        except OSError as e:
            self._abandon()
            raise self._error(e) from None

    def _flush(self) -> None:
        if self._f is None:
            return
        try:
            self._f.flush()
        except BrokenPipeError:
            self._abandon()
            raise _closed() from None
        except OSError as e:
            self._abandon()
            raise self._error(e) from None

    def _abandon(self) -> None:
        f, self._f = self._f, None
        if not self._owned:
            return                    # stdout: main() quiets it
        try:
            f.close()
        except OSError:
            pass                      # the buffered rest cannot be written either: the error says so

    def __call__(self, ev: E.Event) -> None:
        if self._f is None or isinstance(ev, (E.SpanBegin, E.SpanEnd)):
            return
        if self._early is not None:
            self._early.append(ev)
            return
        self._write(ev.to_dict())
        if isinstance(ev, _FLUSH_AFTER):
            self._flush()                 # a step boundary: what a kill leaves ends here

    def close(self) -> None:
        """Flush and close the file (idempotent; a stream is flushed, not closed). A writer never started
        writes a header-less file, which read_record rejects: that is a bug in the caller, not a record."""
        if self._f is not None:
            self._flush()
            f, self._f = self._f, None
            if self._owned:
                f.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def write_record(path: str | Path, header: RunHeader | dict[str, Any], events: list[E.Event]) -> None:
    """Write a whole record at once (what a finished run or a test has in memory)."""
    with JsonlWriter(path, header) as w:
        for ev in events:
            w(ev)


def read_record(path: str | Path) -> tuple[RunHeader, list[E.Event]]:
    """Read a record written by `JsonlWriter`. Raises EventFileError naming the file (and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EventFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise EventFileError(f"{path}: is a directory, not an event record") from None
    except UnicodeDecodeError:
        raise EventFileError(f"{path}: not a graphdiag event record (not UTF-8 text)") from None
    except OSError as e:
        raise EventFileError(f"{path}: cannot read: {e.strerror}") from None
    if not text.strip():
        raise EventFileError(f"{path}: empty file (no header line)")
    lines = text.split("\n")
    truncated = not text.endswith("\n")
    header = _read_header(path, lines[0], truncated and len(lines) == 1)
    numbered = [(n, _read_event(path, n, line, truncated and n == len(lines)))
                for n, line in enumerate(lines[1:], start=2) if line.strip()]
    _check_steps(path, header, numbered)
    return header, [ev for _, ev in numbered]


MAX_STEP = 2**63 - 1    # where the header does not say how many steps the run had


def _check_steps(path: Path, header: RunHeader, numbered: list[tuple[int, E.Event]]) -> None:
    """Events come in step order (-1: before the first step), within the run's steps (its `batch`
    prefills and `steps` decode steps; the run's end comes at the step after the last), and the run ended
    with a status runs end with. Anything else is a damaged or edited record, whose report would be nonsense."""
    s = header.settings
    plain = all(isinstance(s.get(k), int) and not isinstance(s.get(k), bool) for k in ("batch", "steps"))
    last, at, most = -1, 0, (s["batch"] + s["steps"] if plain else MAX_STEP)
    for n, ev in numbered:
        if ev.step < -1:
            raise EventFileError(f"{path}:{n}: step {ev.step} is not a step (steps count from 0; -1: before the "
                                 f"first)")
        if ev.step > most:
            raise EventFileError(f"{path}:{n}: step {ev.step} is beyond the run's {most} steps (batch "
                                 f"{s['batch']} prefills + steps {s['steps']}, from its header)")
        if ev.step < last:
            raise EventFileError(f"{path}:{n}: step {ev.step} comes after step {last} (line {at}): the "
                                 f"record's events are out of order")
        if isinstance(ev, E.RunEnded) and ev.status not in E.RunEnded.STATUSES:
            raise EventFileError(f"{path}:{n}: run_ended with an unknown status {ev.status!r} (a run ends "
                                 f"{', '.join(E.RunEnded.STATUSES)})")
        last, at = ev.step, n


def _parse(path: Path, lineno: int, line: str, last_and_unterminated: bool) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        if last_and_unterminated:
            raise EventFileError(f"{path}:{lineno}: truncated last line (the run was cut short?)") from None
        raise EventFileError(f"{path}:{lineno}: not JSON") from None


def _read_header(path: Path, line: str, last: bool) -> RunHeader:
    obj = _parse(path, 1, line, last)
    if not isinstance(obj, dict) or "schema" not in obj:
        raise EventFileError(f"{path}: not a graphdiag event record (no schema in the first line)")
    if obj["schema"] != SCHEMA_NAME:
        raise EventFileError(f"{path}: not a graphdiag event record (schema {obj['schema']!r})")
    if obj.get("version") != E.SCHEMA_VERSION:
        raise EventFileError(f"{path}: unsupported schema version {obj.get('version')!r} "
                             f"(this graphdiag reads version {E.SCHEMA_VERSION})")
    bad = _wrong_type(RunHeader, obj)
    if bad:
        raise EventFileError(f"{path}:1: malformed header ({bad})")
    return RunHeader.from_dict(obj)


def _read_event(path: Path, lineno: int, line: str, last: bool) -> E.Event:
    obj = _parse(path, lineno, line, last)
    if not isinstance(obj, dict):
        raise EventFileError(f"{path}:{lineno}: not an event (a JSON {type(obj).__name__})")
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in E.EVENT_TYPES or kind in ("span_begin", "span_end"):
        raise EventFileError(f"{path}:{lineno}: unknown event kind {kind!r}")
    bad = _missing(E.EVENT_TYPES[kind], obj) or _wrong_type(E.EVENT_TYPES[kind], obj)
    if bad:
        raise EventFileError(f"{path}:{lineno}: malformed {kind} event ({bad})")
    try:
        return E.Event.from_dict(obj)
    except (TypeError, ValueError) as e:
        raise EventFileError(f"{path}:{lineno}: malformed {kind} event ({e})") from None


# annotation (as written in the dataclass) -> (check, what the message calls it)
_TYPES = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "tuple": (lambda v: isinstance(v, list), "an array"),
    "str | None": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "dict[str, Any]": (lambda v: isinstance(v, dict), "an object"),
    "dict[str, str]": (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
                       "an object of strings"),
}
# array fields whose items the reports use as numbers
_INT_ITEMS = {("step_finished", "tokens"), ("graph_split", "uids"), ("graph_split", "n_nodes"),
              ("property_diff", "changed"), ("concurrent_region", "branch_sizes")}


# fields a record may lack: added to their event after schema 1 was first written (an older record means
# their defaults), or written only when set (device, on several devices only)
OPTIONAL = {"device", "graph_split.devices", "property_diff.changed", "uid_miss.n_nodes",
            "uid_miss.props_digest", "uid_miss.shape_digest", "uid_miss.first_ne", "phase_decided.clock_us",
            "chunk_instantiated.mem_bytes"}


def _missing(cls, obj: dict[str, Any]) -> str:
    """'' when `obj` has every field its event type writes (OPTIONAL aside), else the first one missing."""
    for f in dataclasses.fields(cls):
        if f.name not in obj and f.name not in OPTIONAL and f"{cls.kind}.{f.name}" not in OPTIONAL:
            return f"no {f.name}"
    return ""


def _wrong_type(cls, obj: dict[str, Any]) -> str:
    """'' when every known field of `obj` has its dataclass's type, else what is wrong with the first."""
    kind = getattr(cls, "kind", "")
    for f in dataclasses.fields(cls):
        if f.name not in obj or f.type not in _TYPES:
            continue
        ok, want = _TYPES[f.type]
        v = obj[f.name]
        if not ok(v):
            return f"{f.name} must be {want}, not {json.dumps(v)[:40]}"
        if (kind, f.name) in _INT_ITEMS and not all(_TYPES["int"][0](x) for x in v):
            return f"{f.name} must be an array of integers"
        if f.type == "tuple" and kind == "ledger_captured" and not all(_ledger_row(r) for r in v):
            return f"{f.name} must be ledger rows"
    return ""


def _ledger_row(r) -> bool:
    """(index, name, op, type, ne, nb, op_params digest, flags, data, sources): the shape node_diff reads."""
    return isinstance(r, list) and len(r) == 10 and isinstance(r[0], int) and isinstance(r[9], list)

"""Reading a record back: `read_record` turns any defect (not UTF-8, no or a foreign header, an unknown
kind, a malformed or truncated line, steps out of order) into an `EventFileError` with one clear line.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ... import events as E
from ...errors import EventFileError
from ...plan import N_UBATCH, plan_length
from .header import SCHEMA_NAME, RunHeader


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


def _count(settings: dict[str, Any], name: str, default: int | None = None) -> int | None:
    v = settings.get(name, default)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default


def planned_steps(settings: dict[str, Any]) -> int:
    """The steps a record's header says its run had (plan.plan_length over its settings): each of the
    `batch` prompts as many steps as it has ubatches of `ubatch_size` tokens (llama.cpp decodes each ubatch
    as its own graph compute), then `steps` more. A header without prompt_tokens (a converted llama.cpp
    stream that did not say) counts one ubatch a prompt, one without ubatch_size llama.cpp's default 512;
    MAX_STEP where batch or steps is not a count."""
    batch, steps = _count(settings, "batch"), _count(settings, "steps")
    if batch is None or steps is None:
        return MAX_STEP
    return plan_length(batch, _count(settings, "prompt_tokens", 1) or 1,
                       _count(settings, "ubatch_size", N_UBATCH) or N_UBATCH, steps)


def _check_steps(path: Path, header: RunHeader, numbered: list[tuple[int, E.Event]]) -> None:
    """Events come in step order (-1: before the first step), within the run's steps (planned_steps: its
    prompts' ubatches and its `steps` further steps; the run's end comes at the step after the last), and
    the run ended with a status runs end with. Anything else is a damaged or edited record, whose report
    would be nonsense."""
    s = header.settings
    last, at, most = -1, 0, planned_steps(s)
    for n, ev in numbered:
        if ev.step < -1:
            raise EventFileError(f"{path}:{n}: step {ev.step} is not a step (steps count from 0; -1: before the "
                                 f"first)")
        if ev.step > most:
            prompts = most - s["steps"]
            raise EventFileError(f"{path}:{n}: step {ev.step} is beyond the run's {most} steps ({prompts} "
                                 f"prompt ubatches for batch {s['batch']} + steps {s['steps']}, from its header)")
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
    "float | None": (lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
                     "a number or null"),
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
            "chunk_instantiated.mem_bytes", "chunk_captured.cublas_extra", "oracle.noise", "oracle.values",
            "oracle.nan", "oracle.inf", "oracle.ref_nan", "oracle.ref_inf"}


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

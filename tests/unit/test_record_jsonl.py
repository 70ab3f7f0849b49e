"""The JSON-lines record: round trip, and one clear EventFileError line for every bad input."""

from __future__ import annotations

import json

import pytest

from graphdiag import events as E
from graphdiag.errors import EventFileError
from graphdiag.report.record import JsonlWriter, RunHeader, read_record, write_record
from graphdiag.report.analysis.summary import summarize
from support import synth


def test_record_round_trip_keeps_header_events_and_summary(tmp_path):
    header, events = synth.batch_change()
    path = tmp_path / "run.jsonl"
    write_record(path, header, events)
    h2, ev2 = read_record(path)
    assert h2 == header
    assert ev2 == events
    assert summarize(h2, ev2) == summarize(header, events)


def test_record_header_line_comes_first_with_schema_and_version(tmp_path):
    header, events = synth.steady_decode()
    path = tmp_path / "run.jsonl"
    write_record(path, header, events)
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first)[:2] == ["schema", "version"]
    assert first["schema"] == "graphdiag-events" and first["version"] == E.SCHEMA_VERSION
    assert first["simulated"] is True and first["device"] == "simulated GPU (cc 9.0)"


def test_record_writer_as_a_bus_sink_skips_spans(tmp_path):
    path = tmp_path / "run.jsonl"
    bus = E.EventBus(clock=iter(range(1, 100)).__next__)
    with JsonlWriter(path, RunHeader()) as writer:
        bus.subscribe(writer)
        bus.subscribe(lambda ev: None, spans=True)       # spans exist on the bus...
        with bus.span("step", "step", payload=1, step=0):
            bus.emit(E.UidHit(step=0, split=0, key=5, uid=2))
    _, events = read_record(path)
    assert [e.kind for e in events] == ["uid_hit"]         # ...but never reach the record


def test_record_header_from_dict_ignores_fields_of_newer_writers():
    d = RunHeader(model="tiny").to_dict() | {"host": "gpu-7"}
    assert RunHeader.from_dict(d).model == "tiny"


def _write(tmp_path, text: str):
    p = tmp_path / "bad.jsonl"
    p.write_text(text, encoding="utf-8")
    return p


def _header_line(**over) -> str:
    return json.dumps(RunHeader().to_dict() | over) + "\n"


GOOD_EVENT = json.dumps(E.UidHit(step=1, split=0, key=7, uid=3, t_ns=10).to_dict()) + "\n"


@pytest.mark.parametrize("text, message", [
    ("", "empty file"),
    ("\n\n", "empty file"),
    ("hello world\n", ":1: not JSON"),
    (json.dumps({"format": "chrome-trace"}) + "\n", "not a graphdiag event record (no schema"),
    (json.dumps({"schema": "memray"}) + "\n", "not a graphdiag event record (schema 'memray')"),
    (_header_line(version=99), "unsupported schema version 99"),
    (_header_line() + GOOD_EVENT + GOOD_EVENT[:25], ":3: truncated last line"),
    (_header_line()[:30], ":1: truncated last line"),
    (_header_line() + "{oops}\n" + GOOD_EVENT, ":2: not JSON"),
    (_header_line() + GOOD_EVENT + json.dumps({"kind": "teleport", "step": 1}) + "\n",
     ":3: unknown event kind 'teleport'"),
    (_header_line() + json.dumps({"kind": "span_begin", "name": "x"}) + "\n", ":2: unknown event kind"),
    (_header_line() + "[1, 2]\n", ":2: not an event"),
])
def test_record_bad_input_is_one_clear_line(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(EventFileError) as exc:
        read_record(path)
    msg = str(exc.value)
    assert message in msg
    assert msg.startswith(str(path))
    assert "\n" not in msg


def test_record_missing_file(tmp_path):
    with pytest.raises(EventFileError, match="no such file"):
        read_record(tmp_path / "nope.jsonl")


def test_record_directory_and_binary_input(tmp_path):
    with pytest.raises(EventFileError, match="is a directory"):
        read_record(tmp_path)
    p = tmp_path / "bin.jsonl"
    p.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(EventFileError, match="not UTF-8"):
        read_record(p)


def test_record_writer_started_late_holds_early_events(tmp_path):
    path = tmp_path / "run.jsonl"
    header, events = synth.steady_decode(n_replays=1)
    writer = JsonlWriter(path)
    for ev in events[:3]:
        writer(ev)
    writer.start(header.to_dict())                        # the runner's on_header hook hands a dict
    for ev in events[3:]:
        writer(ev)
    writer.close()
    assert read_record(path) == (header, events)

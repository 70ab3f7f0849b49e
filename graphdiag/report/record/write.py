"""Writing a record: `JsonlWriter`, the event sink that writes the JSON-lines file as the run goes (header
line, then one line per decision event; spans are not recorded: they exist for NVTX timelines),
`write_record` for a whole record at once, `probe_output`, which shows an output file takes bytes before a
run starts and leaves it as it was, and `open_output`, which opens it once the run starts.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, TextIO

from ... import events as E
from ...errors import EventWriteError
from .header import RunHeader, as_header


_ENCODER = json.JSONEncoder(separators=(",", ":"))   # made once: json.dumps(separators=...) builds one a call


def probe_output(path: Path, what: str) -> None:
    """Show that `path` takes bytes and leave it as it was (a run refused later must not have emptied it):
    an existing regular file gets a byte appended and cut off again, a new one is created with a byte and
    removed, a device that is not a terminal gets a newline (/dev/full fails, /dev/null takes it); a pipe, a
    socket or a terminal is not probed (the probe would reach its reader). Any failure is an
    EventWriteError naming `what` and the path."""
    try:
        try:
            st = path.stat()
        except FileNotFoundError:
            st = None
        if st is not None and (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
            return
        if st is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                os.write(fd, b"\n")
            finally:
                os.close(fd)
                os.unlink(path)
        else:
            fd = os.open(path, os.O_WRONLY | (os.O_APPEND if stat.S_ISREG(st.st_mode) else 0))
            try:
                if stat.S_ISREG(st.st_mode):
                    os.write(fd, b"\n")
                    os.ftruncate(fd, st.st_size)
                elif not os.isatty(fd):
                    os.write(fd, b"\n")
            finally:
                os.close(fd)
    except OSError as e:
        raise EventWriteError(f"cannot write {what} {path}: {e.strerror or e}") from None


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
    hook, once the run starts) when it is not known yet; events that arrive before it are held back until
    then. The file is shown writable by the constructor (probe_output: /dev/full or a full disk fails
    before the run) and opened, emptied, by the header's write: a run refused before it starts leaves an
    existing file as it was and creates none. The header is flushed at once, and the events flushed as each step's StepFinished (and the RunEnded) is written: a
    killed run's record stops at a step boundary (one write per step, no fsync). `stream` writes to an
    open file instead (`--events -`: stdout), which close() flushes but leaves open. Any failure to open
    or write is an EventWriteError naming the file, except a reader that went away (BrokenPipeError,
    passed on as it is: the output was closed); after either, the writer stays shut."""

    def __init__(self, path: str | Path, header: RunHeader | dict[str, Any] | None = None,
                 stream: TextIO | None = None):
        self.path = Path(path)
        self._owned = stream is None
        if stream is None:
            probe_output(self.path, "the event record")
        self._f: TextIO | None = stream           # an owned file: opened by start()
        self.sink_name = f"the event record {self.path}"
        self._early: list[E.Event] | None = []
        if header is not None:
            self.start(header)

    def _error(self, e: OSError) -> EventWriteError:
        return EventWriteError(f"cannot write the event record {self.path}: {e.strerror or e}")

    def start(self, header: RunHeader | dict[str, Any]) -> None:
        """Open the file (a stream is open already), write the header line, then any events held back."""
        if self._owned and self._f is None and self._early is not None:
            self._f = open_output(self.path, "the event record")
        self._write(as_header(header).to_dict())
        self._flush()
        early, self._early = self._early or [], None
        for ev in early:
            self(ev)

    def _write(self, obj: dict[str, Any]) -> None:
        if self._f is not None:
            self._guarded(self._f.write, _ENCODER.encode(obj) + "\n")

    def _flush(self) -> None:
        if self._f is not None:
            self._guarded(self._f.flush)

    def _guarded(self, call, *args) -> None:
        """A write or flush of the record: a closed reader or a full disk abandons the file and is raised
        as the record's own error."""
        try:
            call(*args)
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
        if isinstance(ev, (E.SpanBegin, E.SpanEnd)):
            return
        if self._early is not None:               # not started: held back (the file is not open yet)
            self._early.append(ev)
            return
        if self._f is None:                       # abandoned after a failed write
            return
        self._write(ev.to_dict())
        if isinstance(ev, _FLUSH_AFTER):
            self._flush()                 # a step boundary: what a kill leaves ends here

    def close(self) -> None:
        """Flush and close the file (idempotent; a stream is flushed, not closed). A writer never started
        (a run refused before it started) never opened its file: nothing is written."""
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

"""The live terminal report: an event sink printing the run header and the event log as the run goes
(views/console.py's RunLog draws them), with a progress bar over the steps on a terminal."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ... import events as E
from ..record.header import RunHeader, as_header
from ..views.console import RunLog
from ..views.tables import make_console


class ConsoleReporter:
    """An event sink printing the run header, the event log up to `verbosity` and a progress bar over
    `total_steps` (only on a terminal unless `progress` says otherwise). Without a header at construction,
    `start(header)` (the runner's on_header hook) prints it. Call `close()` at the end."""

    def __init__(self, header: RunHeader | dict | None = None, verbosity: int = 0, file: TextIO | None = None,
                 total_steps: int | None = None, progress: bool | None = None, console: Console | None = None):
        self.console = console or make_console(file)
        self.view = RunLog(self.console, verbosity)
        if progress is None:
            progress = self.console.is_terminal and bool(total_steps)
        self._want_progress, self._total = progress, total_steps
        self.progress: Progress | None = None
        self._broken = self._told = False
        self.sink_name = "the terminal report"
        if header is not None:
            self.start(header)

    def start(self, header: RunHeader | dict) -> None:
        """Print the run header and start the progress bar (when wanted)."""
        try:
            self.view.start(as_header(header))
        except BrokenPipeError:
            self._broken = True
            return
        if self._want_progress and self.progress is None:
            self.progress = self._start_progress(self._total)

    def _start_progress(self, total: int | None) -> Progress:
        p = Progress(TextColumn("step"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     console=self.console, transient=True)
        self._task = p.add_task("steps", total=total)
        p.start()
        return p

    def __call__(self, ev: E.Event) -> None:
        if self._broken:
            if not self._told:             # the header found the pipe closed: end the run at its first event
                self._told = True
                raise BrokenPipeError("output closed")
            return
        try:
            self.view.draw(ev)
            if self.progress is not None and isinstance(ev, E.StepFinished):
                self.progress.advance(self._task)
        except BrokenPipeError:
            self._broken = self._told = True   # the reader went away: say nothing more, let the run end
            raise

    def close(self) -> None:
        """Stop the progress bar (idempotent)."""
        if self.progress is not None:
            p, self.progress = self.progress, None
            try:
                p.stop()
            except BrokenPipeError:
                pass

    def __enter__(self) -> "ConsoleReporter":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

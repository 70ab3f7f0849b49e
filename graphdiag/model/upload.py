"""A model file's weights going to the device, shown: "uploading 253.1 MB of weights from NAME.gguf" as a
rich progress bar on a terminal, as two plain lines (start, end with the time) when stderr is not one.
Files under QUIET_BYTES load without a word (the exported test presets: a few MB, a blink)."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

QUIET_BYTES = 64 << 20


def upload_label(model) -> str:
    """What the upload is: its bytes (the file's tensor data, in MB of 10^6 bytes) and the file's name."""
    return f"uploading {model.file.n_bytes / 1e6:.1f} MB of weights from {model.file.path.name}"


class FileUpload:
    """Context manager yielding tick(nbytes) over `total` bytes (every persistent tensor: the file's weights
    and the zeroed KV caches), drawing as the module docstring says on `stream` (stderr)."""

    def __init__(self, model, total: int, stream: TextIO | None = None):
        self.label, self.total, self.done = upload_label(model), total, 0
        self.quiet = model.file.n_bytes < QUIET_BYTES
        self.stream = stream if stream is not None else sys.stderr
        self.bar, self.t0 = None, 0

    def __enter__(self) -> Callable[[int], None]:
        self.t0 = time.perf_counter()
        if self.quiet:
            return self.tick
        if _is_tty(self.stream):
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TimeElapsedColumn(), console=Console(file=self.stream), transient=False)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total)
        else:
            self.stream.write(f"graphdiag: {self.label}\n")
            self.stream.flush()
        return self.tick

    def tick(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)

    def __exit__(self, exc_type, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
        elif not self.quiet and exc_type is None:
            self.stream.write(f"graphdiag: uploaded in {time.perf_counter() - self.t0:.2f} s\n")
            self.stream.flush()


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

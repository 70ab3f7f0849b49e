"""How a run ends on a signal: SIGTERM as an interrupt, and its files written even when a second one comes.

`terminate_as_interrupt()` (around a run) makes SIGTERM raise Terminated, a KeyboardInterrupt: the run
ends as after Ctrl-C (the record ends with a RunEnded, the timeline is written, the summary so far is
printed) and exits 143. `shielded()` (around the closing of the run's files) holds SIGINT and SIGTERM back
until the files are written, then raises the interrupt that came: a second Ctrl-C while a long timeline
is written no longer leaves it empty. Both restore the handlers they replaced, and do nothing off the
main thread (only it may set signal handlers).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from .errors import Terminated


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _restore(sig: int, handler) -> None:
    # None: the previous handler was not set from Python; the default is the closest we can put back
    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated inside the block; the previous handler is back when it ends."""
    if not _main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        _restore(signal.SIGTERM, old)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """SIGINT and SIGTERM are held back inside the block and raised (KeyboardInterrupt, Terminated) after it."""
    if not _main_thread():
        yield
        return
    came: list[int] = []
    hold = lambda signum, frame: came.append(signum)
    old = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            _restore(sig, handler)
    if came:
        raise Terminated() if came[0] == signal.SIGTERM else KeyboardInterrupt()

"""How a run ends on a signal: SIGTERM as an interrupt, and its files written even when a second one comes.

`terminate_as_interrupt()` (around the whole command: cli.main) makes the first SIGTERM raise Terminated, a
KeyboardInterrupt: the run ends as after Ctrl-C (the record ends with a RunEnded, the timeline is written,
the summary so far is printed) and exits 143; a second SIGTERM changes nothing (the run is already ending,
as the first said, and is ignored from then on). `shielded()` (around the closing of the run's files) holds SIGINT and SIGTERM back
until the files are written, then raises the interrupt that came — unless the block was entered while an
exception was already ending the run (the first signal decides how it ends, record and exit status
agreeing): a second Ctrl-C while a long timeline is written no longer leaves it empty. Both restore the
handlers they replaced, and do nothing off the main thread (only it may set signal handlers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

from .early_signals import early_default, release_early, underlying  # noqa: F401 (release_early: cli.main's)
from .errors import Terminated


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _restore(sig: int, handler) -> None:
    # None: the previous handler was not set from Python; the default is the closest we can put back
    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# the signals that came inside terminate_as_interrupt's block, first first: an interrupt that lands inside a C
# extension's module import comes out as that import's ImportError, and this still says the run was stopped
_CAME: list[int] = []


def interrupt_came() -> BaseException | None:
    """The interrupt (KeyboardInterrupt or Terminated) that first came inside terminate_as_interrupt's block,
    whatever exception it turned into on its way; None when none came."""
    if not _CAME:
        return None
    return Terminated() if _CAME[0] == signal.SIGTERM else KeyboardInterrupt()


def raise_if_swallowed() -> None:
    """Raise the interrupt that came inside terminate_as_interrupt's block, if one came: called where the
    command goes on only when none did (a run's step boundary). A signal handled while Python runs a weakref
    callback or a __del__ (importlib's module-lock callback, mid-import) has its exception printed as
    "Exception ignored" and dropped; a SIGTERM, once come, is ignored from then on, so without this the run
    would go on to its last step."""
    if _CAME:
        raise Terminated() if _CAME[0] == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """The first SIGTERM raises Terminated inside the block, later ones are ignored; Ctrl-C raises
    KeyboardInterrupt as Python's own handler does (unless SIGINT was ignored, as in a background job); each
    is remembered (interrupt_came). The previous handlers are back when it ends, except that SIGTERM stays
    ignored once one came (the process is on its way out)."""
    if not _main_thread():
        yield
        return
    _CAME.clear()

    def terminated(signum, frame) -> None:
        if signal.SIGTERM not in _CAME:
            _CAME.append(signum)
            raise Terminated()

    def interrupted(signum, frame) -> None:
        _CAME.append(signum)
        raise KeyboardInterrupt()
    # graphdiag.entry's handlers (while the modules loaded) are taken over in one step, no gap between them and
    # ours: what they replaced is what comes back at the end
    old = {signal.SIGTERM: early_default(signal.SIGTERM, signal.signal(signal.SIGTERM, terminated))}
    if underlying(signal.SIGINT) is signal.default_int_handler:
        old[signal.SIGINT] = early_default(signal.SIGINT, signal.signal(signal.SIGINT, interrupted))
    hook = sys.unraisablehook

    def unraisable(u) -> None:          # our interrupt, dropped where Python cannot raise: no traceback printed,
        if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt) and _CAME:
            return                      # raise_if_swallowed raises it at the run's next step
        hook(u)
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        sys.unraisablehook = hook
        # after a SIGTERM the process is ending as terminated: a later one must not kill it on its way out
        # (its last output unflushed, its status a signal's instead of 143)
        for sig, handler in old.items():
            _restore(sig, signal.SIG_IGN if sig == signal.SIGTERM and sig in _CAME else handler)
        _CAME.clear()


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """SIGINT and SIGTERM are held back inside the block and raised (KeyboardInterrupt, Terminated) after it,
    unless an exception was already on its way when the block began (it goes on: the run ends as it says)."""
    if not _main_thread():
        yield
        return
    ending = sys.exc_info()[1] is not None
    came: list[int] = []
    hold = lambda signum, frame: came.append(signum)
    old = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            _restore(sig, handler)
    if came and not ending:
        raise Terminated() if came[0] == signal.SIGTERM else KeyboardInterrupt()

"""The handlers graphdiag.entry sets before anything else loads: a signal that comes while the command's modules
are still loading ends the process with the one line and exit status a later one gets (130 Ctrl-C, 143
SIGTERM), not an import's KeyboardInterrupt traceback. Only os and signal are imported here, so that they are
set within the first milliseconds; interrupts.terminate_as_interrupt takes them
over, with no gap between theirs and its own."""

from __future__ import annotations

import os
import signal

_EARLY = {signal.SIGINT: (b"graphdiag: interrupted\n", 130), signal.SIGTERM: (b"graphdiag: terminated (SIGTERM)\n", 143)}
_early_replaced: dict = {}


def _while_loading(signum, _frame) -> None:
    line, code = _EARLY[signum]
    os.write(2, line)
    os._exit(code)


def install_early() -> None:
    """graphdiag.entry's handlers, on the signals still at their defaults: a signal before the command handles
    its own ends the process with the one line and status a later one gets (no import's traceback)."""
    for sig in _EARLY:
        h = signal.getsignal(sig)
        if h in (signal.SIG_DFL, signal.default_int_handler):
            _early_replaced[sig] = h
            signal.signal(sig, _while_loading)


def underlying(sig: int):
    """The handler of `sig` as it would be without install_early's (the one in force otherwise)."""
    h = signal.getsignal(sig)
    return _early_replaced.get(sig, signal.SIG_DFL) if h is _while_loading else h


def early_default(sig: int, handler):
    """`handler`, or what install_early replaced when it is install_early's (taken over: release_early leaves it)."""
    if handler is _while_loading:
        return _early_replaced.pop(sig, signal.SIG_DFL)
    return handler


def release_early() -> None:
    """Give back the defaults install_early replaced, where its handlers are still installed (the command's own
    SIGTERM handler, set meanwhile, stays): cli/main.py calls it once it handles interrupts itself."""
    for sig, h in list(_early_replaced.items()):
        if signal.getsignal(sig) is _while_loading:
            signal.signal(sig, h)
        del _early_replaced[sig]

"""The `graphdiag` program's entry (the console script and `python -m graphdiag`): a signal that comes while
the command's modules are still loading (click, rich, numpy: about 0.1 s) ends it with the same one line and
exit status as later (130 Ctrl-C, 143 SIGTERM), not a KeyboardInterrupt traceback from an import. Once the
command handles its signals itself (cli/main.py's main, inside its try), it gives the defaults back (release)."""

from __future__ import annotations

import os
import signal

_LINES = {signal.SIGINT: (b"graphdiag: interrupted\n", 130),
          signal.SIGTERM: (b"graphdiag: terminated (SIGTERM)\n", 143)}


def _while_loading(signum, _frame) -> None:
    line, code = _LINES[signum]
    os.write(2, line)
    os._exit(code)


_replaced: dict = {}


def install() -> None:
    """The early handlers, on the signals still at their defaults."""
    for sig in _LINES:
        h = signal.getsignal(sig)
        if h in (signal.SIG_DFL, signal.default_int_handler):
            _replaced[sig] = h
            signal.signal(sig, _while_loading)


def release() -> None:
    """Give back the defaults the early handlers replaced, where they are still installed (the command's own
    SIGTERM handler, set meanwhile, stays): called by cli/main.py once it handles interrupts itself."""
    for sig, h in list(_replaced.items()):
        if signal.getsignal(sig) is _while_loading:
            signal.signal(sig, h)
        del _replaced[sig]


def main() -> int:
    install()
    from .cli.main import main as cli_main
    return cli_main()

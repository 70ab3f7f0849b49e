"""The `graphdiag` program's entry (the console script and `python -m graphdiag`): a signal that comes while
the command's modules are still loading (click, rich, numpy: about 0.1 s) ends it with the same one line and
exit status as later (130 Ctrl-C, 143 SIGTERM), not a KeyboardInterrupt traceback from an import. Once the
command handles its signals itself (cli/main.py's main, inside its try), it gives the defaults back
(interrupts.release_early)."""

from __future__ import annotations

from .interrupts import install_early


def main() -> int:
    install_early()
    from .cli.main import main as cli_main
    return cli_main()

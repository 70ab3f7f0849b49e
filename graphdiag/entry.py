"""The `graphdiag` program's entry (the console script and `python -m graphdiag`): a signal that comes while
the command's modules are still loading (click, rich, numpy: about 0.1 s) ends it with the same one line and
exit status as later (130 Ctrl-C, 143 SIGTERM), not a KeyboardInterrupt traceback from an import. Once the
command handles its signals itself (cli/main.py's main, inside its try), it gives the defaults back
(early_signals.release_early)."""

from __future__ import annotations

from .early_signals import install_early


def main() -> int:
    install_early()
    from .cli.main import main as cli_main
    status = cli_main()
    # A KeyboardInterrupt (Ctrl-C) that left code run by exec() (a dataclass's generated methods, while a
    # module was first imported) sets CPython's "unhandled KeyboardInterrupt" flag, though graphdiag handled
    # it: the interpreter would then end by SIGINT (status -2) instead of with `status`. The next exec()
    # clears that flag (pythonrun.c, run_eval_code_obj); nothing else does.
    exec("None")
    return status

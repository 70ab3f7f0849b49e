"""The `graphdiag` command group and the one place errors become messages and exit codes.

Exit codes: 0 ok; 1 a check failed (or `diff`: the runs differ); 2 bad input (one line on stderr);
3 an internal error, i.e. a bug (one line asking for a report; the traceback with --debug or
GRAPHDIAG_DEBUG=1); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM; a second one changes nothing);
141 stdout closed early (e.g. piped into `head`), quietly.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from .. import __version__
from ..interrupts import interrupt_came, release_early, terminate_as_interrupt
from ..errors import (INTERNAL_EXIT, INTERRUPTED_EXIT, TERMINATED_EXIT, GraphdiagError, InternalError,
                      RunInterrupted, Terminated)

BROKEN_PIPE_EXIT = 141       # 128 + SIGPIPE, as a shell reports a reader that went away

_debug = False


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global _debug
    _debug = _debug or value


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.version_option(__version__, prog_name="graphdiag")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
              help="Show the Python traceback of an internal error (also: GRAPHDIAG_DEBUG=1).")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Profile and diagnose CUDA-graph capture/replay in LLM decode, the way llama.cpp does it.

    graphdiag runs a reference decode workload through a faithful reproduction of llama.cpp's CUDA graph
    path and reports every decision: warmup transitions, uid hits, which node and field forced a recapture,
    chunk boundaries, update-versus-instantiate outcomes and why.
    """
    if ctx.invoked_subcommand is None:      # `graphdiag` alone: its help, on stdout, exit 0 (as git and pip)
        click.echo(ctx.get_help())


def _register() -> None:
    from .run import run
    cli.add_command(run)
    for mod, name in (("report", "report"), ("diff", "diff"), ("scenarios", "scenarios"), ("bench", "bench"),
                      ("whatif", "whatif"), ("export", "export_gguf"), ("llama", "llama"),
                      ("trace", "trace"), ("load", "load"), ("replay", "replay")):
        try:
            module = __import__(f"graphdiag.cli.{mod}", fromlist=[name])
        except ModuleNotFoundError as e:
            if e.name != f"graphdiag.cli.{mod}":
                raise
            continue
        cli.add_command(getattr(module, name))


# modules of graphdiag's required dependencies (pyproject's `dependencies`) -> their package: one missing is a
# broken install, said in one line, not a bug
REQUIRED_MODULES = {"click": "click", "rich": "rich", "numpy": "numpy", "cuda": "cuda-python", "nvtx": "nvtx",
                    "gguf": "gguf"}


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the group; every error ends in one line on stderr and an exit status. numpy's BLAS
    threads are set first, before anything loads numpy (config.apply_blas_threads). SIGTERM is an interrupt
    for the whole command (interrupts.terminate_as_interrupt)."""
    from ..config import apply_blas_threads, debug_requested

    apply_blas_threads()

    global _debug
    _debug = debug_requested(os.environ)
    try:
        with terminate_as_interrupt():
            try:
                release_early()                  # graphdiag.entry's, while the modules loaded: ours from here
                return _main(argv)
            except KeyboardInterrupt as e:      # a second Ctrl-C while the first was being reported
                return TERMINATED_EXIT if isinstance(e, Terminated) else INTERRUPTED_EXIT
    except KeyboardInterrupt as e:              # one that came while the handlers were being set
        return _interrupted(e)


def _interrupted(e: BaseException | None) -> int:
    """An interrupt that ended the command outside a run's own handling (before the run started)."""
    if isinstance(e, Terminated):
        click.echo("graphdiag: terminated (SIGTERM)", err=True)
        return TERMINATED_EXIT
    click.echo("graphdiag: interrupted", err=True)
    return INTERRUPTED_EXIT


def _main(argv: list[str] | None) -> int:
    """The command, its errors mapped to one line and an exit status."""
    try:
        _register()
        rv = cli.main(args=argv, prog_name="graphdiag", standalone_mode=False)
        sys.stdout.flush()                      # a closed pipe shows here, not at interpreter exit
        return rv if isinstance(rv, int) else 0
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE_EXIT
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort as e:         # click's form of a KeyboardInterrupt inside a command
        return _interrupted(e.__context__)
    except click.ClickException as e:
        click.echo(f"graphdiag: error: {e.format_message()}", err=True)
        return e.exit_code
    except RunInterrupted as e:
        click.echo(f"graphdiag: {e}", err=True)
        return e.exit_code
    except InternalError as e:
        return _interrupted(interrupt_came()) if interrupt_came() else _internal(e)
    except GraphdiagError as e:
        click.echo(f"graphdiag: error: {e}", err=True)
        return e.exit_code
    except KeyboardInterrupt as e:
        return _interrupted(e)
    except ModuleNotFoundError as e:
        if interrupt_came():                    # a signal inside an import comes out as the import's error
            return _interrupted(interrupt_came())
        package = REQUIRED_MODULES.get((e.name or "").split(".")[0])
        if package is None:                     # not one graphdiag requires: a bug
            return _internal(e)
        click.echo(f"graphdiag: error: {package}, which graphdiag requires, is not installed (module {e.name!r}); "
                   f"install graphdiag with its dependencies (pip install {package})", err=True)
        return 2
    except MemoryError:
        click.echo("graphdiag: error: out of host memory (a size asked for is too large for this machine)",
                   err=True)
        return 2
    except Exception as e:                      # anything else is a bug in graphdiag, not bad input
        return _interrupted(interrupt_came()) if interrupt_came() else _internal(e)


def _internal(e: BaseException) -> int:
    """One line that says it is a bug and asks for a report; the traceback only when debugging."""
    if _debug:
        traceback.print_exception(e, file=sys.stderr)
    what = str(e) if isinstance(e, InternalError) else f"{type(e).__name__}: {e}"
    hint = "" if _debug else " (rerun with --debug or GRAPHDIAG_DEBUG=1 for the traceback)"
    click.echo(f"graphdiag: internal error: {what} — this is a bug, please report it with the command line{hint}",
               err=True)
    return INTERNAL_EXIT


def _silence_stdout() -> None:
    """The reader went away: point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())

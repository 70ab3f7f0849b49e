"""The `graphdiag` command group and the one place errors become messages and exit codes."""

from __future__ import annotations

import sys

import click

from .. import __version__
from ..errors import GraphdiagError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="graphdiag")
def cli() -> None:
    """Profile and diagnose CUDA-graph capture/replay in LLM decode, the way llama.cpp does it.

    graphdiag runs a reference decode workload through a faithful reproduction of llama.cpp's CUDA graph
    path and reports every decision: warmup transitions, uid hits, which node and field forced a recapture,
    chunk boundaries, update-versus-instantiate outcomes and why.
    """


def _register() -> None:
    from .run import run
    cli.add_command(run)
    for mod, name in (("report", "report"), ("diff", "diff"), ("scenarios", "scenarios"), ("bench", "bench")):
        try:
            module = __import__(f"graphdiag.cli.{mod}", fromlist=[name])
        except ModuleNotFoundError as e:
            if e.name != f"graphdiag.cli.{mod}":
                raise
            continue
        cli.add_command(getattr(module, name))


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the group; GraphdiagError and click usage errors end in one line and a status."""
    _register()
    try:
        rv = cli.main(args=argv, prog_name="graphdiag", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("graphdiag: aborted", err=True)
        return 130
    except click.ClickException as e:
        click.echo(f"graphdiag: error: {e.format_message()}", err=True)
        return e.exit_code
    except GraphdiagError as e:
        click.echo(f"graphdiag: error: {e}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        click.echo("graphdiag: interrupted", err=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())

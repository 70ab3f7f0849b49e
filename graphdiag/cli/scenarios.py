"""`graphdiag scenarios`: the bundled scenarios, one line each."""

from __future__ import annotations

import click


@click.command()
def scenarios() -> None:
    """List the bundled scenarios (run one with `graphdiag run --scenario NAME`)."""
    from ..scenario import list_scenarios

    found = list_scenarios()
    width = max((len(s.name) for s in found), default=0)
    for s in found:
        click.echo(f"{s.name:<{width}}  {s.description}")

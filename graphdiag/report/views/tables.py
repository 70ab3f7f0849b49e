"""The pieces every terminal view is drawn with (rich): the console (plain and fixed-width off a
terminal, which is what tests and redirected output get) and the borderless table. Only draws."""

from __future__ import annotations

import sys
from typing import TextIO

from rich import box
from rich.console import Console
from rich.table import Table

WIDTH = 120          # fixed width of plain (non-terminal) output


def make_console(file: TextIO | None = None, plain: bool | None = None) -> Console:
    """A console on `file` (stdout by default). plain=None: plain unless the file is a terminal."""
    file = file if file is not None else sys.stdout
    if plain is None:
        plain = not (hasattr(file, "isatty") and file.isatty())
    if plain:
        con = Console(file=file, width=WIDTH, color_system=None, force_terminal=False, highlight=False,
                      emoji=False, soft_wrap=True, no_color=True)
    else:
        con = Console(file=file, highlight=False, soft_wrap=True)
    con.on_broken_pipe = _broken_pipe        # rich would exit the process (SystemExit 1) before the record ends
    return con


def _broken_pipe() -> None:
    raise BrokenPipeError("output closed")


TEXT_COLUMNS = ("key", "what", "counter", "setting", "node", "field", "change")


def table(title: str, *cols: str, left: tuple[str, ...] = ()) -> Table:
    """A borderless table; text columns (TEXT_COLUMNS and `left`) align left, numbers right."""
    t = Table(title=title, title_justify="left", title_style=None, box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, header_style=None)
    for c in cols:
        t.add_column(c, justify="left" if c in TEXT_COLUMNS or c in left else "right", no_wrap=True)
    return t


SIMULATED_TIMES = "SIMULATED driver: host times, not GPU times"


def timing_title(what: str, simulated: bool) -> str:
    """A timing table's title, saying so when its numbers come from the simulated driver."""
    return f"{what} — {SIMULATED_TIMES}" if simulated else what

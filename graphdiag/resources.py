"""Where graphdiag's data folders are: kernels/ (CUDA sources) and scenarios/ (TOML files).

An installed wheel carries them as graphdiag/_data/<name> (pyproject's force-include); a source checkout
has them at <repo root>/<name>. The installed location wins, so a wheel never reads a stray checkout.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """graphdiag/_data/<name> if present, else <repo root>/<name>; FileNotFoundError names both."""
    candidates = (_PACKAGE / "_data" / name, _PACKAGE.parent / name)
    for c in candidates:
        if c.is_dir():
            return c
    raise FileNotFoundError(f"graphdiag data folder {name!r} not found (looked in {', '.join(map(str, candidates))})")


def kernels_dir() -> Path:
    """The folder holding common.cuh and the kernels' *.cu files."""
    return data_dir("kernels")


def scenarios_dir() -> Path:
    """The folder holding the bundled scenario *.toml files."""
    return data_dir("scenarios")

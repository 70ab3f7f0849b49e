"""Running the CLI entry in a test: one-line errors."""

from __future__ import annotations

import re

from graphdiag.cli.main import main

QUICK = ["--backend", "sim", "--prompt-tokens", "4"]


def one_line(capsys, argv, code=2, prefix=r"graphdiag( diff)?: error:") -> str:
    """Run `graphdiag ARGV`: it must exit `code` with exactly one line on stderr, matching `prefix`, and no
    traceback; returns that line."""
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == code, err
    assert len(lines) == 1 and re.match(prefix, lines[0]) and "Traceback" not in err, err
    return lines[0]


def export_files(folder, model: str, option: str, values) -> dict:
    """`graphdiag export-gguf --model MODEL --OPTION V` for each V into `folder`: {V: path} (seed 0)."""
    out = {}
    for v in values:
        p = folder / f"{model}-{v}.gguf"
        assert main(["export-gguf", "--model", model, f"--{option}", v, str(p)]) == 0
        out[v] = p
    return out


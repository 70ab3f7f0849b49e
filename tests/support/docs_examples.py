"""The runnable examples of the README and docs/: found, run, compared, and (with --write) captured.

An example is a ```bash block preceded by the line `<!-- runnable -->` (or `<!-- runnable exit=N -->` when the
command is meant to exit N: `--strict` finding something, `diff` finding a difference). The ```text block right
after it, if there is one, is what the command printed (stdout and stderr together) when it was captured.

A page's examples run in order in one fresh folder (so a later one can read the record an earlier one wrote),
with `tests/` and `scenarios/` of the repository linked in, `graphdiag` meaning this Python's `-m graphdiag` and
`python`/`python3` this Python (the one graphdiag is installed in).
An example passes when it exits as marked and every line its page shows appears in the output, in order,
after `normalise`: numbers and durations differ between runs and machines, the lines and words do not. A line
`⋮` in a shown output marks lines the page leaves out.

    python tests/support/docs_examples.py --write [--all] [PAGE.md ...]

runs every example of the pages (default: every page with one) and writes what each printed into its empty
```text block (with --all, into every block: trimmed outputs come back whole).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!-- runnable(?: exit=(\d+))? -->$")
ELIDED = "⋮"
# lines that name the machine rather than the run (its cores, when the run started)
MACHINE_LINES = ("numpy BLAS threads:", "started ")
LINKED = ("tests", "scenarios")


@dataclasses.dataclass
class Example:
    page: Path
    line: int               # 1-based line of the ```bash fence
    script: str
    exit: int
    shown: list[str] | None  # the ```text block's lines, or None when the page shows no output
    out_span: tuple[int, int] | None = None   # 0-based [first, last) lines of the text block's body


def pages() -> list[Path]:
    """The README and every docs page."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _fence(lines: list[str], i: int) -> tuple[str, int]:
    """The body of the fenced block opening at line i, and the index after its closing fence."""
    body, j = [], i + 1
    while j < len(lines) and lines[j].strip() != "```":
        body.append(lines[j])
        j += 1
    return "\n".join(body), j + 1


def examples(page: Path) -> list[Example]:
    """The runnable examples of one page, in order."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        if not m:
            i += 1
            continue
        j = i + 1
        if j >= len(lines) or lines[j].strip() != "```bash":
            raise ValueError(f"{page.name}:{i + 1}: `<!-- runnable -->` must stand right above a ```bash block")
        script, k = _fence(lines, j)
        ex = Example(page, j + 1, script, int(m.group(1) or 0), None)
        n = k
        while n < len(lines) and not lines[n].strip():
            n += 1
        if n < len(lines) and lines[n].strip() == "```text":
            body, end = _fence(lines, n)
            ex.shown = body.splitlines()
            ex.out_span = (n + 1, end - 1)
            k = end
        out.append(ex)
        i = k
    return out


_DURATION = re.compile(r"-?\d[\d,]*(?:\.\d+)?\s?(?:µs|us|ms|ns|s)\b")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalise(line: str) -> str:
    """A line with what differs between two runs of one command taken out: durations (whatever their unit) and
    numbers become '#', runs of spaces and of table rules one character."""
    line = _DURATION.sub("#t", line)
    line = _NUMBER.sub("#", line)
    line = re.sub(r"─+", "─", line)
    return " ".join(line.split())


def missing(shown: list[str], output: str) -> list[str]:
    """The shown lines not found, in order, in `output` (empty: the output holds what the page shows)."""
    got = [normalise(l) for l in output.splitlines()]
    lost, at = [], 0
    for line in shown:
        if line.strip() in ("", ELIDED) or line.startswith(MACHINE_LINES):
            continue
        want = normalise(line)
        try:
            at = got.index(want, at) + 1
        except ValueError:
            lost.append(line)
    return lost


def folder(tmp: Path) -> Path:
    """A fresh folder for one page's examples, with the repository's tests/ and scenarios/ linked in."""
    for name in LINKED:
        (tmp / name).symlink_to(ROOT / name)
    return tmp


def run(ex: Example, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run one example in `cwd` with bash (-e, pipefail), `graphdiag` being this Python's `-m graphdiag`."""
    py = sys.executable
    prelude = (f'set -eo pipefail\ngraphdiag() {{ "{py}" -m graphdiag "$@"; }}\n'
               f'python() {{ "{py}" "$@"; }}\npython3() {{ "{py}" "$@"; }}\n')
    env = dict(os.environ, COLUMNS="120", TERM="dumb")
    env.pop("FORCE_COLOR", None)
    return subprocess.run(["bash", "-c", prelude + ex.script], cwd=cwd, env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def write(page: Path, every: bool = False) -> int:
    """Run a page's examples and write what each printed into its empty ```text block (`every`: into every
    block); returns how many failed."""
    lines = page.read_text().splitlines()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        cwd = folder(Path(tmp))
        for ex in reversed(_run_all(page, cwd)):
            res, ex = ex
            if res.returncode != ex.exit:
                failed += 1
                print(f"{page.name}:{ex.line}: exit {res.returncode}, marked {ex.exit}\n{res.stdout[-2000:]}")
            if ex.out_span is not None and (every or not ex.shown):
                a, b = ex.out_span
                lines[a:b] = [l.rstrip() for l in res.stdout.rstrip("\n").splitlines()]
    page.write_text("\n".join(lines) + "\n")
    return failed


def _run_all(page: Path, cwd: Path) -> list[tuple[subprocess.CompletedProcess, Example]]:
    return [(run(ex, cwd), ex) for ex in examples(page)]


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--write", "--all")]
    if "--write" not in sys.argv[1:]:
        sys.exit(__doc__)
    todo = [Path(a).resolve() for a in args] or [p for p in pages() if examples(p)]
    sys.exit(1 if sum(write(p, "--all" in sys.argv[1:]) for p in todo) else 0)

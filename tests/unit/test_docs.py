"""Issue 49, points 1 and 2: the README is short and its commands run; the docs site builds strictly, every
command has a page naming each of its options, and every example marked runnable runs on the simulator and
prints what its page shows (tests/support/docs_examples.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from graphdiag.cli.main import _register, cli
from support import docs_examples as D

ROOT = D.ROOT
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _readme() -> str:
    return README.read_text()


def test_readme_is_short_and_links_into_the_docs():
    text = _readme()
    assert len(text.encode()) <= 12 * 1024, f"README is {len(text.encode())} bytes (at most 12 KiB)"
    assert "Python ≥ 3.11" in text or "Python 3.11" in text
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 10, links
    for link in links:
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


def test_readme_has_two_setup_commands_and_the_main_job_runs(tmp_path):
    """The set-up section holds two commands (the main job, the tests); the main job's graphdiag part runs
    here, on the simulated driver when there is no GPU."""
    setup = re.search(r"^## Set up\n(.*?)^## ", _readme(), re.S | re.M).group(1)
    blocks = re.findall(r"```bash\n(.*?)\n```", setup, re.S)
    assert len(blocks) == 2, blocks
    main_job = blocks[0].split("&&")[-1].strip()
    assert main_job.startswith("graphdiag run "), main_job
    argv = main_job.split()[1:]
    res = subprocess.run([sys.executable, "-m", "graphdiag", *argv], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Per graph key" in res.stdout


def _commands() -> list[tuple[str, click.Command]]:
    """Every command and subcommand `graphdiag --help` lists, by name."""
    _register()
    out = []
    for name, cmd in cli.commands.items():
        if isinstance(cmd, click.Group):
            out += [(f"{name} {sub}", c) for sub, c in cmd.commands.items()]
        else:
            out.append((name, cmd))
    return out


@pytest.mark.parametrize("name,cmd", _commands(), ids=[n for n, _ in _commands()])
def test_every_command_has_a_page_naming_each_option(name, cmd):
    page = DOCS / "commands" / f"{name.split()[0]}.md"
    assert page.is_file(), f"no docs page for `graphdiag {name}` ({page.relative_to(ROOT)})"
    text = page.read_text()
    assert f"graphdiag {name}" in text
    for p in cmd.params:
        if isinstance(p, click.Option):
            longest = max(p.opts, key=len)
            if longest not in ("--help",):
                assert f"`{longest}" in text, f"{page.name} does not name `{longest}` of `graphdiag {name}`"


def test_every_docs_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert str(page.relative_to(DOCS)) in nav, f"{page.relative_to(DOCS)} is not in mkdocs.yml's nav"


def test_docs_build_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs and mkdocs-material are not installed: the `docs` extra belongs in CI's install")
        pytest.skip("the docs extra (mkdocs, mkdocs-material) is not installed: pip install '.[docs]'")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "commands" / "run" / "index.html").is_file()


_PAGES = [p for p in D.pages() if D.examples(p)]


def test_the_runnable_examples_are_found():
    assert README in _PAGES and len(_PAGES) >= 8, _PAGES
    assert all(ex.shown for p in _PAGES for ex in D.examples(p)), "every runnable example shows its output"


@pytest.mark.parametrize("page", _PAGES, ids=[str(p.relative_to(ROOT)) for p in _PAGES])
def test_runnable_examples_print_what_their_page_shows(page, tmp_path):
    cwd = D.folder(tmp_path)
    for ex in D.examples(page):
        res = D.run(ex, cwd)
        where = f"{page.relative_to(ROOT)}:{ex.line}"
        assert res.returncode == ex.exit, f"{where}: exit {res.returncode}, the page says {ex.exit}\n{res.stdout[-3000:]}"
        lost = D.missing(ex.shown or [], res.stdout)
        assert not lost, f"{where}: the output lacks lines the page shows:\n" + "\n".join(lost[:10])


def test_normalise_keeps_words_and_drops_numbers():
    """What the comparison ignores (times, counts, widths) and what it does not (words, order)."""
    a = "step (replay)                                       84277 µs        33"
    b = "step (replay)                          2.1 s        4"
    assert D.normalise(a) == D.normalise(b) == "step (replay) #t #"
    assert D.normalise("33 steps (2 eager)") == "# steps (# eager)"
    assert D.missing(["alpha 1", "⋮", "gamma 3"], "alpha 2\nbeta\ngamma 4\n") == []
    assert D.missing(["gamma 3", "alpha 1"], "alpha 2\ngamma 4\n") == ["alpha 1"]
    assert D.missing(["replay"], "eager\n") == ["replay"]

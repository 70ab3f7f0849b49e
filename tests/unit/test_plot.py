"""`graphdiag report --plot` (issue 11): PNG and SVG drawn from a record; a one-line error without matplotlib."""

from __future__ import annotations

import builtins

import pytest
from click.testing import CliRunner

from graphdiag.cli.main import main
from graphdiag.report.record import write_record
from support import synth


@pytest.fixture
def record(tmp_path):
    path = tmp_path / "batch.jsonl"
    write_record(path, *synth.batch_change())
    return path


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_is_written(record, tmp_path, suffix):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"plot{suffix}"
    assert main(["report", str(record), "--plot", str(out)]) == 0
    head = out.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in out.read_bytes()[:2000]


def test_plot_without_matplotlib_is_one_line(record, tmp_path, monkeypatch, capsys):
    real = builtins.__import__

    def no_mpl(name, *a, **kw):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert main(["report", str(record), "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["graphdiag: error: --plot needs matplotlib: pip install 'graphdiag[plot]'"]


def test_recaptures_carry_their_cause():
    from graphdiag.report.views.plot import recaptures
    _, events = synth.batch_change()
    assert any("ne[1]" in why for _, why in recaptures(events))

"""A model file's weight upload: named with its bytes, a rich bar on a terminal, plain lines otherwise, and
an event in the run's record (model/upload.py, runner.Session.announce)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphdiag.cli.main import main
from graphdiag.model.upload import FileUpload, QUIET_BYTES

GEMMA = SimpleNamespace(file=SimpleNamespace(n_bytes=253_113_024 - 6_000_000,
                                             path=Path("/x/gemma-3-270m-q4_k_m.gguf")))


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_name_the_bytes_and_the_file_when_stderr_is_no_terminal():
    out = io.StringIO()
    with FileUpload(GEMMA, 300_000_000, stream=out) as tick:
        tick(100)
    lines = out.getvalue().splitlines()
    assert lines[0] == "graphdiag: uploading 247.1 MB of weights from gemma-3-270m-q4_k_m.gguf"
    assert lines[1].startswith("graphdiag: uploaded in ") and lines[1].endswith(" s") and len(lines) == 2


def test_a_terminal_gets_a_progress_bar():
    out = Tty()
    with FileUpload(GEMMA, 300, stream=out) as tick:
        tick(300)
    text = out.getvalue()
    assert "uploading 247.1 MB of weights from gemma-3-270m-q4_k_m.gguf" in text and "graphdiag: uploaded" not in text


def test_a_small_file_loads_quietly():
    small = SimpleNamespace(file=SimpleNamespace(n_bytes=QUIET_BYTES - 1, path=Path("t.gguf")))
    out = Tty()
    with FileUpload(small, 10, stream=out) as tick:
        tick(10)
    assert out.getvalue() == ""


def test_the_record_has_the_upload_with_its_bytes_and_time(tmp_path):
    pytest.importorskip("gguf")
    p = tmp_path / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    rec = tmp_path / "r.jsonl"
    assert main(["run", "--backend", "sim", "--model", str(p), "--steps", "1", "--prompt-tokens", "2",
                 "--events", str(rec)]) == 0
    lines = [json.loads(l) for l in rec.read_text().splitlines()]
    kinds = [l.get("kind") for l in lines]          # the header line has none
    (up,) = [l for l in lines if l.get("kind") == "weights_uploaded"]
    assert up["source"] == "tiny.gguf" and up["n_bytes"] == lines[0]["model_file"]["bytes"] > 0
    assert up["duration_ns"] > 0
    assert kinds.index("weights_uploaded") < kinds.index("step_started")

"""GGUF paths everywhere (issue 27): `bench steps --model tiny,PATH.gguf` (a file row in its own types),
`bench ledger --model PATH.gguf`, and --wtype with files refused as `run` refuses it."""

from __future__ import annotations

import pytest

import graphdiag.bench.steps as S
from graphdiag.bench import StepsOptions, bench_steps
from graphdiag.cli.main import main
from support.cli import one_line

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("paths") / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    return p


def test_bench_steps_runs_a_file_once_in_its_own_types(tiny_file, monkeypatch):
    monkeypatch.setattr(S, "INSTR_ROUNDS", 1)       # a short instrumentation session: the row, not its figures
    monkeypatch.setattr(S, "INSTR_STEPS", 2)
    opts = StepsOptions(("tiny", str(tiny_file)), ("f16", "q8_0"), "sim", 8, 4, torch=False)
    assert S.runs_of(opts) == [("tiny", "f16"), ("tiny", "q8_0"), (str(tiny_file), None)]
    monkeypatch.setattr(S, "runs_of", lambda o: [(str(tiny_file), None)])
    (row,) = bench_steps(opts)
    assert (row["model"], row["model_path"], row["wtype"]) == ("tiny.gguf", str(tiny_file), S.OWN_TYPES)
    assert row["model_types"] == {"F16": 4 * 7 + 2, "F32": 2 * 4 + 1}
    assert row["replay_ms"] > 0 and row["weight_bytes"] > 0 and row["kernels_per_step"] > 10


def test_bench_wtype_with_files_only_and_a_bad_file_are_refused(tiny_file, capsys, tmp_path):
    assert "own types (drop --wtype)" in one_line(capsys, ["bench", "steps", "--model", str(tiny_file),
                                                           "--wtype", "q8_0"])
    assert "no such model file" in one_line(capsys, ["bench", "steps", "--model", f"tiny,{tmp_path}/no.gguf"])
    assert "unknown preset" in one_line(capsys, ["bench", "steps", "--model", "tiny,huge"])
    assert "no such model file" in one_line(capsys, ["bench", "ledger", "--model", f"{tmp_path}/no.gguf"])


def test_bench_ledger_checks_a_files_decode_graph(tiny_file, capsys):
    assert main(["bench", "ledger", "--model", str(tiny_file), "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{tiny_file} decode graph: ") and "gather + compare" in out

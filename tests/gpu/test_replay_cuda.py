"""graphdiag replay on the GPU: each RECORDED llama-server trace (tests/data/trace/server-*.raw.jsonl whose
header is not marked synthetic) replayed with --backend cuda on the file it was recorded with, compared
batch by batch; equal but for the known differences (report/analysis/known.py), every recapture and refused
update named by graphdiag's ledger.

The file: GRAPHDIAG_REPLAY_MODEL, else `graphdiag export-gguf --model tiny` (seed 0), which the recording must
have run (llama-server -m tiny.gguf -np 4 -kvu -v under `graphdiag trace --raw ...`). GRAPHDIAG_REPLAY_TRACE:
this trace instead of the fixtures. Skips without a GPU or without a recorded trace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.report.analysis.known import model_facts
from graphdiag.report.analysis.replay_diff import diff_replay
from graphdiag.trace.replay import run_replay

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]
DATA = Path(__file__).resolve().parents[1] / "data" / "trace"


def _recorded() -> list[Path]:
    given = os.environ.get("GRAPHDIAG_REPLAY_TRACE")
    if given:
        return [Path(given)]
    out = []
    for p in sorted(DATA.glob("server-*.raw.jsonl")):
        with p.open() as f:
            if not json.loads(f.readline()).get("synthetic"):
                out.append(p)
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    given = os.environ.get("GRAPHDIAG_REPLAY_MODEL")
    if given:
        return given
    p = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    return str(p)


@pytest.mark.parametrize("trace", _recorded() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no recorded llama-server trace in tests/data/trace (only the synthetic one)"))],
    ids=lambda p: p.name if p else "none")
def test_recorded_server_trace_replays_on_cuda(trace, model):
    r = run_replay(trace, model, "cuda")
    assert r.ours[0].backend == "cuda"
    d = diff_replay(r.trace, r.ours, model_facts(model))
    print(f"{trace.name}: {d.decisions_compared} decisions over {d.batches_compared} batches; notes: {d.notes}")
    for rc in d.recaptures:
        print(f"  batch {rc.batch}: trace {rc.trace}\n    graphdiag {rc.graphdiag}")
    assert d.equal, (f"{trace.name}: first difference at batch {d.first[0]}, decision {d.first[1] + 1}: replay "
                     f"{d.first[2]} / trace {d.first[3]}\n replay: {d.replay_batch}\n trace:  {d.trace_batch}")
    for rc in d.recaptures:
        assert not rc.graphdiag[0].startswith("graphdiag made no"), rc

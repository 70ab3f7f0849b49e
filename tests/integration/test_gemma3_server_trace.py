"""A real llama-server trace on the real Gemma 3 270M file, replayed (issue 48): llama.cpp b11434's llama-server
(`-np 4 -kvu -c 16384`) traced on an H100 (2026-12-07) while `graphdiag load` sent it 64 requests from 8
clients (prompts 16-1500 tokens), kept xz-compressed in tests/data/trace. Its 1286 llama_decode batches run
through graphdiag's runtime on the simulated driver decide as the server did, batch by batch (the H100 replay on
CUDA did too), with only the token embedding's GET_ROWS excused; every recapture and refused update named by
graphdiag's ledger. Skipped without the Gemma 3 270M package (the `gemma` extra)."""

from __future__ import annotations

import lzma
from pathlib import Path

from graphdiag.report.analysis.known import model_facts
from graphdiag.report.analysis.replay_diff import diff_replay
from graphdiag.trace.replay import run_replay

FIXTURE = Path(__file__).parents[1] / "data" / "trace" / "server-e2e-gemma3-270m-b11434-h100.raw.jsonl.xz"


def test_gemma3_270m_server_trace_replays_as_recorded(gemma3_file, tmp_path):
    raw = tmp_path / "trace.raw.jsonl"
    raw.write_bytes(lzma.decompress(FIXTURE.read_bytes()))
    r = run_replay(raw, str(gemma3_file), "sim")
    assert r.trace[0].trace["cmd"][0].endswith("llama-server")
    d = diff_replay(r.trace, r.ours, model_facts(str(gemma3_file)))
    assert d.batches_compared == len(r.plan.batches) == 1286
    assert d.equal, f"batch {d.first[0]}: replay {d.first[2]} / trace {d.first[3]}"
    assert {x["name"] for x in d.excused} == {"graph-nodes"}
    refused = [x for x in d.recaptures if "refused" in x.trace]
    assert len(refused) >= 28                        # MMQ's stream-k fixup in and out of the prefill graphs
    for rc in d.recaptures:
        assert rc.graphdiag and not rc.graphdiag[0].startswith("graphdiag made no"), rc

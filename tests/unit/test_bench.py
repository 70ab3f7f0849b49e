"""`graphdiag bench`: one-line errors for impossible values, step rows on the simulated driver, the roofline's
byte counts, the statistics over a run's events, and the PyTorch peer skipping cleanly without torch."""

import json
import re
import sys

import pytest

from graphdiag import events as E
from graphdiag.bench import percentile, roofline as R
from graphdiag.bench.steps import decode_stats, prefill_ms
from graphdiag.cli.main import main
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model


def _one_line_error(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("graphdiag: error:"), err
    return lines[0]


@pytest.mark.parametrize("argv", [["bench", "ledger", "--reps", "0"], ["bench", "ledger", "--batch", "0"],
                                  ["bench", "ledger", "--reps", "-3"], ["bench", "ledger", "--model", "nope"],
                                  ["bench", "steps", "--steps", "2"], ["bench", "steps", "--model", "tiny,nope"],
                                  ["bench", "steps", "--wtype", "q4"], ["bench", "steps", "--prefill", "-1"]])
def test_impossible_values_are_one_line_errors(capsys, argv):
    _one_line_error(capsys, argv)


@pytest.mark.parametrize("argv,says", [
    (["--steps", "99999"], "step 4081 would need 4097"),
    (["--prompt-tokens", "99999"], "the run needs more KV cells than model tiny has"),
    (["--prompt-tokens", "3900"], "instrumentation rounds decode 243 steps after the prompt, 4143 KV cells"),
    (["--prefill", "2000"], "4 prefills of that many tokens in one sequence, 8000 KV cells, and model tiny has 4096 "
                            "(n_ctx): at most --prefill 1024"),
    (["--model", "tiny,1b", "--steps", "4090"], "step 4081 would need 4097"),
])
def test_a_run_the_benchmark_cannot_make_is_refused_before_anything_is_built(capsys, monkeypatch, argv, says):
    """Every run of every row is checked up front, as `graphdiag run` checks its own: no bandwidth copy, no
    model built, no row measured first (the later row's prefill used to fail after the earlier rows ran)."""
    import graphdiag.bench.steps as S

    def built(*a, **k):
        raise AssertionError("something was built before the check")
    monkeypatch.setattr(S, "measure_bandwidth", built)
    monkeypatch.setattr(S, "build_model", built)
    line = _one_line_error(capsys, ["bench", "steps", "--backend", "sim", *argv])
    assert says in line


def test_bench_steps_json_rows_on_the_simulated_driver(capsys):
    rc = main(["bench", "steps", "--backend", "sim", "--model", "tiny", "--wtype", "q8_0", "--steps", "8",
               "--prompt-tokens", "4", "--prefill", "8", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = [json.loads(l) for l in out.out.splitlines()]
    dec, pre = rows
    assert dec["kind"] == "decode" and dec["simulated"] is True and dec["model"] == "tiny"
    assert dec["host_ref_us"] > 0
    for k in ("replay_ms", "eager_ms", "roofline_ms", "replay_p90_ms", "replay_host_ms", "replay_over_roofline"):
        assert dec[k] > 0, k
    assert dec["kernels_per_step"] > 10 and dec["n_kv"] == 256 and "torch_graph_ms" not in dec
    # the instrumentation's share: the same session's replayed steps with and without the record's sinks
    assert dec["instr_bare_ms"] > 0 and dec["instr_on_ms"] > 0 and dec["instr_nvtx_live"] is False
    assert dec["instr_rounds"] >= 1 and dec["instr_share_pct"] is not None
    assert pre["kind"] == "prefill" and pre["n_tokens"] == 8 and pre["prefill_ms"] > 0 and pre["prefill_reps"] == 3
    assert pre["host_ref_us"] > 0 and "torch_host_ref_us" not in pre
    assert dec["gpu_time_source"] == "numpy host time"
    # progress on stderr, which is not a terminal here: plain lines, each phase from 0 to its whole, whose
    # totals are what the inputs make (1 prompt + 8 steps; the instrumentation session; 1 + 3 prefills)
    lines = out.err.splitlines()
    assert all(l.startswith("bench steps: ") for l in lines) and "\x1b" not in out.err
    # a phase's first and last line (a loaded host also prints lines in between, at most every EVERY_S)
    ends = [l for l in lines if l.endswith(("/1", "/9", "/244", "/4"))
            and (l.rsplit(" ", 1)[1].startswith("0/") or len(set(l.rsplit(" ", 1)[1].split("/"))) == 1)]
    assert ends == ["bench steps: device-to-device copy 0/1", "bench steps: device-to-device copy 1/1",
                    "bench steps: tiny q8_0 graphs on 0/9", "bench steps: tiny q8_0 graphs on 9/9",
                    "bench steps: tiny q8_0 graphs off 0/9", "bench steps: tiny q8_0 graphs off 9/9",
                    "bench steps: tiny q8_0 instrumentation 0/244", "bench steps: tiny q8_0 instrumentation 244/244",
                    "bench steps: tiny q8_0 prefill 8 0/4", "bench steps: tiny q8_0 prefill 8 4/4"]


def test_bench_steps_table_labels_simulated_timings(capsys):
    assert main(["bench", "steps", "--backend", "sim", "--wtype", "q8_0", "--steps", "8", "--prompt-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "tiny q8_0 (sim)" in out and "roofline" in out
    assert "numpy in replay (sim)" in out and "GPU replay" not in out
    assert "instrumentation (event record, counters; NVTX idle: no tool) on a replayed step:\n  tiny q8_0 " in out
    assert "host reference before each row:\n  tiny q8_0 " in out
    assert "(µs of a fixed piece of host Python; the host figures scale with it)" in out
    assert max(len(l) for l in out.splitlines()) <= 80


def test_roofline_bytes_count_every_weight_once_but_one_embedding_row():
    cfg = PRESETS["1b"]
    m = create_model(cfg, with_data=False)
    d, dkv, f = cfg.n_embd, cfg.n_embd_kv, cfg.n_ff
    per_layer = 2 * (2 * d * d + 2 * d * dkv + 3 * d * f) + 4 * 2 * d
    want = cfg.n_layer * per_layer + 2 * d * cfg.n_vocab + 4 * d + 2 * d
    assert R.weight_bytes_read(m) == want
    assert R.kv_bytes_read(cfg, 256) == 2 * cfg.n_layer * dkv * 256 * 2
    assert R.roofline_ms(2 * 10**9, 0, 4e12) == pytest.approx(0.5)   # the 1b figure of the notes: ~0.49 ms


def test_a_tied_output_reads_the_whole_embedding_table_as_its_lm_head():
    import dataclasses
    cfg = PRESETS["tiny"]
    untied = R.weight_bytes_read(create_model(cfg, with_data=False))
    tied = R.weight_bytes_read(create_model(dataclasses.replace(cfg, tied_output=True), with_data=False))
    assert tied == untied           # output.weight's bytes gone, the same bytes read from token_embd instead


def test_copy_bandwidth_through_the_simulated_driver():
    from graphdiag.backends.drivers.sim import SimDriver
    drv = SimDriver()
    assert R.copy_bandwidth(drv, 1 << 20, reps=3) > 0
    assert drv.space.used == 0


def _step(step, phase, mode, wall_ms, gpu_ms, launches, n_kv=256):
    return [E.StepStarted(step=step, phase=phase, n_tokens=1, n_seqs=1, n_kv=n_kv),
            E.EagerRun(step=step, n_launches=launches),
            E.StepFinished(step=step, duration_ns=int(wall_ms * 1e6), gpu_ns=int(gpu_ms * 1e6), mode=mode)]


def test_decode_stats_drop_the_warm_up_and_skip_prefills():
    evs = _step(0, "prefill", "eager", 50, 40, 100)
    for i in range(1, 9):
        evs += _step(i, "decode", "eager", 100 if i < 3 else i, 1, 60)
    s = decode_stats(evs, "eager")
    assert s["steps"] == 6 and s["ms"] == pytest.approx(5.5) and s["kernels"] == 60 and s["n_kv"] == 256
    assert s["host_ms"] == pytest.approx(4.5) and s["p90_ms"] == pytest.approx(percentile(range(3, 9), 90))
    assert decode_stats(evs, "replay") == {}
    assert prefill_ms(evs + _step(9, "prefill", "eager", 7, 1, 100)) == [7.0]


def test_decode_stats_time_a_replayed_step_from_its_start_to_its_last_launch():
    evs = []
    for i in range(8):
        t = 1_000_000 * i
        evs += [E.StepStarted(step=i, phase="decode", n_tokens=1, n_seqs=1, n_kv=256, t_ns=t),
                E.ReplayLaunched(step=i, split=0, t_ns=t + 10_000),
                E.ReplayLaunched(step=i, split=1, t_ns=t + 20_000 + 1000 * i),    # a second split: the last
                E.StepFinished(step=i, duration_ns=200_000, gpu_ns=150_000, mode="replay")]
    s = decode_stats(evs, "replay")
    assert s["to_launch_ms"] == pytest.approx(0.0245) and s["host_ms"] == pytest.approx(0.05)
    assert decode_stats(_step(0, "decode", "eager", 1, 1, 60) * 1, "eager")["to_launch_ms"] is None


def test_the_instrumentation_share_pairs_each_instrumented_round_with_the_bare_one_before_it():
    from graphdiag.bench.steps import instrumentation_figures
    # a drift halfway (every step 50 % slower from round 2 on) that a split of all steps would read as the
    # instrumentation's: the bare rounds are mostly before it, the instrumented ones mostly after
    bare = [[100] * 5, [100] * 5, [150] * 5]
    on = [[101] * 5, [151] * 5, [152] * 5]
    f = instrumentation_figures(bare, on)
    assert f["instr_share_pct"] == pytest.approx(100 * 2 / 150) and f["instr_rounds"] == 3   # 1 %, 51 %, 1.3 %
    assert f["instr_bare_ms"] == pytest.approx(100e-6) and f["instr_on_ms"] == pytest.approx(151e-6)
    assert instrumentation_figures([[]], [[5]])["instr_share_pct"] is None


def test_percentile():
    assert percentile([1, 2, 3, 4, 5], 50) == 3 and percentile([1, 2], 90) == pytest.approx(1.9)
    assert percentile([], 50) != percentile([], 50)   # nan


def test_the_torch_peer_skips_cleanly_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)   # import torch -> ImportError
    from graphdiag.bench.torch_peer import torch_decode, torch_prefill
    assert torch_decode(PRESETS["tiny"], 256, 100) == {"torch": "absent"}
    assert torch_prefill(PRESETS["tiny"], 8, [8, 16]) == {"torch": "absent"}


def test_a_peer_row_carries_the_host_reference_taken_right_before_it(monkeypatch):
    """The peers run after every graphdiag row, minutes later: each takes its own host reference, shown
    beside the row's own under both tables; a peer that timed nothing (no torch) takes none."""
    import io
    import graphdiag.bench.steps as S
    import graphdiag.bench.torch_peer as T
    from graphdiag.bench.display import render
    refs = iter([180.0, 185.0])
    monkeypatch.setattr(S, "host_reference_us", lambda: next(refs))
    monkeypatch.setattr(T, "torch_prefill", lambda cfg, n, positions: {"torch": "2.9", "torch_prefill_ms": 10.0})
    monkeypatch.setattr(T, "torch_decode", lambda cfg, n_kv, pos: {"torch": "2.9", "torch_graph_ms": 2.3,
                                                                    "torch_eager_ms": 20.0})
    pre = {"kind": "prefill", "model": "1b", "wtype": "f16", "simulated": False, "n_tokens": 512,
           "prefill_ms": 19.0, "host_ref_us": 350.0}
    dec = {"kind": "decode", "model": "1b", "wtype": "f16", "simulated": False, "n_kv": 256, "replay_ms": 1.2,
           "replay_p90_ms": 1.3, "eager_ms": 1.4, "eager_p90_ms": 1.5, "graph_speedup": 1.17, "replay_gpu_ms": 1.15,
           "replay_host_ms": 0.05, "replay_to_launch_ms": 0.03, "kernels_per_step": 212, "roofline_ms": 0.5,
           "replay_over_roofline": 2.4, "host_ref_us": 340.0}
    S.add_torch_peer(pre, S.Progress())
    S.add_torch_peer(dec, S.Progress())
    assert pre["torch_host_ref_us"] == 180.0 and pre["prefill_vs_torch"] == pytest.approx(1.9)
    assert dec["torch_host_ref_us"] == 185.0
    out = io.StringIO()
    render([dec, pre], file=out)
    text = out.getvalue()
    assert text.count("before its PyTorch peer") == 2
    assert "1b f16 340 / 185" in text and "1b f16 350 / 180" in text
    monkeypatch.setattr(T, "torch_prefill", lambda cfg, n, positions: {"torch": "absent"})
    refs = iter([190.0])
    bare = {k: pre[k] for k in ("kind", "model", "wtype", "simulated", "n_tokens", "prefill_ms", "host_ref_us")}
    S.add_torch_peer(bare, S.Progress())
    assert "torch_host_ref_us" not in bare


def test_the_torch_peers_run_after_every_graphdiag_row(monkeypatch):
    import graphdiag.bench.steps as S
    calls = []

    def row(kind):
        def measured(opts, model, wtype, *rest, **kw):
            calls.append((kind, model, wtype))
            return {"kind": kind, "model": model, "wtype": wtype, "simulated": False}
        return measured

    monkeypatch.setattr(S, "measure_bandwidth", lambda backend, progress: (1e12, False, "GPU"))
    monkeypatch.setattr(S, "decode_row", row("decode"))
    monkeypatch.setattr(S, "prefill_row", row("prefill"))
    monkeypatch.setattr(S, "add_torch_peer", lambda r, progress: calls.append(("peer", r["kind"], r["model"])))
    rows = S.bench_steps(S.StepsOptions(models=("tiny", "moe-tiny"), wtypes=("f16",), prefill=8))
    assert [r["kind"] for r in rows] == ["decode", "prefill", "decode", "prefill"]
    # every graphdiag row first; then a peer per dense row (none for the MoE preset: no peer of it)
    assert calls == [("decode", "tiny", "f16"), ("prefill", "tiny", "f16"), ("decode", "moe-tiny", "f16"),
                     ("prefill", "moe-tiny", "f16"), ("peer", "decode", "tiny"), ("peer", "prefill", "tiny")]


def test_the_progress_bar_is_drawn_between_steps_only(monkeypatch):
    import threading
    from graphdiag.bench.display import RichProgress
    with RichProgress() as p:
        # no refresh thread of rich's: a redraw could land inside a timed step
        assert not any(type(t).__name__ == "_RefreshThread" for t in threading.enumerate())
        drawn = []
        monkeypatch.setattr(p.bar, "refresh", lambda: drawn.append(1))
        p.start("phase", 100)             # drawn at once
        for _ in range(50):
            p.advance()                   # then at most every REFRESH_S
        assert 1 <= len(drawn) <= 3


def test_each_measured_run_starts_from_a_collected_heap(monkeypatch):
    import gc
    import graphdiag.runner
    import graphdiag.bench.steps as S
    order = []
    monkeypatch.setattr(gc, "collect", lambda *a: order.append("collect") or 0)
    monkeypatch.setattr(graphdiag.runner, "run", lambda cfg, scenario, sinks: order.append("run"))
    S._run({"backend": "sim", "model": "tiny", "steps": 8}, S.Progress(), "label")
    assert order == ["collect", "run"]


def test_bench_tables_show_microseconds():
    import io
    from graphdiag.bench.display import render
    row = {"kind": "decode", "model": "tiny", "wtype": "f16", "simulated": False, "replay_ms": 0.385,
           "replay_p90_ms": 0.444, "eager_ms": 0.705, "eager_p90_ms": 0.71, "graph_speedup": 1.83,
           "replay_gpu_ms": 0.192, "replay_host_ms": 0.192, "replay_to_launch_ms": 0.0312, "kernels_per_step": 59,
           "roofline_ms": 0.0076,
           "replay_over_roofline": 50.6, "torch_graph_ms": None, "torch_eager_ms": None,
           "replay_vs_torch_graph": None}
    out = io.StringIO()
    render([row], file=out)
    text = out.getvalue()
    assert "µs" in text and "385.0 (444.0)" in text and "0.385" not in text and "to launch" in text
    assert re.search(r"^to launch +31\.2$", text, re.M)


def test_the_steps_table_shows_microseconds():
    import io
    from graphdiag.report.views.steps import render_steps
    from support.simrun import run_sim
    r = run_sim(steps=2)
    out = io.StringIO()
    render_steps(r.events, file=out, simulated=True)
    text = out.getvalue()
    assert " µs" in text and " ms" not in text


def test_durations_are_shown_in_microseconds_below_a_second():
    from graphdiag.report.analysis.eventlog import fmt_ns
    assert [fmt_ns(n) for n in (850, 12_500, 610_000, 2_700_000, 53_090_000, 11_000_000_000)] == \
        ["0.8 µs", "12.5 µs", "610.0 µs", "2700 µs", "53090 µs", "11.0 s"]


def _decode_row(model, wtype, simulated=False, scale=1.0):
    """A decode result row as decode_row returns it, with wide figures (a 7b step in ms)."""
    return {"kind": "decode", "model": model, "wtype": wtype, "simulated": simulated, "n_kv": 4096,
            "replay_ms": 12.3456 * scale, "replay_p90_ms": 13.4567 * scale, "eager_ms": 14.1 * scale,
            "eager_p90_ms": 15.2 * scale, "graph_speedup": 1.14, "replay_gpu_ms": 11.5 * scale,
            "replay_host_ms": 0.85, "replay_to_launch_ms": 0.0312, "kernels_per_step": 1212, "roofline_ms": 0.5,
            "replay_over_roofline": 24.6, "torch_graph_ms": 2.3, "torch_eager_ms": 20.0,
            "replay_vs_torch_graph": 5.36, "host_ref_us": 340.0, "torch_host_ref_us": 185.0, "copy_GBps": 3912.0,
            "instr_share_pct": 1.23, "instr_nvtx_live": False, "torch": "2.9"}


@pytest.mark.parametrize("simulated", [False, True])
def test_bench_steps_reads_at_80_columns_with_every_number_whole(simulated):
    """Six rows of wide figures in an 80-column console: no line longer than 80 and every cell, whole, on a
    line (the 13-column table was 150 columns wide and rich wrapped or cut its cells)."""
    import io
    from rich.console import Console
    from graphdiag.bench.display import PREFILL_METRICS, decode_metrics, render
    rows = [_decode_row(m, w, simulated, scale) for m, scale in (("tiny", 1.0), ("1b", 10.0), ("moe-tiny", 100.0))
            for w in ("f16", "q8_0")]
    pre = {"kind": "prefill", "model": "7b", "wtype": "q8_0", "simulated": simulated, "n_tokens": 512,
           "prefill_ms": 123.45, "torch_prefill_ms": 100.0, "prefill_vs_torch": 1.2345, "host_ref_us": 300.0}
    out = io.StringIO()
    render(rows + [pre], console=Console(file=out, width=80))
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(l) for l in lines) <= 80 and "…" not in text
    for r in rows:
        label = f"{r['model']} {r['wtype']}" + (" (sim)" if simulated else "")
        header = next(l for l in lines if l.startswith("µs ") and f" {label}" in l)
        for name, cell in decode_metrics(simulated):
            row = next(l for l in lines[lines.index(header):] if l.startswith(name))
            assert cell(r) in row, (name, cell(r), row)
    assert "1234560.0 (1345670.0)" in text          # a 1.2 s step, whole
    after = lines[lines.index("prefill (µs, median of the timed prefills)"):]
    for name, cell in PREFILL_METRICS:
        assert cell(pre) in next(l for l in after if l.startswith(name + " "))
    assert ("numpy in replay (sim)" in text) == simulated and ("GPU replay" in text) == (not simulated)


def test_plain_progress_says_each_phase_s_start_its_end_and_at_most_every_few_seconds():
    import io
    from graphdiag.bench.display import PlainProgress
    now = [0.0]
    out = io.StringIO()
    p = PlainProgress(out, clock=lambda: now[0])
    p.start("tiny f16 graphs on", 6)
    for k in range(6):
        now[0] += 4.0                 # a step every 4 s: a line when EVERY_S (10 s) has passed, and the last
        p.advance()
    p.note("weights 0.10/0.20 GB")    # just said: not due
    now[0] += 11
    p.note("weights 0.20/0.20 GB")
    assert out.getvalue().splitlines() == ["bench steps: tiny f16 graphs on 0/6", "bench steps: tiny f16 graphs on 3/6",
                                           "bench steps: tiny f16 graphs on 6/6",
                                           "bench steps: tiny f16 graphs on · weights 0.20/0.20 GB"]


def test_progress_is_a_bar_on_a_terminal_only():
    import io
    from graphdiag.bench.display import PlainProgress, RichProgress, progress_for

    class Tty(io.StringIO):
        def isatty(self):
            return True
    assert isinstance(progress_for(io.StringIO()), PlainProgress)
    assert isinstance(progress_for(Tty()), RichProgress)


def test_the_driver_micro_benchmark_times_plain_and_pdl_launches():
    """python -m graphdiag.bench.driver's figures, on the simulated driver (the numbers mean nothing here;
    the rows must exist): the PDL launch row only where the GPU has PDL (9.0+)."""
    from graphdiag.backends.drivers.sim import SimDriver
    from graphdiag.bench.driver import bench_launch_and_graphs
    for cc, pdl in (((9, 0), True), ((8, 6), False)):
        drv = SimDriver(compute_capability=cc)
        r = bench_launch_and_graphs(drv, drv.stream_create(), 8)
        assert r["launch_host_us"] > 0 and r["update_ms"] > 0 and r["replay_us_per_kernel"] > 0
        assert (r["launch_host_us_pdl"] is not None) is pdl and not drv.pdl
        assert (r["launch_host_us_loop"] is not None) is pdl and r["launcher"] == "one by one"


def test_rounds_on_the_simulated_driver(capsys):
    """--rounds 2 end to end: one row of two rounds, each round's figures kept, the instrumentation once."""
    rc = main(["bench", "steps", "--backend", "sim", "--model", "tiny", "--steps", "8", "--prompt-tokens", "4",
               "--rounds", "2", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    (row,) = [json.loads(l) for l in out.out.splitlines()]
    assert row["rounds"] == 2 and len(row["per_round"]) == 2 and all(p["replay_ms"] > 0 for p in row["per_round"])
    lo, hi = row["graph_speedup_range"]
    assert lo <= row["graph_speedup"] <= hi and row["instr_share_pct"] is not None
    assert sum(l.endswith("graphs on 0/9") for l in out.err.splitlines()) == 2
    assert sum("instrumentation 0/" in l for l in out.err.splitlines()) == 1

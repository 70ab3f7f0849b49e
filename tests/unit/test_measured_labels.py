"""Labels that say what was measured (issue 25, point 6): on the simulated driver the "gpu" figures are the
host's numpy time and the device timeline is modelled; every view of a simulated record says so, from the
record header's `simulated` flag, and a CUDA record keeps its labels. `diff` marks a timing change within the
runs' spread as noise and never calls a one-sample figure a speedup."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.report.analysis.diff import diff_runs
from graphdiag.report.views.diff import render_run_diff
from graphdiag.report.analysis.eventlog import EventLog
from graphdiag.report.record import write_record
from graphdiag.report.views.steps import render_steps
from graphdiag.report.analysis.summary import summarize
from support import synth


def _cuda(header):
    return dataclasses.replace(header, simulated=False, backend="cuda", device="NVIDIA H200")


def _with_device_time(events: list[E.Event], source: str) -> list[E.Event]:
    """Each finished step preceded by a DeviceTime of 50 kernels, 110 µs busy (as a device source emits)."""
    out = []
    for ev in events:
        if isinstance(ev, E.StepFinished):
            out.append(E.DeviceTime(step=ev.step, t_ns=ev.t_ns - 1, source=source, n_kernels=50, busy_ns=110_000,
                                    span_ns=110_000, attributed=50))
        out.append(ev)
    return out


def _report(tmp_path, header, events, *args) -> str:
    path = tmp_path / "r.jsonl"
    write_record(path, header, events)
    out = io.StringIO()
    from contextlib import redirect_stdout
    with redirect_stdout(out):
        assert main(["report", str(path), *args]) == 0
    return out.getvalue()


def test_the_json_summary_names_what_the_gpu_time_is():
    header, events = synth.steady_decode()
    assert summarize(header, events).to_dict()["gpu_time_source"] == "numpy host time"
    assert summarize(_cuda(header), events).to_dict()["gpu_time_source"] == "cuda events"
    cpu = dataclasses.replace(header, backend="cpu", device="CPU")
    assert summarize(cpu, events).to_dict()["gpu_time_source"] == ""
    d = summarize(header, events).to_dict()
    assert "step gpu" in d["timings"] and set(d["timings"]["step gpu"]) == {"median_ns", "n", "spread_ns"}


def test_a_simulated_record_labels_its_modelled_device_and_numpy_gpu_time(tmp_path):
    header, events = synth.steady_decode()
    sim = _report(tmp_path, header, _with_device_time(events, "modelled"), "-vv")
    assert "dev busy (modelled)" in sim and "dev idle (modelled)" in sim
    assert "step gpu (numpy host time)" in sim
    assert "(numpy host 400.0 µs)" in sim and "(gpu 400.0 µs)" not in sim     # -vv step lines
    real = _report(tmp_path, _cuda(header), _with_device_time(events, "cupti"), "-vv")
    assert "dev busy " in real and "(modelled)" not in real and "numpy" not in real
    assert "(gpu 400.0 µs)" in real


def test_the_steps_table_names_the_gpu_column_by_what_it_measured():
    _, events = synth.steady_decode()
    sim, real = io.StringIO(), io.StringIO()
    render_steps(events, file=sim, simulated=True)
    render_steps(events, file=real, simulated=False)
    assert "gpu (numpy)" in sim.getvalue() and "numpy" not in real.getvalue() and " gpu " in real.getvalue()


def test_the_live_event_log_names_the_step_gpu_time_only_once_told_the_run_is_simulated():
    ev = E.StepFinished(step=3, t_ns=1, duration_ns=900_000, gpu_ns=400_000, mode="replay")
    log = EventLog()
    assert log.feed(ev) == [(2, "step 3 · done · replay · 900.0 µs (gpu 400.0 µs)")]
    log.gpu_label = "numpy host"
    assert log.feed(ev) == [(2, "step 3 · done · replay · 900.0 µs (numpy host 400.0 µs)")]


def test_a_speedup_from_one_sample_says_so():
    header, events = synth.steady_decode()          # one eager decode step against five replays
    out = io.StringIO()
    from graphdiag.report.views.console import render_summary
    render_summary(summarize(header, events), file=out)
    line = next(l for l in out.getvalue().splitlines() if "eager decode step ÷ replay step" in l)
    assert "(1 sample)" in line and "speedup" not in line
    header, events = synth.pressure_and_idle()      # three of each: a speedup
    out = io.StringIO()
    render_summary(summarize(header, events), file=out)
    line = next(l for l in out.getvalue().splitlines() if "eager decode step ÷ replay step" in l)
    assert "replay speedup" in line and "sample" not in line


def test_the_plot_axis_says_a_simulated_wall_is_numpy_host_time():
    plt = pytest.importorskip("matplotlib.pyplot")
    from graphdiag.report.analysis.accounting import account
    from graphdiag.report.views.plot import figure
    _, events = synth.steady_decode()
    events = _with_device_time(events, "modelled")
    fig = figure(plt, account(events), events, "", simulated=True)
    top = fig.axes[0]
    assert "numpy" in top.get_ylabel() and "SIMULATED" in top.get_ylabel()
    assert "sim device busy (modelled)" in [t.get_text() for t in top.get_legend().get_texts()]
    plt.close(fig)
    fig = figure(plt, account(events), events, "", simulated=False)
    assert fig.axes[0].get_ylabel() == "step wall time (µs)"
    plt.close(fig)


# -- diff: medians with their spread; noise, one sample ---------------------------------------------------
def _scaled(run, factor: float, mode: str = "replay", shift_ns: int = 0):
    """The run with the wall time of its `mode` steps scaled by `factor` and shifted by shift_ns."""
    header, events = run
    out = [dataclasses.replace(e, duration_ns=int(e.duration_ns * factor) + shift_ns)
           if isinstance(e, E.StepFinished) and e.mode == mode else e for e in events]
    return header, out


def _timings(d):
    return {t.name: t for t in d.timings}


def test_a_change_within_the_runs_spread_is_noise():
    control = synth.steady_decode()      # replayed steps 900 µs + 1 µs per step: a spread of 1 µs
    t = _timings(diff_runs(control, _scaled(control, 1.0, shift_ns=1_500)))["step (replay)"]
    assert (t.control_n, t.test_n) == (5, 5) and t.control_spread == t.test_spread == 1_000
    assert t.delta == 1_500 and t.verdict == "noise"
    t = _timings(diff_runs(control, _scaled(control, 0.5)))["step (replay)"]
    assert t.verdict == "faster" and t.delta < 0
    t = _timings(diff_runs(control, _scaled(control, 2.0)))["step (replay)"]
    assert t.verdict == "slower"


def test_a_change_from_one_sample_is_never_a_speedup():
    control = synth.steady_decode()      # one captured step per run
    d = diff_runs(control, _scaled(control, 0.2, mode="capture"))
    t = _timings(d)["step (capture)"]
    assert (t.control_n, t.test_n, t.control_spread) == (1, 1, 0) and t.verdict == "1 sample"
    out = io.StringIO()
    render_run_diff(d, out)
    row = next(l for l in out.getvalue().splitlines() if l.startswith("step (capture)"))
    assert row.rstrip().endswith("(1 sample)") and "%" not in row
    replay = next(l for l in out.getvalue().splitlines() if l.startswith("step (replay) "))
    assert replay.rstrip().endswith("noise")
    j = json.loads(d.to_json())
    cap = next(x for x in j["timings"] if x["name"] == "step (capture)")
    assert cap["verdict"] == "1 sample" and cap["control_n"] == 1 and "control_spread" in cap
    assert j["gpu_time_source"] == ["numpy host time", "numpy host time"]


def test_diff_of_a_simulated_and_a_cuda_record_names_both_gpu_times():
    header, events = synth.steady_decode()
    d = diff_runs((header, events), (_cuda(header), events))
    assert d.gpu_time_source == ("numpy host time", "cuda events")
    out = io.StringIO()
    render_run_diff(d, out)
    assert "step gpu (numpy host time)" in out.getvalue()
    out = io.StringIO()
    render_run_diff(diff_runs((_cuda(header), events), (_cuda(header), events)), out)
    assert "numpy" not in out.getvalue() and "step gpu " in out.getvalue()

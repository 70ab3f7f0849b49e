"""The terminal report: golden files for synthetic runs, the header, the live sink's levels."""

from __future__ import annotations

import io
import os

import pytest

from graphdiag import events as E
from graphdiag.report.sinks.console import ConsoleReporter
from graphdiag.report.views.console import header_lines, render_report
from graphdiag.report.record import RunHeader
from graphdiag.report.analysis.summary import summarize
from support import synth
from support.normalise import check_golden

UPDATE = bool(os.environ.get("GRAPHDIAG_UPDATE_GOLDEN"))


def _report(run, verbosity=0) -> str:
    header, events = run
    buf = io.StringIO()
    render_report(header, events, summarize(header, events), buf, verbosity=verbosity)
    return buf.getvalue()


@pytest.mark.parametrize("name, run, verbosity", [
    ("report_steady_decode", synth.steady_decode, 0),
    ("report_batch_change_v", synth.batch_change, 1),
    ("report_moe_offload", synth.moe_offload, 0),
    ("report_pressure_and_idle", synth.pressure_and_idle, 0),
])
def test_report_golden(name, run, verbosity):
    check_golden(name, _report(run(), verbosity), update=UPDATE)


def test_report_recapture_line_names_node_field_and_cause():
    text = _report(synth.batch_change())
    assert ("step 5 · split 0 · key 0x5eed0000a8f0 · node 41 __fattn__-3 src[1].ne[1] 8→9 (+69 more nodes)"
            " · warmup reset") in text.splitlines()


def test_report_verbosity_levels_add_lines():
    run = synth.batch_change()
    quiet, v, vv = (_report(run, n) for n in (0, 1, 2))
    assert "update refused: TOPOLOGY_CHANGED" not in quiet and "update refused: TOPOLOGY_CHANGED" in v
    assert "uid 2 hit" not in v and "uid 2 hit" in vv
    assert len(quiet.splitlines()) < len(v.splitlines()) < len(vv.splitlines())


def test_report_header_says_simulated_or_names_the_gpu():
    sim = header_lines(synth.header())
    assert "SIMULATED GPU: simulated GPU (cc 9.0)" in sim[0]
    gpu = header_lines(RunHeader(backend="cuda", device="NVIDIA H200", simulated=False, model="tiny"))
    assert "GPU: NVIDIA H200" in gpu[0] and "SIMULATED" not in gpu[0]
    assert not any(line.startswith("eager launches") for line in sim + gpu)   # an older record: not said
    looped = header_lines(RunHeader(backend="cuda", device="NVIDIA H200", simulated=False, model="tiny",
                                    launcher="C loop"))
    assert "eager launches: C loop" in looped


def test_report_header_marks_where_each_setting_came_from():
    h = synth.header(batch=8, chunk_size=512)
    h.settings["graphs_disabled"] = True
    h.sources["graphs_disabled"] = "env GGML_CUDA_DISABLE_GRAPHS"
    h.sources["chunk_size"] = "scenario"
    text = " ".join(header_lines(h))
    assert "batch=8 [cli]" in text
    assert "graphs_disabled=on [env GGML_CUDA_DISABLE_GRAPHS]" in text
    assert "chunk_size=512 [scenario]" in text
    assert "model=tiny " in text                          # defaults carry no mark


def test_report_live_sink_prints_up_to_its_verbosity_without_progress_off_a_tty():
    buf = io.StringIO()
    header, events = synth.batch_change()
    with ConsoleReporter(header, verbosity=0, file=buf, total_steps=9) as rep:
        assert rep.progress is None                       # a StringIO is not a terminal
        for ev in events:
            rep(ev)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("graphdiag ")
    assert not any("chunk 0" in line for line in lines)   # -v only
    assert sum("warmup reset" in line for line in lines) == 1


def test_report_live_sink_progress_bar_advances_per_step():
    buf = io.StringIO()
    rep = ConsoleReporter(synth.header(), file=buf, total_steps=3, progress=True)
    for step in range(3):
        rep(E.StepFinished(step=step, mode="replay"))
    assert rep.progress.tasks[0].completed == 3
    rep.close()
    assert rep.progress is None


def test_report_live_sink_started_by_the_header_hook():
    buf = io.StringIO()
    rep = ConsoleReporter(verbosity=0, file=buf)
    assert buf.getvalue() == ""
    header, events = synth.steady_decode(n_replays=1)
    rep.start(header.to_dict())
    for ev in events:
        rep(ev)
    rep.close()
    assert buf.getvalue().startswith("graphdiag 0.1.0 · backend sim")
    assert "eager → capture · warmup complete" in buf.getvalue()

"""The trace-event timeline and the time accounting of a simulated run (issue 11)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.report.analysis.accounting import account
from graphdiag.report.sinks.timeline import TimelineWriter
from graphdiag.runner import run

STEPS = 8


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    path = tmp_path_factory.mktemp("timeline") / "run.json"
    tl = TimelineWriter(path)
    cfg = resolve({"backend": "sim", "model": "tiny", "steps": STEPS, "prompt_tokens": 8, "nvtx": False},
                  environ={})
    sc = SimpleNamespace(name="t", timeline=[{"at_step": 5, "batch": 2}])   # 1 -> 2 tokens: refused update
    try:
        result = run(cfg, sc, span_sinks=[tl], on_header=tl.start, device_sinks=[tl.add_device])
    finally:
        tl.close()
    return json.loads(path.read_text()), result


def test_trace_is_chrome_trace_event_json(traced):
    doc, _ = traced
    evs = doc["traceEvents"]
    assert doc["otherData"]["simulated_device"] is True
    assert {e["ph"] for e in evs} <= {"X", "M", "i", "C"}
    for e in evs:
        assert isinstance(e["pid"], int) and 1 <= e["pid"] <= 2
        if e["ph"] != "M" or "tid" in e:
            assert isinstance(e["tid"], int) and 0 < e["tid"] < 32      # small integer track ids
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0


def test_tracks_are_named_and_the_device_is_labelled_simulated(traced):
    doc, _ = traced
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs[1] == "graphdiag host runtime" and "SIMULATED" in procs[2]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] != "M"}
    assert used <= set(tracks), "every track in use is named"
    device = [n for (pid, _), n in tracks.items() if pid == 2]
    assert any(n.startswith("stream") for n in device) and "graph launches (SIMULATED)" in device
    assert all("SIMULATED" in n for n in device)


def test_one_slice_per_step_and_decisions_present(traced):
    doc, result = traced
    steps = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["name"].startswith("step ")]
    finished = [e.step for e in result.events if isinstance(e, E.StepFinished)]
    assert steps == [f"step {s}" for s in finished]
    instants = {e["name"] for e in doc["traceEvents"] if e["ph"] == "i"}
    for want in ("warmup complete", "warmup reset", "recapture", "instantiate", "update refused: TOPOLOGY_CHANGED"):
        assert want in instants, (want, instants)
    cause = next(e for e in doc["traceEvents"] if e["ph"] == "i" and e["name"] == "recapture")
    assert "ne[1]" in cause["args"]["cause"]
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counters and counters[-1]["args"]["executables"] >= 1 and counters[-1]["args"]["entries"] >= 1


def test_replayed_kernels_are_named_by_graph_node(traced):
    doc, result = traced
    kernels = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"]
    replayed = [k for k in kernels if "graph_node_id" in k["args"]]
    assert replayed and all(k["args"]["named via"] == "node id" for k in replayed)
    assert all(k["name"] == k["args"]["nodes"] for k in kernels), "every kernel named by its graphdiag nodes"
    assert any("+" in k["name"] for k in replayed), "a fused kernel names every node it computes"
    # a replayed step: as many kernel records as the captured graph has kernel nodes
    dts = {e.step: e for e in result.events if isinstance(e, E.DeviceTime)}
    replay = [e.step for e in result.events if isinstance(e, E.StepFinished) and e.mode == "replay"]
    captured = [e for e in result.events if isinstance(e, E.ChunkCaptured)]
    assert dts[replay[0]].n_kernels == sum(c.n_graph_nodes for c in captured if c.step == captured[0].step)
    assert dts[replay[0]].attributed == dts[replay[0]].n_kernels


def test_open_slices_are_closed_at_write_time(tmp_path):
    tl = TimelineWriter(tmp_path / "cut.json")
    tl(E.SpanBegin(step=0, t_ns=1_000, name="step", category="run/step", payload=0))
    tl(E.SpanBegin(step=0, t_ns=2_000, name="graph_compute", category="graph/compute"))
    tl(E.WarmupTransition(step=0, t_ns=3_000, key=1, to_state="cold", why="warmup reset"))
    tl.close()
    doc = json.loads((tmp_path / "cut.json").read_text())
    xs = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert set(xs) == {"step 0", "graph_compute"}
    assert xs["step 0"]["dur"] == 2.0 and xs["graph_compute"]["dur"] == 1.0


def test_accounting_on_the_simulated_driver_is_host_bound(traced):
    """The wall time is numpy's on the host and the device busy time modelled (µs): every phase is
    host-bound (it read "GPU" for replays when the bound ignored the host's time before the first kernel)."""
    _, result = traced
    acc = account(result.events)
    phases = {p.phase: p for p in acc.phases}
    assert acc.source == "modelled"
    assert {p.bound for p in phases.values()} == {"host"}
    assert phases["replay"].busy_ns * 2 < phases["replay"].wall_ns
    assert phases["replay"].mgmt["launch"] > 0 and phases["capture"].mgmt["instantiate"] > 0
    assert phases["replay"].idle_ns < phases["eager"].idle_ns
    assert acc.tokens > 0 and acc.mgmt_per_token_ns == acc.mgmt_total_ns // acc.tokens
    assert acc.top_kernels and acc.attributed == acc.kernels


def test_run_cli_timeline_flag(tmp_path):
    from click.testing import CliRunner

    from graphdiag.cli.main import cli, _register
    _register()
    out = tmp_path / "t.json"
    r = CliRunner().invoke(cli, ["run", "--backend", "sim", "--steps", "3", "--prompt-tokens", "4", "--no-nvtx",
                                 "--timeline", str(out)])
    assert r.exit_code == 0, r.output
    assert "Time per step" in r.output and "graph management per token" in r.output
    doc = json.loads(out.read_text())
    assert sum(e["ph"] == "X" and e["name"].startswith("step ") for e in doc["traceEvents"]) == 4


def test_accounting_tables_fit_80_columns(traced):
    import io
    from rich.console import Console
    from graphdiag.report.views.accounting import accounting_tables
    _, result = traced
    out = io.StringIO()
    con = Console(file=out, width=80, color_system=None)
    for t in accounting_tables(account(result.events), simulated=True):
        con.print(t)
    lines = out.getvalue().splitlines()
    assert lines and max(len(l.rstrip()) for l in lines) <= 80

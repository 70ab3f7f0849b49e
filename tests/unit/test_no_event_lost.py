"""Issue 25, point 3: no event lost. A sink that raises is cut off alone and reported once, every other sink
and the record still get every event; the record is flushed at every step end; an unwritable or shared
--events/--timeline fails before the run; `--events -` writes JSON lines alone to stdout; SIGTERM and a
second Ctrl-C still leave a written timeline and a record that says how the run ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.report.record import read_record

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--backend", "sim", "--prompt-tokens", "4"]


def _ev(step):
    return E.StepStarted(step=step, t_ns=1)


# -- the bus ---------------------------------------------------------------------------------------------
def test_a_sink_that_raises_is_cut_off_alone_and_the_others_get_every_queued_event():
    bus, before, after, told, calls = E.EventBus(), [], [], [], []

    def bad(ev):
        calls.append(ev.step)
        if ev.step == 1:
            raise ValueError("boom")
    bus.subscribe(before.append)
    bus.subscribe(bad)
    bus.subscribe(after.append)
    bus.on_sink_error = told.append
    bus.hold()
    for i in range(5):
        bus.emit(_ev(i))
    bus.release()                                        # nothing raised: the sink was an observer
    for seen in (before, after):
        assert [e.step for e in seen if isinstance(e, E.StepStarted)] == [0, 1, 2, 3, 4]
        failed = [e for e in seen if isinstance(e, E.SinkFailed)]
        assert len(failed) == 1 and failed[0].step == 1 and failed[0].error == "ValueError: boom"
    assert calls == [0, 1]                               # cut off: nothing more reaches it
    assert len(told) == 1 and told[0].sink == "test_a_sink_that_raises_is_cut_off_alone_and_the_others_get_every_queued_event.<locals>.bad"
    bus.emit(_ev(5))
    assert calls == [0, 1] and len(told) == 1            # reported once


def test_an_essential_sink_error_is_raised_once_every_other_sink_has_the_whole_queue():
    bus, other = E.EventBus(), []

    def record(ev):
        if ev.step == 1:
            raise OSError("disk full")
    bus.subscribe(record, essential=True)
    bus.subscribe(other.append)
    bus.hold()
    for i in range(4):
        bus.emit(_ev(i))
    with pytest.raises(OSError, match="disk full"):
        bus.release()
    assert [e.step for e in other] == [0, 1, 2, 3]


@pytest.mark.parametrize("exc", [BrokenPipeError("output closed"), KeyboardInterrupt()])
def test_a_closed_output_or_an_interrupt_ends_the_run_after_the_others_have_the_event(exc):
    bus, other = E.EventBus(), []

    def console(ev):
        if ev.step == 0:
            raise exc
    bus.subscribe(console)
    bus.subscribe(other.append)
    bus.hold()
    bus.emit(_ev(0))
    bus.emit(_ev(1))
    with pytest.raises(type(exc)):
        bus.release()
    assert [e.step for e in other] == [0, 1] and not bus.cut_off


def test_a_span_sink_and_its_side_channel_are_cut_off_together():
    class Timeline:
        sink_name = "the timeline t.json"

        def __init__(self):
            self.spans, self.devices = [], []

        def __call__(self, ev):
            self.spans.append(ev)

        def add_device(self, records):
            raise RuntimeError("bad record")
    bus, plain, tl = E.EventBus(), [], Timeline()
    bus.subscribe(plain.append)
    bus.subscribe(tl, spans=True)
    bus.guarded(tl.add_device, 3, ["r"])
    with bus.span("step", "run/step", 0, 4):
        pass
    bus.guarded(tl.add_device, 4, ["r"])                 # skipped: the owner is cut off
    assert tl.spans == [] and bus.cut_off == [tl]
    assert [(e.sink, e.step, e.error) for e in plain] == [("the timeline t.json", 3, "RuntimeError: bad record")]


# -- a run whose terminal report fails -------------------------------------------------------------------
def test_a_failing_terminal_report_is_cut_off_and_the_record_gets_every_event(capsys, tmp_path, monkeypatch):
    from graphdiag.report.sinks.console import ConsoleReporter
    good = tmp_path / "good.jsonl"
    assert main(["run", *QUICK, "--steps", "4", "--events", str(good)]) == 0
    capsys.readouterr()
    real = ConsoleReporter.__call__

    def fails_at_step_2(self, ev):
        if ev.step == 2 and isinstance(ev, E.StepStarted):
            raise ValueError("terminal too narrow")
        return real(self, ev)
    monkeypatch.setattr(ConsoleReporter, "__call__", fails_at_step_2)
    path = tmp_path / "run.jsonl"
    assert main(["run", *QUICK, "--steps", "4", "--events", str(path)]) == 0
    cap = capsys.readouterr()
    warns = [l for l in cap.err.splitlines() if l.strip()]
    assert warns == ["graphdiag: warning: the terminal report failed at step 2 (ValueError: terminal too narrow): "
                     "cut off, every other output still gets every event"]
    assert "cut off: the terminal report at step 2: ValueError: terminal too narrow" in cap.out   # the summary
    kinds = [e.kind for e in read_record(path)[1]]
    want = [e.kind for e in read_record(good)[1]]
    i = kinds.index("sink_failed")
    assert kinds[:i] + kinds[i + 1:] == want and want[-1] == "run_ended"
    monkeypatch.undo()
    assert main(["report", str(path)]) == 0
    assert "cut off: the terminal report at step 2" in capsys.readouterr().out


# -- the record is flushed at every step end ------------------------------------------------------------
def test_the_record_on_disk_holds_every_step_handed_over_while_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A step's events reach the record once the next step's work is queued (the bus's held delivery), and
    are on disk from then on: when step N starts, the record holds step N-2's StepFinished (step N-1's
    arrives once N's work is queued). A kill loses the step in flight, not a buffer's worth of steps."""
    from graphdiag.runner import Stepper
    path, seen = tmp_path / "run.jsonl", []
    real = Stepper.step

    def look(self, p):
        lines = path.read_text().split("\n")[:-1]          # complete lines only
        done = [json.loads(l)["step"] for l in lines[1:] if '"kind":"step_finished"' in l]
        seen.append((self.s.ctx.step, max(done, default=-1)))
        return real(self, p)
    monkeypatch.setattr(Stepper, "step", look)
    assert main(["run", *QUICK, "--steps", "12", "-vv", "--events", str(path)]) == 0
    assert seen == [(n, n - 2 if n >= 2 else -1) for n in range(13)], seen


# -- outputs checked before the run ---------------------------------------------------------------------
@pytest.fixture
def no_model(monkeypatch):
    """Building a model fails the test, even where a later error (a close's) would hide the failure."""
    import graphdiag.runner as runner
    built = []
    monkeypatch.setattr(runner, "build_model", lambda *a, **kw: built.append(1) or pytest.fail("a model was built"))
    yield
    assert not built, "a model was built"


def _one_line(capsys, argv, code=2):
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == code and len(lines) == 1 and lines[0].startswith("graphdiag: error:"), err
    return lines[0]


@pytest.mark.parametrize("flag,what", [("--events", "the event record"), ("--timeline", "the timeline")])
def test_an_unwritable_output_fails_before_any_model_is_built(capsys, no_model, flag, what):
    line = _one_line(capsys, ["run", *QUICK, "--steps", "2", flag, "/dev/full"])
    assert f"cannot write {what} /dev/full: No space left on device" in line


def test_the_same_file_for_events_and_timeline_is_refused(capsys, no_model, tmp_path):
    a = tmp_path / "out.json"
    line = _one_line(capsys, ["run", *QUICK, "--events", str(a), "--timeline", str(a)])
    assert "--events and --timeline name the same file" in line
    a.write_text("")
    (tmp_path / "link.json").symlink_to(a)
    line = _one_line(capsys, ["run", *QUICK, "--events", str(a), "--timeline", str(tmp_path / "link.json")])
    assert "the same file" in line


# -- --events - ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [[], ["--json"], ["-vv"]])
def test_events_to_stdout_leave_only_json_lines_there(capsys, tmp_path, monkeypatch, extra):
    monkeypatch.chdir(tmp_path)
    assert main(["run", *QUICK, "--steps", "2", "--events", "-", *extra]) == 0
    cap = capsys.readouterr()
    objs = [json.loads(l) for l in cap.out.splitlines()]
    assert objs[0]["schema"] == "graphdiag-events" and objs[-1]["kind"] == "run_ended"
    assert sum(o.get("kind") == "step_finished" for o in objs) == 3
    if extra == ["--json"]:                                             # the report went to stderr
        assert json.loads(cap.err)["ended"]["status"] == "complete"
    else:
        assert "3 steps (" in cap.err and "graphs reused" in cap.err
    assert not (tmp_path / "-").exists()


def test_events_to_a_closed_stdout_end_quietly():
    p = subprocess.Popen([sys.executable, "-m", "graphdiag", "run", *QUICK, "--steps", "400", "--events", "-"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "graphdiag: error" not in err and "Traceback" not in err, err


# -- SIGTERM and a second Ctrl-C ------------------------------------------------------------------------
def _wait_for_steps(path: Path, n: int, proc, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if path.exists() and path.read_text().count('"kind":"step_finished"') >= n:
            return
        time.sleep(0.05)
    pytest.fail(f"the record never showed {n} finished steps (rc {proc.poll()})")


def test_sigterm_ends_the_run_as_an_interrupt_and_writes_the_timeline(tmp_path):
    rec, tl = tmp_path / "run.jsonl", tmp_path / "t.json"
    p = subprocess.Popen([sys.executable, "-m", "graphdiag", "run", *QUICK, "--steps", "4000", "--events", str(rec),
                          "--timeline", str(tl)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    _wait_for_steps(rec, 3, p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert err.decode().strip().startswith("graphdiag: terminated (SIGTERM) at step")
    assert b"summary of the steps so far" in out
    ended = read_record(rec)[1][-1]
    assert ended.kind == "run_ended" and ended.status == "interrupted" and ended.reason == "SIGTERM"
    doc = json.loads(tl.read_text())
    assert sum(e.get("name", "").startswith("step ") for e in doc["traceEvents"]) >= 3


def test_a_second_ctrl_c_while_the_timeline_is_written_still_writes_it(capsys, tmp_path, monkeypatch):
    from graphdiag.report.sinks.timeline import TimelineWriter
    from graphdiag.runner import Stepper
    real_step, real_meta = Stepper.step, TimelineWriter._metadata

    def stop_at_3(self, p):
        if self.s.ctx.step == 3:
            raise KeyboardInterrupt
        return real_step(self, p)

    def second_ctrl_c(self):
        signal.raise_signal(signal.SIGINT)               # the impatient user, while the file is being written
        return real_meta(self)
    monkeypatch.setattr(Stepper, "step", stop_at_3)
    monkeypatch.setattr(TimelineWriter, "_metadata", second_ctrl_c)
    tl, rec = tmp_path / "t.json", tmp_path / "run.jsonl"
    assert main(["run", *QUICK, "--steps", "8", "--timeline", str(tl), "--events", str(rec)]) == 130
    doc = json.loads(tl.read_text())
    assert any(e.get("name") == "step 2" for e in doc["traceEvents"])
    assert read_record(rec)[1][-1].reason == "Ctrl-C"


def test_the_sigterm_handler_is_the_previous_one_once_the_run_ends(capsys):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert main(["run", *QUICK, "--steps", "1"]) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_an_interrupt_right_after_a_step_holds_the_bus_still_ends_the_record(capsys, tmp_path, monkeypatch):
    """A signal can land between a step's bus.hold() and the try whose finally releases it (seen under load:
    SIGTERM, exit 143, the record ending mid-step with no RunEnded, every later event queued on a bus left
    holding). The walk's end releases every hold, so the record still ends with its RunEnded."""
    from graphdiag.events.bus import EventBus
    from graphdiag.runner import Stepper
    path, calls = tmp_path / "run.jsonl", []
    real = EventBus.hold

    def hold_then_interrupt(self):
        real(self)
        if sys._getframe(1).f_code is Stepper.step.__code__:
            calls.append(1)
            if len(calls) == 3:      # step 2's hold, held
                raise KeyboardInterrupt
    monkeypatch.setattr(EventBus, "hold", hold_then_interrupt)
    assert main(["run", *QUICK, "--steps", "8", "--events", str(path)]) == 130
    events = read_record(path)[1]
    assert [e.kind for e in events].count("step_finished") == 2
    assert events[-1].kind == "run_ended" and events[-1].status == "interrupted" and events[-1].reason == "Ctrl-C"

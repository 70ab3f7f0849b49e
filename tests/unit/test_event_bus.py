"""The event bus's held delivery: observers get a step's events in order once its work is queued, while the
run's own state (internal sinks) and span sinks see each event as it happens."""

from __future__ import annotations

import pytest

from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.runner import run


def _ev(step):
    return E.StepStarted(step=step, phase="decode", n_tokens=1, n_seqs=1, n_kv=256)


def test_held_events_reach_plain_sinks_in_order_at_flush():
    bus = E.EventBus(clock=iter(range(1, 100)).__next__)
    plain, internal, spans = [], [], []
    bus.subscribe(plain.append)
    bus.subscribe(internal.append, internal=True)
    bus.subscribe(spans.append, spans=True)
    bus.hold()
    bus.emit(_ev(0))
    bus.emit(_ev(1))
    assert plain == [] and [e.step for e in internal] == [0, 1] and len(spans) == 2
    assert [e.t_ns for e in internal] == [1, 2]             # stamped when emitted, not when delivered
    bus.flush()
    assert [e.step for e in plain] == [0, 1]
    bus.emit(_ev(2))                                        # still holding after a flush
    assert len(plain) == 2
    bus.release()
    bus.emit(_ev(3))                                        # released: delivered at once
    assert [e.step for e in plain] == [0, 1, 2, 3]



def test_internal_sinks_with_kinds_get_only_those_types_in_subscription_order():
    bus = E.EventBus()
    seen = []
    every = bus.subscribe(lambda ev: seen.append(("every", type(ev).__name__)), internal=True)
    bus.subscribe(lambda ev: seen.append(("steps", type(ev).__name__)), internal=True, kinds=(E.StepStarted,))
    bus.subscribe(lambda ev: seen.append(("all", type(ev).__name__)), internal=True, kinds=(E.Event,))
    bus.emit(_ev(0))
    bus.emit(E.UidHit(step=0))
    assert seen == [("every", "StepStarted"), ("steps", "StepStarted"), ("all", "StepStarted"),
                    ("every", "UidHit"), ("all", "UidHit")]
    seen.clear()
    bus.subscribe(lambda ev: seen.append(("late", type(ev).__name__)), internal=True, kinds=(E.UidHit,))
    bus.unsubscribe(every)                     # both change the routes already worked out
    bus.emit(E.UidHit(step=1))
    bus.emit(_ev(1))
    assert seen == [("all", "UidHit"), ("late", "UidHit"), ("steps", "StepStarted"), ("all", "StepStarted")]
    with pytest.raises(ValueError, match="only internal sinks"):
        bus.subscribe(print, kinds=(E.UidHit,))

def test_holds_nest_and_only_the_outermost_release_delivers():
    bus = E.EventBus()
    seen = []
    bus.subscribe(seen.append)
    bus.hold()                      # a run
    bus.hold()                      # one of its steps
    bus.emit(_ev(0))
    bus.release()
    assert seen == []               # the run still holds: the step's end waits for the next flush
    bus.release()
    assert [e.step for e in seen] == [0]
    bus.release()                   # an unmatched release is harmless
    bus.emit(_ev(1))
    assert [e.step for e in seen] == [0, 1]


def test_an_event_emitted_by_a_sink_during_flush_is_delivered_too():
    bus = E.EventBus()
    seen = []

    def sink(ev):
        seen.append(ev.step)
        if ev.step == 0:
            bus.emit(_ev(9))
    bus.subscribe(sink)
    bus.hold()
    bus.emit(_ev(0))
    bus.release()
    assert seen == [0, 9]


def test_a_failing_essential_sink_leaves_the_bus_unheld():
    bus = E.EventBus()

    def bad(ev):
        raise OSError("disk full")
    bus.subscribe(bad, essential=True)
    bus.hold()
    bus.emit(_ev(0))
    with pytest.raises(OSError):
        bus.release()
    seen = []
    bus.unsubscribe(bad)
    bus.subscribe(seen.append)
    bus.emit(_ev(1))
    assert [e.step for e in seen] == [1]


def test_a_replayed_step_reaches_the_sinks_after_its_graph_launch(monkeypatch):
    """The record's sinks run while the GPU computes: a replayed step's events, and the previous step's
    last ones, reach a sink after the step's graph was launched, and every event still arrives in
    emission order."""
    from graphdiag.backends.drivers.sim import SimDriver
    order = []
    launch = SimDriver.graph_launch

    def traced_launch(self, exec_, stream):
        order.append(("launch",))
        return launch(self, exec_, stream)
    monkeypatch.setattr(SimDriver, "graph_launch", traced_launch)

    def sink(ev):
        if isinstance(ev, (E.StepStarted, E.StepFinished)):
            order.append((type(ev).__name__, ev.step))
    r = run(resolve({"backend": "sim", "model": "tiny", "steps": 5, "prompt_tokens": 4}, environ={}), sinks=[sink])
    replayed = [e.step for e in r.events if isinstance(e, E.StepFinished) and e.mode == "replay"]
    assert replayed
    last = replayed[-1]
    launches = [i for i, o in enumerate(order) if o == ("launch",)]
    # in a run the bus stays held between steps: the previous step's end and this step's start reach the
    # sinks after this step's graph launch (while the GPU runs it), the last step's end when the run ends
    assert launches[-1] < order.index(("StepFinished", last - 1)) < order.index(("StepStarted", last)), order[-6:]
    assert order[-1] == ("StepFinished", last)
    ts = [e.t_ns for e in r.events]
    assert ts == sorted(ts)


@pytest.mark.parametrize("cls", sorted(E.EVENT_TYPES.values(), key=lambda c: c.kind), ids=lambda c: c.kind)
def test_every_event_class_builds_as_its_dataclass_fields_say_and_stays_frozen(cls):
    import dataclasses
    fs = dataclasses.fields(cls)
    ev = cls()
    assert [getattr(ev, f.name) for f in fs] == [f.default for f in fs]
    values = [f"v{i}" for i in range(len(fs))]
    pos, kw = cls(*values), cls(**{f.name: v for f, v in zip(fs, values)})
    assert pos == kw and hash(pos) == hash(kw) and [getattr(pos, f.name) for f in fs] == values
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.step = 1
    with pytest.raises(TypeError):
        cls(no_such_field=1)
    assert E.Event.from_dict(ev.to_dict()) == ev


def test_completion_runs_before_the_first_sink_sees_the_event_and_off_the_held_path():
    """bus.emit's `complete` (UidMiss's digests) runs at flush for held plain sinks, at once for internal or
    span sinks or an unheld bus, and not at all when no sink takes the event."""
    calls = []

    def complete(ev):
        calls.append(ev.step)
        object.__setattr__(ev, "props_digest", f"d{ev.step}")

    bus = E.EventBus()
    plain = bus.subscribe(lambda ev: calls.append(("plain", ev.props_digest)))
    bus.hold()
    bus.emit(E.UidMiss(step=1), complete)
    assert calls == []                                   # held: not worked out during the step
    bus.flush()
    assert calls == [1, ("plain", "d1")]
    calls.clear()
    bus.release()
    bus.emit(E.UidMiss(step=2), complete)                # unheld: delivered, so completed, at once
    assert calls == [2, ("plain", "d2")]
    calls.clear()
    bus.unsubscribe(plain)
    bus.hold()
    bus.emit(E.UidMiss(step=3), complete)
    bus.release()
    assert calls == []                                   # no sink: nothing to complete
    spans = bus.subscribe(lambda ev: calls.append(("span", getattr(ev, "props_digest", None))), spans=True)
    bus.hold()
    bus.emit(E.UidMiss(step=4), complete)                # a span sink sees it now: completed now
    assert calls == [4, ("span", "d4")]
    bus.unsubscribe(spans)
    calls.clear()
    bus.subscribe(lambda ev: calls.append(("internal", ev.props_digest)), internal=True, kinds=(E.UidMiss,))
    bus.emit(E.UidMiss(step=5), complete)
    assert calls == [5, ("internal", "d5")]
    bus.emit(_ev(6), complete)                           # no internal route for it: held until a flush
    assert calls == [5, ("internal", "d5")]
    bus.release()


def test_a_posted_event_is_made_when_the_sinks_take_it_and_equals_the_emitted_one(monkeypatch):
    """post(cls, *fields): held with no internal or span sink for the type, only the fields are queued and
    the event is made at flush (completed first, when asked); otherwise it is made and emitted at once. The
    sinks get the same event as emit(cls(**fields)) would give them."""
    made = []
    real_init = E.PhaseDecided.__init__
    monkeypatch.setattr(E.PhaseDecided, "__init__", lambda self, *a, **k: made.append(1) or real_init(self, *a, **k))
    fields = (3, 0, 7, 9, 11, 0, "replay", "unchanged", 42)
    want = E.PhaseDecided(step=3, split=0, key=7, uid=9, t_ns=11, phase="replay", why="unchanged", clock_us=42)
    made.clear()
    bus = E.EventBus()
    plain = bus.subscribe(E.Recorder())
    bus.hold()
    bus.post(E.PhaseDecided, *fields)
    bus.post(E.StepFinished, 3, -1, 0, 0, 12, 0, 5, 0, (1,), "replay",
             complete=lambda ev: object.__setattr__(ev, "gpu_ns", 99))
    assert made == [] and plain.events == []
    bus.flush()
    assert made == [1] and plain.events[0] == want
    assert plain.events[1] == E.StepFinished(step=3, t_ns=12, duration_ns=5, gpu_ns=99, tokens=(1,), mode="replay")
    internal = bus.subscribe(E.Recorder(), internal=True, kinds=(E.PhaseDecided,))
    bus.post(E.PhaseDecided, *fields)             # an internal sink for the type: made at once
    assert made == [1, 1] and internal.events == [want] and len(plain.events) == 2
    bus.flush()
    assert plain.events[2] == want
    bus.release()
    bus.unsubscribe(internal)
    bus.post(E.PhaseDecided, *fields)             # not held: delivered at once
    assert plain.events[3] == want

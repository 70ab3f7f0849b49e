"""The in-process event bus: synchronous publish/subscribe, held delivery off a step's critical path,
timed scopes (spans) for the sinks that want them, and Recorder, the sink that keeps every event."""

from __future__ import annotations

import time
from typing import Callable

from .base import Event
from .observers import SinkFailed, SpanBegin, SpanEnd


class _NullSpan:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_SPAN = _NullSpan()


class _Span:
    __slots__ = ("bus", "name", "category", "payload", "step", "split", "key", "uid")

    def __init__(self, bus, name, category, payload, step, split, key, uid):
        self.bus, self.name, self.category, self.payload = bus, name, category, payload
        self.step, self.split, self.key, self.uid = step, split, key, uid

    def __enter__(self):
        self.bus._emit_span(SpanBegin(step=self.step, split=self.split, key=self.key, uid=self.uid,
                                      t_ns=self.bus.clock(), name=self.name, category=self.category,
                                      payload=self.payload))
        return self

    def __exit__(self, *exc):
        self.bus._emit_span(SpanEnd(step=self.step, split=self.split, key=self.key, uid=self.uid,
                                    t_ns=self.bus.clock(), name=self.name, category=self.category))
        return False


def sink_name(sink) -> str:
    """What a report calls a sink: its `sink_name` (or its object's, for a bound method), else its type's."""
    owner = getattr(sink, "__self__", sink)
    name = getattr(owner, "sink_name", None)
    return name if isinstance(name, str) else getattr(sink, "__qualname__", type(sink).__name__)


def _cut_off_by(e: BaseException, essential: bool) -> bool:
    """Whether a sink that raised `e` is cut off alone (True) or its error goes on to end the run: an
    essential sink's (the record on a full disk), a closed output's (BrokenPipeError: the reader went
    away) and Ctrl-C/SIGTERM/exit (not Exception) end it, once every other sink has the event."""
    return isinstance(e, Exception) and not essential and not isinstance(e, BrokenPipeError)


class EventBus:
    """Synchronous publish/subscribe. `emit` stamps t_ns (from `clock`) when the event has none.

    Decision events go to every sink; span events only to sinks subscribed with spans=True, and `span()`
    is a shared no-op when there are none (nothing costly on hot paths).

    Held delivery keeps the observers off a step's critical path: between `hold()` and `release()` the
    decision events for plain sinks (record, counters, terminal, JSON lines) are queued, stamped as they
    happen, and handed over in order at `flush()` — which the context calls once the step's work is
    queued on the device, so the sinks run while the GPU computes (`post` even defers making the event).
    Internal sinks (the run's own state) and span sinks (NVTX ranges and marks, timelines, which
    are about *when*) always get every event at once. An internal sink may name the event types it takes
    (`kinds`): it is then handed only those (and their subclasses), in subscription order with the
    others; the bus works out each type's internal sinks once, not a call per sink per event.

    No event is lost to a failing sink. A plain or span sink that raises is cut off alone (unsubscribed,
    `on_sink_error` told once, a SinkFailed event sent to the others) and the rest still get every event.
    An essential sink's error (subscribe(essential=True): the record, the run's own state), a closed
    output (BrokenPipeError) or an interrupt is raised once every other sink has the event, and at
    flush() once the whole queue is delivered. Internal sinks' errors go out at once (the run's own state
    is wrong). The guards cost nothing until a sink raises (Python 3.11's zero-cost try)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns):
        self._sinks: tuple[Callable[[Event], None], ...] = ()
        self._span_sinks: tuple[Callable[[Event], None], ...] = ()
        self._internal: list[tuple[Callable[[Event], None], tuple[type, ...] | None]] = []
        self._routes: dict[type, tuple] = {}     # event type -> the internal sinks it goes to
        self._held: list[Event] | None = None
        self._holds = 0                          # hold() calls not yet released: holds nest
        self.clock = clock
        self._essential: set = set()             # sinks whose errors end the run (the record)
        self.cut_off: list = []                  # sinks that raised and were cut off, in order
        self._late: list[Event] = []             # SinkFailed events to send once the current one is delivered
        self.on_sink_error: Callable[[SinkFailed], None] | None = None

    def subscribe(self, sink: Callable[[Event], None], spans: bool = False, internal: bool = False,
                  kinds: tuple[type, ...] | None = None, essential: bool = False) -> Callable[[Event], None]:
        """Add a sink. essential: its errors end the run (see the class) instead of cutting it off."""
        if kinds is not None and not internal:
            raise ValueError("only internal sinks take `kinds`")
        if internal:
            self._internal.append((sink, tuple(kinds) if kinds is not None else None))
            self._routes.clear()
        elif spans:                              # tuples: a delivery loop is never changed under it
            self._span_sinks = (*self._span_sinks, sink)
        else:
            self._sinks = (*self._sinks, sink)
        if essential:
            self._essential.add(sink)
        return sink

    def unsubscribe(self, sink) -> None:
        self._sinks = tuple(s for s in self._sinks if s != sink)
        self._span_sinks = tuple(s for s in self._span_sinks if s != sink)
        self._internal = [(s, k) for s, k in self._internal if s != sink]
        self._routes.clear()

    def _route(self, cls: type) -> tuple:
        """The internal sinks events of type `cls` go to, in subscription order (worked out once)."""
        got = self._routes[cls] = tuple(s for s, kinds in self._internal if kinds is None or issubclass(cls, kinds))
        return got

    def emit(self, ev: Event, complete: Callable[[Event], None] | None = None) -> None:
        """Deliver `ev`. `complete(ev)`, when given, fills in fields that cost time to work out and that only
        observers read (UidMiss's digests): it runs before the first sink sees the event. For held plain
        sinks that is at flush(), once the step's work is queued on the device; with no plain sink it never
        runs. An internal or span sink for the event, or an unheld bus, has it run at once."""
        if ev.t_ns == 0:
            # stamped in place: the event was just made by its emitter, nobody else holds it yet (a
            # dataclasses.replace per event cost ~5 µs on the replay path)
            object.__setattr__(ev, "t_ns", self.clock())
        route = self._routes.get(type(ev))
        if route is None:
            route = self._route(type(ev))
        if complete is not None and (route or self._held is None or self._span_sinks):
            complete(ev)
            complete = None
        for s in route:
            s(ev)
        if self._held is not None:
            self._held.append(ev if complete is None else (ev, complete))
            if self._span_sinks:
                self._deliver(self._span_sinks, ev)
        else:
            self._deliver((*self._sinks, *self._span_sinks), ev)

    def _deliver(self, sinks: tuple, ev: Event) -> None:
        """Hand `ev` to each of `sinks`; one that raises is cut off or its error raised after the others."""
        raised = None
        for s in sinks:
            try:
                s(ev)
            except BaseException as e:
                raised = self._sink_raised(s, e, ev, raised)
        while self._late:                        # a sink was cut off: the others hear of it, in order
            self._deliver((*self._sinks, *self._span_sinks), self._late.pop(0))
        if raised is not None:
            raise raised

    def _sink_raised(self, sink, e: BaseException, ev: Event, raised: BaseException | None):
        """Cut `sink` off for `e`, or keep `e` to raise (the first such error wins)."""
        if not _cut_off_by(e, sink in self._essential):
            return raised if raised is not None else e
        self.cut_off.append(sink)
        self.unsubscribe(sink)
        failed = SinkFailed(step=ev.step, t_ns=self.clock(), sink=sink_name(sink), error=f"{type(e).__name__}: {e}")
        if self.on_sink_error is not None:
            self.on_sink_error(failed)
        (self._held if self._held is not None else self._late).append(failed)
        return raised

    def guarded(self, sink, step: int, *args) -> None:
        """sink(*args) for one of a sink's side channels (a timeline's device records of `step`) under the
        bus's rules, its owner (a bound method's object) with it: skipped once cut off, cut off if it raises."""
        owner = getattr(sink, "__self__", sink)
        if owner in self.cut_off:
            return
        try:
            sink(*args)
        except Exception as e:
            if not _cut_off_by(e, owner in self._essential):
                raise
            self._sink_raised(owner, e, Event(step=step), None)
            while self._late:
                self._deliver((*self._sinks, *self._span_sinks), self._late.pop(0))

    def post(self, cls: type, *fields, complete: Callable[[Event], None] | None = None) -> None:
        """emit(cls(*fields), complete), the fields in declaration order (t_ns stamped by the caller), for
        the events of every replayed step: when the event would only be queued (the bus held, no internal
        or span sink for its type), its fields are queued instead and the event is made when flush() hands
        it over, once the step's work is queued on the device. The sinks see the same event either way."""
        route = self._routes.get(cls)
        if route is None:
            route = self._route(cls)
        if route or self._held is None or self._span_sinks:
            self.emit(cls(*fields), complete)
        else:
            self._held.append((cls, fields, complete))

    def hold(self) -> None:
        """Queue plain sinks' events until flush() or the matching release(); holds nest (a run holds
        across its steps, each step holds within it)."""
        self._holds += 1
        if self._held is None:
            self._held = []

    def flush(self) -> None:
        """Deliver the queued events, in order (completing those emitted with `complete`), and keep holding.
        A sink's error that ends the run is raised once the whole queue is delivered to the others."""
        raised = None
        while self._held:
            pending, self._held = self._held, []
            sinks = self._sinks
            if not sinks:
                continue                 # nobody to deliver to: nothing to complete either
            for ev in pending:
                if type(ev) is tuple:
                    if len(ev) == 2:     # (event, complete): emitted with fields still to fill in
                        ev, complete = ev
                    else:                # (type, fields, complete): posted, made now
                        cls, fields, complete = ev
                        ev = cls(*fields)
                    if complete is not None:
                        complete(ev)
                for s in sinks:
                    try:
                        s(ev)
                    except BaseException as e:
                        raised = self._sink_raised(s, e, ev, raised)
                        sinks = self._sinks          # the next events skip a sink cut off
        if raised is not None:
            raise raised

    def release_all(self) -> None:
        """End every hold at once, delivering what is queued: a run's end, however its holds were left (a
        signal that lands between a hold() and the try whose finally releases it leaves that hold unmatched,
        and every later event queued on a bus that never lets go)."""
        self._holds = 1
        self.release()

    def release(self) -> None:
        """End one hold; the outermost delivers what is queued and stops holding (a sink that fails leaves
        the bus unheld all the same)."""
        self._holds = max(self._holds - 1, 0)
        if self._holds:
            return
        try:
            self.flush()
        finally:
            self._held = None

    def span(self, name: str, category: str, payload: int = 0, step: int = -1, split: int = -1,
             key: int = 0, uid: int = 0):
        """Context manager bracketing a timed scope with SpanBegin/SpanEnd (no-op without span sinks)."""
        if not self._span_sinks:
            return _NULL_SPAN
        return _Span(self, name, category, payload, step, split, key, uid)

    def _emit_span(self, ev: Event) -> None:
        self._deliver(self._span_sinks, ev)


class Recorder:
    """A sink that keeps every event (for tests, reports and the JSON-lines writer)."""

    def __init__(self):
        self.events: list[Event] = []

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)

    def of(self, *types) -> list[Event]:
        return [e for e in self.events if isinstance(e, types)]


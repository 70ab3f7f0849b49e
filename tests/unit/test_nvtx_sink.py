"""NvtxSink against a fake nvtx module: attributes built once, payloads, marks, balance, no-op."""

from __future__ import annotations

from graphdiag import events as E
from graphdiag.report.sinks.nvtx_sink import NvtxSink


class FakeAttrs:
    def __init__(self, message, color, category, payload):
        self.message, self.color, self.category, self.payload = message, color, category, payload


class FakeDomain:
    def __init__(self):
        self.calls: list[tuple] = []
        self.built = 0

    def get_event_attributes(self, message=None, color=None, category=None, payload=None):
        self.built += 1
        return FakeAttrs(message, color, category, payload)

    def push_range(self, attrs):
        self.calls.append(("push", attrs.message, attrs.category, attrs.payload))

    def pop_range(self):
        self.calls.append(("pop",))

    def mark(self, attrs):
        self.calls.append(("mark", attrs.message, attrs.category, attrs.payload))


class DummyDomain:          # what nvtx.get_domain returns when no tool is attached
    def __getattr__(self, name):
        raise AssertionError(f"the sink called {name} on the dummy domain")


class FakeNvtx:
    def __init__(self, domain):
        self.domain, self.asked = domain, []

    def get_domain(self, name):
        self.asked.append(name)
        return self.domain


def _bus(domain):
    fake = FakeNvtx(domain)
    bus = E.EventBus(clock=iter(range(1, 10_000)).__next__)
    sink = bus.subscribe(NvtxSink(fake), spans=True)
    return bus, sink, fake


def test_nvtx_sink_pushes_and_pops_with_payloads_in_one_domain():
    domain = FakeDomain()
    bus, sink, fake = _bus(domain)
    with bus.span("step", "step", payload=7):
        for chunk in range(3):
            with bus.span("chunk capture", "graph/capture", payload=chunk):
                pass
    assert fake.asked == ["graphdiag"]
    assert domain.calls == [("push", "step", "step", 7),
                            ("push", "chunk capture", "graph/capture", 0), ("pop",),
                            ("push", "chunk capture", "graph/capture", 1), ("pop",),
                            ("push", "chunk capture", "graph/capture", 2), ("pop",), ("pop",)]
    assert domain.built == 2                       # attributes built once per (name, category)
    assert sink.depth == 0


def test_nvtx_sink_marks_the_decisions_that_matter_on_a_timeline():
    domain = FakeDomain()
    bus, _, _ = _bus(domain)
    bus.emit(E.WarmupTransition(uid=9, from_state="cold", to_state="warm"))        # not marked
    bus.emit(E.WarmupTransition(uid=9, from_state="warm", to_state="cold"))
    bus.emit(E.UpdateRefused(chunk=2, reason="TOPOLOGY_CHANGED"))
    bus.emit(E.Evicted(key=5, n_chunks=3))
    bus.emit(E.PoolInvalidated(reason="alloc failure", n_captured=4))
    bus.emit(E.ReplayLaunched(n_chunks=1))                                         # not marked
    assert domain.calls == [("mark", "warmup reset", "graph/warmup", 9),
                            ("mark", "update refused: TOPOLOGY_CHANGED", "graph/update", 2),
                            ("mark", "graph evicted", "graph/evict", 3),
                            ("mark", "pool invalidated: alloc failure", "pool/invalidate", 4)]


def test_nvtx_sink_pops_on_exceptions_and_close_balances_leftovers():
    domain = FakeDomain()
    bus, sink, _ = _bus(domain)
    try:
        with bus.span("step", "step"):
            raise ValueError("boom")
    except ValueError:
        pass
    assert domain.calls == [("push", "step", "step", 0), ("pop",)]
    sink(E.SpanBegin(name="split compute", category="split/compute", payload=1))
    sink.close()
    assert domain.calls[-1] == ("pop",) and sink.depth == 0
    sink(E.SpanEnd(name="split compute"))                 # a stray end never pops below zero
    assert domain.calls.count(("pop",)) == 2


def test_nvtx_sink_is_a_noop_on_the_dummy_domain():
    bus, sink, _ = _bus(DummyDomain())
    assert sink.enabled is False
    with bus.span("step", "step", payload=1):
        bus.emit(E.UpdateRefused(chunk=0, reason="TOPOLOGY_CHANGED"))
    sink.close()


def test_nvtx_sink_real_package_without_a_tool_is_disabled(monkeypatch):
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    import nvtx
    if type(nvtx.get_domain("graphdiag")).__name__ != "DummyDomain":
        import pytest
        pytest.skip("an NVTX tool is attached to this process")
    assert NvtxSink().enabled is False

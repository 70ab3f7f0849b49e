"""NVTX ranges and marks for Nsight Systems, fed from the event bus (subscribe with spans=True).

Follows NVIDIA's NVTX best practices: one domain (`graphdiag`); categories as slash paths ("graph/capture");
messages are registered strings, one per span name, and event attributes are built once per
(name, category) and reused; numbers (uid, chunk index, node index) travel in the payload, never in the
message. Point decisions that matter on a timeline (warmup reset, update refused, eviction, pool
invalidation) become marks.

When no tool is attached, `nvtx.get_domain` returns a shared dummy domain and this sink does nothing at all
(`enabled` is False). The tool is chosen once per process, from NVTX_INJECTION64_PATH, at the first NVTX call.
"""

from __future__ import annotations

from ... import events as E

DOMAIN = "graphdiag"

# colour per top-level category (ARGB ints: no matplotlib needed)
COLORS = {"step": 0xFF4C72B0, "context": 0xFF8172B3, "sched": 0xFF8172B3, "graph": 0xFF55A868,
          "split": 0xFF64B5CD, "pool": 0xFFC44E52}
MARK_COLOR = 0xFFC44E52


def _mark_of(ev: E.Event) -> tuple[str, str, int] | None:
    """(message, category, payload) for decisions marked on the timeline; None for the others.
    Messages come from small fixed sets (reason names), so registering each once stays bounded."""
    match ev:
        case E.WarmupTransition() if ev.to_state != "warm":
            return "warmup reset", "graph/warmup", ev.uid
        case E.UpdateRefused():
            return f"update refused: {ev.reason}", "graph/update", ev.chunk
        case E.Evicted():
            return "graph evicted", "graph/evict", ev.n_chunks
        case E.PoolInvalidated():
            return f"pool invalidated: {ev.reason}", "pool/invalidate", ev.n_captured
    return None


class NvtxSink:
    """Push a range on SpanBegin, pop it on SpanEnd; mark the decisions `_mark_of` names.

    `nvtx_module` is for tests that hand in a fake; by default the real `nvtx` package is used."""

    def __init__(self, nvtx_module=None, domain: str = DOMAIN):
        if nvtx_module is None:
            import nvtx as nvtx_module
        self.domain = nvtx_module.get_domain(domain)
        # without a tool get_domain returns the shared DummyDomain: then do nothing at all
        self.enabled = type(self.domain).__name__ != "DummyDomain"
        self._attrs: dict[tuple[str, str], object] = {}
        self.depth = 0
        self.sink_name = "NVTX"

    def attributes(self, message: str, category: str, color: int | None = None):
        """Event attributes for (message, category), built once; the payload is set per use."""
        attrs = self._attrs.get((message, category))
        if attrs is None:
            color = color if color is not None else COLORS.get(category.split("/")[0], 0xFF999999)
            attrs = self.domain.get_event_attributes(message=message, color=color, category=category,
                                                     payload=0)
            self._attrs[(message, category)] = attrs
        return attrs

    def __call__(self, ev: E.Event) -> None:
        if not self.enabled:
            return
        if isinstance(ev, E.SpanBegin):
            attrs = self.attributes(ev.name, ev.category)
            attrs.payload = int(ev.payload)
            self.domain.push_range(attrs)
            self.depth += 1
        elif isinstance(ev, E.SpanEnd):
            if self.depth > 0:
                self.domain.pop_range()
                self.depth -= 1
        else:
            mark = _mark_of(ev)
            if mark is not None:
                message, category, payload = mark
                attrs = self.attributes(message, category, MARK_COLOR)
                attrs.payload = int(payload)
                self.domain.mark(attrs)

    def close(self) -> None:
        """Pop ranges left open (a run that stopped inside a span), so the timeline stays balanced."""
        while self.enabled and self.depth > 0:
            self.domain.pop_range()
            self.depth -= 1

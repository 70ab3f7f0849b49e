"""What the bus itself reports: a sink cut off, and the timed scopes (spans) span sinks receive."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class SinkFailed(Event):
    """An observer (the terminal report, the timeline, NVTX, a caller's sink) raised at `step`: it was cut
    off alone and gets nothing more; the run went on and every other sink got every event. sink: its name
    (sink_name); error: the exception, "Type: message"."""
    kind: ClassVar[str] = "sink_failed"
    sink: str = ""
    error: str = ""


@dataclass(frozen=True)
class SpanBegin(Event):
    """Start of a timed scope (step, context, split compute, eager, warmup, chunk capture, update,
    instantiate, replay, eviction, invalidation). Only sinks subscribed with spans=True receive spans."""
    kind: ClassVar[str] = "span_begin"
    name: str = ""                 # a fixed string per kind of scope (registered once by NVTX)
    category: str = ""             # slash path, e.g. "graph/capture"
    payload: int = 0               # a number: uid, chunk index, node index...


@dataclass(frozen=True)
class SpanEnd(Event):
    kind: ClassVar[str] = "span_end"
    name: str = ""
    category: str = ""

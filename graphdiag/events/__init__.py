"""Every decision is an event: small frozen dataclasses, an in-process bus, JSON round-trip.

Each event carries the step, the split index, the graph key (first node's struct address, 0 where none),
the split's uid and an integer-ns timestamp (time.perf_counter_ns unless a clock is injected), and the
device whose graph runtime took it (0 on one device; written to a record only when not 0, so one-device
records read as before and records written before there was a device field load with device 0).
Sinks (counters, the terminal report, the JSON-lines record, NVTX, diff) subscribe to the bus.

One module per area, re-exported flat (`from graphdiag import events as E; E.StepFinished`): base.py (Event,
the registry of kinds), run.py, failures.py, context.py (context and scheduler), gates.py (the graph
runtime's gates), capture.py (capture, instantiate/update, replay), checks.py, device.py, observers.py
(sink failures, spans), trace.py (calls `graphdiag trace` saw), and bus.py (EventBus, Recorder). The import
order below is the order kinds were defined in, which is the registry's order.
"""

from .base import EVENT_TYPES, SCHEMA_VERSION, Event, _fast_init
from .run import StepStarted, StepFinished, RunEnded, WeightsUploaded
from .failures import FaultInjected, FaultMissed, CellsRemoved, EntryReset, StepFailed
from .context import ContextDecision, GraphSplit, DeviceLayout, PeerLink, SchedRealloc
from .gates import (
    KeyLookup, Evicted, GraphsDisabled, Incompatible, UidHit, UidMiss, NodeCountChanged, PropertyDiff,
    LedgerCaptured, WarmupTransition, PhaseDecided,
)
from .capture import (
    FusionApplied, ConcurrentRegion, ConcurrentRefused, ConcurrentRace, ChunkBoundary, ChunkCaptured, ChunkInstantiated, ChunkUpdated,
    UpdateRefused, CaptureAbandoned, ChunksDestroyed, EagerRun, CaptureRun, ReplayLaunched, PoolInvalidated,
)
from .checks import VerifyResult, OracleCheck
from .device import DeviceTime
from .observers import SinkFailed, SpanBegin, SpanEnd
from .trace import DecodeBatch, TracedCall

from .bus import EventBus, Recorder, sink_name

for _cls in (Event, *EVENT_TYPES.values()):
    _fast_init(_cls)            # once every kind is defined: each gets its fast __init__
del _cls

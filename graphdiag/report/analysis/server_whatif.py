"""What one run of a server's batches cost in CUDA graphs (pure analysis over a record's events): the figures
`graphdiag whatif --pad-batches / --slots` puts side by side (trace/server_sim.py makes the variants).

tokens: rows llama_decode computed (every ubatch's, padding included); captures: graphs captured;
recaptures: captures of a key captured before (since its last eviction); refusals: executable updates CUDA
refused (each an instantiate again); eager: computes that ran without a graph (warming up or reset);
graph_bytes: device memory the instantiates took (graph_memory.py's figure: modelled on the simulated driver,
measured on CUDA), peak_graph_bytes: the most held at once. Per 1000 tokens: each count x 1000 / tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ... import events as E
from .graph_memory import graph_memory

PER_1000 = ("captures", "recaptures", "refusals", "eager", "graph_bytes")


@dataclass
class ServerOutcome:
    label: str
    batches: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    captures: int = 0
    recaptures: int = 0
    refusals: int = 0
    eager: int = 0
    replays: int = 0
    warmup_resets: int = 0
    graph_bytes: int = 0
    peak_graph_bytes: int = 0

    def per_1000(self, name: str) -> float:
        """`name` per 1000 tokens computed."""
        return getattr(self, name) * 1000 / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict:
        return asdict(self) | {f"{n}_per_1000_tokens": round(self.per_1000(n), 3) for n in PER_1000}


def server_outcome(label: str, events: list[E.Event], simulated: bool, padded_tokens: int = 0) -> ServerOutcome:
    """The figures of one run's events (a replay's record, with its DecodeBatch events)."""
    o = ServerOutcome(label, padded_tokens=padded_tokens)
    seen: set[tuple[int, int]] = set()
    for ev in events:
        match ev:
            case E.DecodeBatch():
                o.batches += 1
            case E.StepStarted():
                o.tokens += ev.n_tokens
            case E.ChunkCaptured() if ev.chunk == 0:
                o.captures += 1
                o.recaptures += (ev.device, ev.key) in seen
                seen.add((ev.device, ev.key))
            case E.Evicted():
                seen.discard((ev.device, ev.key))
            case E.UpdateRefused():
                o.refusals += 1
            case E.PhaseDecided() if ev.phase == "eager":
                o.eager += 1
            case E.ReplayLaunched():
                o.replays += 1
            case E.WarmupTransition() if ev.to_state == "cold":
                o.warmup_resets += 1
            case E.ChunkInstantiated():
                o.graph_bytes += ev.mem_bytes
    o.peak_graph_bytes = graph_memory(simulated, events).peak_bytes
    return o

"""`graphdiag whatif --pad-batches / --slots`: a trace's (or a replay record's) batches run again through
graphdiag's runtime as server_sim.py transforms them, each run summarised (report/analysis/server_whatif.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import events as E
from ..errors import UsageError
from ..report.analysis.replay_diff import replayed_batches
from ..report.analysis.server_whatif import ServerOutcome, server_outcome
from .replay_plan import ServerSettings, server_settings, trace_batches


@dataclass
class OperatorWhatIf:
    """The runs compared: `outcomes[0]` the batches as recorded (replayed), then one per variant."""

    source: str
    model: str
    device: str
    question: str
    outcomes: list[ServerOutcome] = field(default_factory=list)
    requests: int = 0
    padded_batches: int = 0

    def to_dict(self) -> dict:
        return {"source": self.source, "model": self.model, "device": self.device, "question": self.question,
                "requests": self.requests, "padded_batches": self.padded_batches,
                "outcomes": [o.to_dict() for o in self.outcomes]}


def load_batches(path: str | Path, model: str | None) -> tuple[list[E.DecodeBatch], ServerSettings, str]:
    """(every batch, the server's settings, the model file) of a trace or a
    `graphdiag replay --events` record; the model is --model, else the one the replay record names."""
    from .replay import load_trace
    from ..report.record.read import read_record
    try:
        header, events = load_trace(path)
        cmd = header.trace.get("cmd") or []
    except UsageError:
        header, events = read_record(path)
        if not header.replay:
            raise UsageError(f"{path} is neither a trace nor a `graphdiag replay --events` record: --pad-batches "
                             f"and --slots need the llama_decode batches a server gave") from None
        cmd = header.replay.get("trace_cmd") or []
        model = model or header.replay.get("model")
    trace_batches(events, header.trace.get("not_observable", ()))
    if not model:
        raise UsageError("--pad-batches, --slots and --model-draft run graphdiag's runtime on the batches: give "
                         "--model FILE.gguf")
    return [e for e in events if isinstance(e, E.DecodeBatch)], server_settings(list(cmd)), str(model)


def _run(label: str, batches, model: str, backend: str, settings: ServerSettings, padded: int = 0):
    from .replay import replay_batches
    (h, ev), _ = replay_batches(batches, model, backend, settings)
    return server_outcome(label, ev, h.simulated, padded), h


def _as_recorded(path, model: str | None, backend: str, what: str):
    """The trace's replayed batches, its server settings and model, and the what-if with its as-recorded run."""
    every, settings, model = load_batches(path, model)
    batches = replayed_batches(every)
    base, h = _run("as recorded", batches, model, backend, settings)
    w = OperatorWhatIf(str(path), model, h.device or h.backend, what)
    w.outcomes = [base]
    return batches, settings, model, w


def pad_whatif(path, buckets: list[int], model: str | None, backend: str = "auto") -> OperatorWhatIf:
    """The batches as recorded against each decode batch padded to the next of `buckets`."""
    from .server_sim import pad_batches
    if not buckets or min(buckets) < 1:
        raise UsageError(f"--pad-batches takes batch sizes >= 1, not {buckets}")
    sizes = ",".join(map(str, sorted(buckets)))
    batches, settings, model, w = _as_recorded(path, model, backend, f"decode batches padded to {sizes}")
    padded, n, rows = pad_batches(batches, buckets)
    w.outcomes.append(_run(f"padded {sizes}", padded, model, backend, settings, rows)[0])
    w.padded_batches = n
    return w


def slots_whatif(path, slots: list[int], model: str | None, backend: str = "auto") -> OperatorWhatIf:
    """The trace's requests served again by each number of slots (-np N)."""
    from .server_sim import requests, reschedule
    if not slots or min(slots) < 1:
        raise UsageError(f"--slots takes slot counts >= 1, not {slots}")
    batches, settings, model, w = _as_recorded(path, model, backend,
                                               f"the trace's requests served by {', '.join(map(str, slots))} slots")
    w.requests = len(requests(batches)[1])
    w.outcomes += [_run(f"-np {n}", reschedule(batches, n, settings.n_batch), model, backend, settings)[0]
                   for n in slots]
    return w


def draft_whatif(path, model: str | None, draft_model: str, backend: str = "auto"):
    """(the speculative warmup cycle, device) of a trace with a draft model's context: the target's batches
    replayed on `model`, the draft's on `draft_model`."""
    from ..llama.expressible import check_gguf
    from ..report.analysis.speculative import draft_cycle
    from .replay import replay_batches
    from .replay_plan import contexts
    check_gguf(draft_model)
    every, settings, model = load_batches(path, model)
    ctxs = contexts([b for b in every if b.ret == 0])
    if len(ctxs) < 2:
        raise UsageError(f"{path}: its batches went to one llama_context: no draft model's batches to replay "
                         f"(trace llama-server run with --model-draft)")
    n_draft = sum(b.ctx == ctxs[1] and b.ret == 0 for b in every)
    nothing = (f"{path}: its draft context decoded {n_draft} batch{'es' if n_draft != 1 else ''} and drafted "
               f"nothing (llama-server drafts with -md only beside --spec-type draft-simple, in llama.cpp "
               f"0c1e57098 as in b11434)")
    if n_draft < 2:                  # llama-server's warmup of the draft context alone: replaying shows nothing
        raise UsageError(nothing)
    (ht, target), _ = replay_batches(every, model, backend, settings, ctx=ctxs[0])
    (_, draft), _ = replay_batches(every, draft_model, backend, settings, ctx=ctxs[1])
    cycle = draft_cycle(target, draft)
    if not cycle.steps:
        raise UsageError(nothing)
    return cycle, ht.device or ht.backend

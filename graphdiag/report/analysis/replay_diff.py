"""A replay (graphdiag's run of a trace's batches, trace/replay.py) against the trace, batch by batch.

Both records carry their llama_decode batches (DecodeBatch), each followed by the steps it computed: the
trace's graph launches (and the computes llama.cpp logged as warmup resets), graphdiag's ubatch steps. Each
side is reduced to what a trace can show (observed_diff.observed_decisions: evictions, uid hits and warmup
transitions where the trace has ggml's log lines, eager / capture / replay, graph nodes per capture, new,
updated or refused executables), and the decisions of each batch are compared in order, graphdiag's known
differences from llama.cpp (known.py) excused pair by pair; the first other difference is the report's, as
`graphdiag diff` does for `graphdiag llama` records.

Not comparable, so left out on graphdiag's side: an eager compute llama.cpp logs nothing for (a first call or
one still warming up: no launch, no line) and, where the trace has no ggml log lines, every uid hit, warmup
transition and eager compute. A trace's executable destroyed by the idle sweep is seen at the destroy call,
after the compute before it: it is moved to the compute that looked the cache up; the destroys of the
process's exit are no decision.

For every recapture and refused update in the trace, the report names what graphdiag's ledger says changed
(recaptures.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from typing import Any

from ... import events as E
from .known import KNOWN, Excuser, ModelFacts, Pair
from .observed_diff import NOT_COMPARED, Decision, observed_decisions
from .recaptures import Recapture, recaptures

NOT_IN_A_TRACE = ("eager computes llama.cpp logs nothing for (first call, warming up)",)
LOG_LEFT_OUT = ("uid hits, warmup transitions and eager computes (ggml's log lines left out: --ignore-log)",)
NO_LOG = ("uid hits, warmup transitions and eager computes (the trace has no ggml log lines: run the traced "
          "program with -v)",)


@dataclass
class ReplayDiff:
    """first: (batch, index in the batch, graphdiag's decision or None, the trace's or None); None: equal."""

    trace: str
    replay: str
    batches_compared: int = 0
    decisions_compared: int = 0
    first: tuple | None = None
    replay_batch: list[str] = field(default_factory=list)   # the first differing batch's decisions, each side
    trace_batch: list[str] = field(default_factory=list)
    excused: list[dict] = field(default_factory=list)
    known: dict[str, dict] = field(default_factory=dict)
    recaptures: list[Recapture] = field(default_factory=list)
    not_compared: tuple = ()
    notes: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return self.first is None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.first is not None:
            b, i, x, y = self.first
            d["first"] = {"batch": b, "index": i, "replay": x.line() if x else None, "trace": y.line() if y else None}
        return d | {"equal": self.equal}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def replayed_batches(events: list[E.Event], ctx: int | None = None) -> list[E.DecodeBatch]:
    """The batches a replay takes: context `ctx`'s (None: the first batch's), those llama_decode accepted."""
    bs = [e for e in events if isinstance(e, E.DecodeBatch)]
    if not bs:
        return []
    ctx = bs[0].ctx if ctx is None else ctx
    return [b for b in bs if b.ctx == ctx and b.ret == 0]


def steps_by_batch(events: list[E.Event]) -> dict[int, int]:
    """step -> the index (among the record's DecodeBatch events) of the batch that computed it: the last
    batch before the step's StepStarted; in the order the steps started."""
    out: dict[int, int] = {}
    batch = -1
    for ev in events:
        if isinstance(ev, E.DecodeBatch):
            batch += 1
        elif isinstance(ev, E.StepStarted) and batch >= 0:
            out.setdefault(ev.step, batch)
    return out


EVICTION_STEP = 1 << 40     # the first number of the steps made up for evictions in a batch that launched nothing


def rehome_evictions(events: list[E.Event]) -> list[E.Event]:
    """A trace's Evicted events given the step of the next compute of the same batch (whose cache lookup
    destroyed them); where that batch launched nothing (its computes eager, unseen), a step of their own
    (numbered from EVICTION_STEP) at their place, so they stay that batch's. Those after the last batch's
    computes (the process's exit) are left out."""
    out: list[E.Event] = []
    waiting: list[E.Event] = []
    made = EVICTION_STEP
    for ev in events:
        if isinstance(ev, E.Evicted):
            waiting.append(ev)
            continue
        if isinstance(ev, E.DecodeBatch) and waiting:
            out.append(E.StepStarted(step=made, t_ns=waiting[0].t_ns, phase="decode", device=waiting[0].device))
            out += [replace(w, step=made) for w in waiting]
            made, waiting = made + 1, []
        out.append(ev)
        if isinstance(ev, E.StepStarted) and waiting:
            out += [replace(w, step=ev.step) for w in waiting]
            waiting = []
    return out


def _has_log(events: list[E.Event]) -> bool:
    return any(isinstance(e, (E.UidHit, E.WarmupTransition)) or (isinstance(e, E.PhaseDecided) and e.phase == "eager")
               for e in events)


def visible(events: list[E.Event], log: bool) -> list[E.Event]:
    """graphdiag's events less what a trace cannot show (see the module's docstring)."""
    out = []
    for e in events:
        if isinstance(e, E.PhaseDecided) and e.phase in ("eager", "disabled", "incompatible") \
                and not (log and e.why == "warmup reset"):
            continue
        if not log and isinstance(e, (E.UidHit, E.WarmupTransition)):
            continue
        out.append(e)
    return out


def _by_batch(decisions: dict[int, list[Decision]], batch_of: dict[int, int], keep: dict[int, int]) -> dict:
    """Per compared batch (its position among the replayed ones), the decisions of its steps in order."""
    out: dict[int, list[Decision]] = {j: [] for j in keep.values()}
    for step, b in batch_of.items():
        if b in keep:
            out[keep[b]] += decisions.get(step, [])
    return out


def diff_replay(trace: tuple, replay: tuple, facts: ModelFacts, names: tuple[str, str] = ("trace", "replay"),
                known: bool = True, use_log: bool = True) -> ReplayDiff:
    """Compare the trace (header, events) with its replay (header, events), batch by batch: the batches of
    the context the replay ran (a draft model's replay against the draft's batches), the trace's steps of
    any other context's batches left out. `use_log` False: the trace's decisions from ggml's log lines (uid
hits, warmup, logged eager computes) are left out on both sides, for a trace whose log lines were read too
late to sit at their compute (graphdiag reads them from the program's stderr)."""
    (ht, et), (hr, er) = trace, replay
    ours = replayed_batches(er)
    ctx = ours[0].ctx if ours else None
    et = own_steps(rehome_evictions(et), ctx)
    log = _has_log(et) and use_log
    if not use_log:          # where the log lines' places are doubted (read late from the program's stderr)
        et = visible(et, False)
    er_seen = visible(er, log)
    tb, rb = _batches_with_index(et, ctx), _batches_with_index(er, ctx)
    d = ReplayDiff(*names)
    d.not_compared = NOT_COMPARED + NOT_IN_A_TRACE + (() if log else NO_LOG if use_log else LOG_LEFT_OUT)
    n = min(len(tb), len(rb))
    if len(tb) != len(rb):
        d.notes.append(f"the trace has {len(tb)} replayable batches, the replay {len(rb)}: the first {n} compared")
    t_keep = {tb[j][0]: j for j in range(n)}
    r_keep = {rb[j][0]: j for j in range(n)}
    theirs = _by_batch(observed_decisions(et), steps_by_batch(et), t_keep)
    ours = _by_batch(observed_decisions(er_seen), steps_by_batch(er), r_keep)
    ex = _excuser(facts, er, steps_by_batch(er), r_keep) if known else None
    for j in range(n):
        d.batches_compared += 1
        xs, ys = ours[j], theirs[j]
        for i in range(max(len(xs), len(ys))):
            x = xs[i] if i < len(xs) else None
            y = ys[i] if i < len(ys) else None
            name = ex(j, i, x, y, ours, theirs) if ex and x is not None and y is not None and x != y else None
            if name:
                d.excused.append({"name": name, "batch": tb[j][0], "index": i, "replay": x.line(), "trace": y.line()})
            elif x != y:
                d.first = (tb[j][0], i, x, y)
                d.replay_batch, d.trace_batch = [v.line() for v in xs], [v.line() for v in ys]
                break
            d.decisions_compared += 1
        if d.first is not None:
            break
    met = {x["name"] for x in d.excused}
    d.known = {k.name: {"claim": k.claim, "evidence": k.evidence} for k in KNOWN if k.name in met}
    d.recaptures = recaptures(et, er, steps_by_batch(et), steps_by_batch(er), t_keep, r_keep, [b for b, _ in tb])
    return d


def own_steps(events: list[E.Event], ctx: int | None) -> list[E.Event]:
    """The trace's events less those of the steps other contexts' batches computed (every DecodeBatch kept:
    batches are numbered over all of them)."""
    if ctx is None:
        return events
    every = [e for e in events if isinstance(e, E.DecodeBatch)]
    other = {s for s, b in steps_by_batch(events).items() if every[b].ctx != ctx}
    return [e for e in events if isinstance(e, E.DecodeBatch) or e.step not in other]


def _batches_with_index(events: list[E.Event], ctx: int | None = None) -> list[tuple[int, E.DecodeBatch]]:
    """(index among the record's batches, batch) of each replayed one."""
    every = [e for e in events if isinstance(e, E.DecodeBatch)]
    keep = {id(b) for b in replayed_batches(events, ctx)}
    return [(i, b) for i, b in enumerate(every) if id(b) in keep]


def _excuser(facts: ModelFacts, events: list[E.Event], batch_of: dict[int, int], keep: dict[int, int]):
    """known.Excuser over batches instead of steps: a batch's tokens are its first ubatch's, its captures'
    embedding flags and cuBLAS conversions its steps' in order."""
    ex = Excuser(facts, events)
    tokens: dict[int, int] = {}
    emb: dict[int, list[bool]] = {}
    cub: dict[int, list[int]] = {}
    for step in batch_of:
        j = keep.get(batch_of[step])
        if j is None:
            continue
        tokens.setdefault(j, ex.tokens.get(step, 0))
        emb.setdefault(j, []).extend(ex.embedding.get(step, []))
        cub.setdefault(j, []).extend(ex.cublas.get(step, []))
    ex.tokens, ex.embedding, ex.cublas = tokens, emb, cub

    def excuse(j: int, i: int, x: Decision, y: Decision, a: dict, b: dict) -> str | None:
        p = Pair(j, i, x, y, a, b, ex.tokens, ex.embedding, ex.cublas)
        return next((k.name for k in KNOWN if k.holds(p, facts)), None)
    return excuse

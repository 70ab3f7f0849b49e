"""Speculative decoding's warmup cycle (pure analysis over two replay records: the target's and the draft's).

llama-server with a draft model (--model-draft) decodes each step in two contexts: the draft's batches (one
token at a time, after its own prompt), then one target batch verifying them (the sampled token and the
drafted ones, every row an output). Each context has its own CUDA-graph cache, and the verify batch is as
wide as the draft that got accepted so far: when its width changes, the target's graph properties change
and ggml's warmup is reset (an eager compute, then a capture). A draft step is here a run of draft batches
decoding one row per sequence and the target batch after it, when every row of that batch is an output (it
verifies them); for each, the phases each side's computes took (graphdiag's decisions for the trace's
batches), counted over the run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ... import events as E


@dataclass(frozen=True)
class BatchPhases:
    t_ns: int
    n_tokens: int
    phases: tuple        # "eager (warmup reset)", "capture", "replay", ... one per compute of its steps
    every_row_out: bool  # every row an output (a verify batch, or tokens decoded one per sequence)


@dataclass
class DraftCycle:
    steps: int = 0
    verify_sizes: Counter = field(default_factory=Counter)
    target: Counter = field(default_factory=Counter)        # phase -> computes in verify batches
    draft: Counter = field(default_factory=Counter)         # phase -> computes in the draft's batches
    first: list[str] = field(default_factory=list)          # the first draft steps, one line each

    def per_step(self, side: str, phase: str) -> float:
        return getattr(self, side)[phase] / self.steps if self.steps else 0.0

    def to_dict(self) -> dict:
        return {"draft_steps": self.steps, "verify_sizes": dict(self.verify_sizes), "target": dict(self.target),
                "draft": dict(self.draft), "first": self.first}


def batch_phases(events: list[E.Event]) -> list[BatchPhases]:
    """Each DecodeBatch of a replay record with the phases its steps' computes took."""
    out: list[list] = []
    for ev in events:
        if isinstance(ev, E.DecodeBatch):
            out.append([ev.t_ns, ev.n_tokens, [], ev.outputs is not None and len(ev.outputs) == ev.n_tokens])
        elif isinstance(ev, E.PhaseDecided) and out:
            out[-1][2].append(ev.phase + (" (warmup reset)" if ev.why == "warmup reset" else ""))
    return [BatchPhases(t, n, tuple(p), o) for t, n, p, o in out]


def draft_cycle(target: list[E.Event], draft: list[E.Event], shown: int = 8) -> DraftCycle:
    """The cycle of the two replays' batches, merged in time order."""
    merged = sorted([(b.t_ns, "target", b) for b in batch_phases(target)]
                    + [(b.t_ns, "draft", b) for b in batch_phases(draft)], key=lambda x: x[0])
    c = DraftCycle()
    pending: list[BatchPhases] = []
    for _, side, b in merged:
        if side == "draft":                      # its prompt is not drafting: a step starts after it
            pending = pending + [b] if b.every_row_out else []
            continue
        if not pending or not b.every_row_out:   # a prompt, or a target batch no draft preceded: no draft step
            pending = []
            continue
        c.steps += 1
        c.verify_sizes[b.n_tokens] += 1
        c.target.update(b.phases)
        for d in pending:
            c.draft.update(d.phases)
        if len(c.first) < shown:
            c.first.append(f"draft {'+'.join(str(d.n_tokens) for d in pending)} token(s) "
                           f"[{', '.join(p for d in pending for p in d.phases) or 'no compute'}] → target verifies "
                           f"{b.n_tokens} [{', '.join(b.phases) or 'no compute'}]")
        pending = []
    return c

"""Speculative decoding's warmup cycle (pure analysis over two replay records: the target's and the draft's).

llama-server with a draft model (--model-draft --spec-type draft-simple) decodes in two contexts, each with its
own CUDA-graph cache. Read in llama.cpp 0c1e57098 and b11434 (tools/server/server-context.cpp, common/
speculative.cpp's draft-simple) and recorded from both real servers (tests/data/trace/
cpu-server-spec-{0c1e,b11434}.raw.jsonl.xz), one server iteration with drafting slots is:
  1. draft: the draft context decodes one row per drafting slot (the last sampled token, then each drafted
     one; every row an output), up to --spec-draft-n-max batches (3 by default);
  2. verify: the target decodes each slot's sampled token and its drafts (every such row an output), beside
     any other slot's prompt rows;
  3. re-evaluate: the draft context decodes a copy of that target batch (the last row an output), restoring
     its cache to what the target accepted (upstream's TAG_SPEC_AVOID_DRAFT_REEVAL: "for now, always
     re-evaluate for simplicity").
The draft context therefore alternates between two batch widths every step (slots rows, then slots x (drafts +
1)), and the verify batch is as wide as the drafts made. A draft step is 1-3 together; for each, the phases each
side's computes took (graphdiag's decisions for the trace's batches), counted over the run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ... import events as E


@dataclass
class DraftCycle:
    steps: int = 0
    verify_sizes: Counter = field(default_factory=Counter)
    target: Counter = field(default_factory=Counter)        # phase -> computes in verify batches
    draft: Counter = field(default_factory=Counter)         # phase -> computes in the draft's drafting batches
    reeval: Counter = field(default_factory=Counter)        # phase -> computes re-evaluating a verify batch
    first: list[str] = field(default_factory=list)          # the first draft steps, one line each

    SIDES = (("draft", "draft drafting"), ("target", "target verifying"), ("reeval", "draft re-evaluating"))

    def per_step(self, side: str, phase: str) -> float:
        return getattr(self, side)[phase] / self.steps if self.steps else 0.0

    def findings(self) -> list[str]:
        """What the cycle costs that upstream could avoid: the draft context's warmup reset by its own
        re-evaluation of every verify batch (half or more of the steps)."""
        if not self.steps:
            return []
        resets = self.per_step("reeval", "eager (warmup reset)")
        captures = self.per_step("draft", "capture") + self.per_step("reeval", "capture")
        if resets < 0.5 or captures < 0.5:
            return []
        return [f"the draft context recaptured its graph {captures:.2f} times per draft step: re-evaluating each "
                f"verify batch (its width) between drafting batches (one row per slot) resets its warmup "
                f"{resets:.2f} times per step, so it computes eagerly before it captures again (llama.cpp's "
                f"TAG_SPEC_AVOID_DRAFT_REEVAL: the draft always re-evaluates the drafted tokens)"]

    def to_dict(self) -> dict:
        return {"draft_steps": self.steps, "verify_sizes": dict(self.verify_sizes), "target": dict(self.target),
                "draft": dict(self.draft), "reeval": dict(self.reeval), "first": self.first,
                "findings": self.findings()}


@dataclass(frozen=True)
class BatchPhases:
    t_ns: int
    n_tokens: int
    phases: tuple        # "eager (warmup reset)", "capture", "replay", ... one per compute of its steps
    every_row_out: bool  # every row an output (a drafting batch, or tokens decoded one per sequence)
    rows: tuple = ()     # (token, position) per row: a draft batch equal to a target batch re-evaluates it


def batch_phases(events: list[E.Event]) -> list[BatchPhases]:
    """Each DecodeBatch of a replay record with the phases its steps' computes took."""
    out: list[list] = []
    for ev in events:
        if isinstance(ev, E.DecodeBatch):
            rows = tuple(zip(ev.tokens, ev.positions)) if ev.positions is not None else tuple(ev.tokens)
            out.append([ev.t_ns, ev.n_tokens, [], ev.outputs is not None and len(ev.outputs) == ev.n_tokens, rows])
        elif isinstance(ev, E.PhaseDecided) and out:
            out[-1][2].append(ev.phase + (" (warmup reset)" if ev.why == "warmup reset" else ""))
    return [BatchPhases(t, n, tuple(p), o, r) for t, n, p, o, r in out]


def _line(drafting: list[BatchPhases], verify: BatchPhases, reeval: list[BatchPhases]) -> str:
    def ph(bs):
        return ", ".join(p for b in bs for p in b.phases) or "no compute"
    line = (f"draft {'+'.join(str(d.n_tokens) for d in drafting)} row(s) [{ph(drafting)}] → target verifies "
            f"{verify.n_tokens} [{ph([verify])}]")
    return line + (f" → draft re-evaluates {verify.n_tokens} [{ph(reeval)}]" if reeval else "")


def draft_cycle(target: list[E.Event], draft: list[E.Event], shown: int = 8) -> DraftCycle:
    """The cycle of the two replays' batches, merged in time order: a step is the drafting batches since the
    last target batch, the target batch after them (the verify) and the draft's copy of it (the re-evaluation,
    the same tokens at the same positions)."""
    merged = sorted([(b.t_ns, "target", b) for b in batch_phases(target)]
                    + [(b.t_ns, "draft", b) for b in batch_phases(draft)], key=lambda x: x[0])
    c = DraftCycle()
    pending: list[BatchPhases] = []
    step: tuple | None = None             # (drafting batches, verify batch) until the draft's copy of it comes

    def close(reeval: list[BatchPhases]) -> None:
        c.reeval.update(p for b in reeval for p in b.phases)
        if len(c.first) < shown:
            c.first.append(_line(*step, reeval))

    last_rows = None                      # the last target batch's rows: a draft batch equal to them copies it
    for _, side, b in merged:
        if side == "target":
            if step is not None:          # the previous verify was not copied
                close([])
            step, last_rows = None, b.rows
            if pending:                   # drafting batches came before it: it verifies them
                c.steps += 1
                c.verify_sizes[b.n_tokens] += 1
                c.target.update(b.phases)
                c.draft.update(p for d in pending for p in d.phases)
                step, pending = (pending, b), []
            continue
        copied = b.rows == last_rows
        if step is not None:
            close([b] if copied else [])
            step = None
        if copied:                        # the draft re-evaluated a target batch (a verify, or a prompt's)
            last_rows, pending = None, []
            continue
        # a drafting batch has every row an output
        pending = pending + [b] if b.every_row_out else []
    if step is not None:
        close([])
    return c

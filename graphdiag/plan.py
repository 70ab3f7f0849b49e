"""The step plan of a run: prefills, then decode steps, shaped by a scenario's timeline.

Steps are numbered from 0 over every ubatch (prefills included), as the events number them. Timeline items
apply from their `at_step`: `batch` (sequences decoded together), `idle_s` (clock advanced before the step),
`prefill` (a prefill ubatch of that many tokens for sequence 0 instead of a decode step),
`alternate_batches` (the decode batch cycles through the list, one step each), `new_arena_every` (the
graph's structs move to a new place every N steps, as when each request builds its graph in a fresh
metadata buffer: node pointers, hence graph keys, keep changing), `separate_arena_batch` (decode steps of
that batch, or prefills of that many tokens, build their graph in a separate arena, as a draft model's own
context: graph keys of their own), `fault` (a driver call of that step fails: the step is rolled back and
the walk goes on).

The plan is lazy: `plan_steps` returns a sequence whose length is known at once and whose steps are made
as they are walked, so ten million steps cost nothing before the run starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator


ARENA_SHIFT = 8             # slots a graph moves by each time node pointers change (new_arena_every)
DRAFT_ARENA_SLOT = 1 << 14  # where a separate arena's graphs start (separate_arena_batch): far from the rest


@dataclass(frozen=True)
class StepPlan:
    kind: str            # "prefill" | "decode"
    n_tokens: int = 1    # prefill: prompt tokens
    seq: int = 0         # prefill: the sequence
    batch: int = 1       # decode: sequences 0..batch-1 each get one token
    idle_s: float = 0.0  # advance the runtime's clock by this much before the step
    arena_slot: int = 0  # where the step's graph structs start (0: the context's own metadata buffer)
    fault: str = ""      # a driver-call fault armed for this step ("" none; backends/drivers/faults.py)

    @property
    def tokens(self) -> int:
        """Tokens this step puts in the KV cache (one cell each)."""
        return self.n_tokens if self.kind == "prefill" else self.batch


class Plan:
    """The steps of one run, made on demand. len() is `batch` prefills + `steps` decode steps."""

    def __init__(self, cfg, scenario=None):
        self.batch, self.steps, self.prompt_tokens = cfg.batch, cfg.steps, cfg.prompt_tokens
        timeline = sorted(getattr(scenario, "timeline", None) or [], key=lambda t: t["at_step"])
        self.by_step: dict[int, list] = {}
        for item in timeline:
            self.by_step.setdefault(int(item["at_step"]), []).append(item)

    def __len__(self) -> int:
        return self.batch + self.steps

    def __iter__(self) -> Iterator[StepPlan]:
        for q in range(self.batch):
            yield StepPlan("prefill", n_tokens=self.prompt_tokens, seq=q)
        batch, cycle, k = self.batch, None, 0
        every, since, own = 0, 0, 0        # new_arena_every, its start step; separate_arena_batch
        for step in range(self.batch, self.batch + self.steps):
            idle, prefill, fault = 0.0, 0, ""
            for item in self.by_step.get(step, ()):
                if "batch" in item:
                    batch, cycle = int(item["batch"]), None
                if "alternate_batches" in item:
                    cycle, k = [int(b) for b in item["alternate_batches"]], 0
                if "new_arena_every" in item:
                    every, since = int(item["new_arena_every"]), step
                if "separate_arena_batch" in item:
                    own = int(item["separate_arena_batch"])
                idle += float(item.get("idle_s", 0.0))
                prefill = int(item.get("prefill", 0)) or prefill
                fault = item.get("fault") or fault
            slot = ARENA_SHIFT * (1 + (step - since) // every) if every else 0
            if own and prefill == own:
                slot = DRAFT_ARENA_SLOT
            if prefill:
                yield StepPlan("prefill", n_tokens=prefill, seq=0, idle_s=idle, arena_slot=slot, fault=fault)
                continue
            if cycle:
                batch, k = cycle[k % len(cycle)], k + 1
            if own and batch == own:
                slot = DRAFT_ARENA_SLOT
            yield StepPlan("decode", batch=batch, idle_s=idle, arena_slot=slot, fault=fault)


def plan_steps(cfg, scenario=None) -> Plan:
    """Prefill each of the `batch` sequences, then `steps` decode steps, with the timeline applied."""
    return Plan(cfg, scenario)


@dataclass(frozen=True)
class Demand:
    """What a plan asks of the KV cache, walked until it is satisfied or exceeds `n_ctx`.

    cells: KV cells used at the end (or when the cache overflowed); overflow_step: the step that did not
    fit (None: every step fits); steps: (step, StepPlan, cells used after it) for every step walked."""

    cells: int
    overflow_step: int | None
    steps: tuple


def kv_demand(plan: Plan, n_ctx: int) -> Demand:
    """Cells are never freed and each token takes the lowest free one, so the cells in use after a step are
    the tokens so far. The walk stops at the first step that overflows: at most n_ctx + 1 steps."""
    cells, walked = 0, []
    for step, p in enumerate(plan):
        cells += p.tokens
        if cells > n_ctx:
            return Demand(cells, step, tuple(walked))
        walked.append((step, p, cells))
    return Demand(cells, None, tuple(walked))

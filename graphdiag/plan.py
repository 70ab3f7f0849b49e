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

A prefill longer than n_ubatch (`ubatch_size`, llama.cpp's default 512) is split as llama.cpp splits it:
the caller hands llama_decode at most n_batch (2048) tokens at a time, and the unified KV cache's
split_simple cuts each batch into ubatches of n_ubatch tokens in order, the last one shorter. Each ubatch
is a step of its own; only the prompt's last token is an output, so every ubatch but the last has none
(n_outputs 0). A timeline prefill that takes several ubatches takes that many step numbers: the items of
the steps it covers apply to the step after it.

A replayed trace (graphdiag/trace/replay_plan.py) gives its steps as the caller's own ubatches (kind
"ubatch"): the token ids, positions and sequence ids as llama_decode received them, the rows with logits
(n_outputs), and the cells the caller must have removed before it (llama-server's seq_rm when a slot takes a
new request: a sequence placed again at a position it already holds).

The plan is lazy: `plan_steps` returns a sequence whose length is known at once and whose steps are made
as they are walked, so ten million steps cost nothing before the run starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

N_UBATCH, N_BATCH = 512, 2048   # llama.cpp's default n_ubatch (--ubatch-size) and n_batch (model.kv_sizes, config)


ARENA_SHIFT = 8             # slots a graph moves by each time node pointers change (new_arena_every)
DRAFT_ARENA_SLOT = 1 << 14  # where a separate arena's graphs start (separate_arena_batch): far from the rest


@dataclass(frozen=True)
class StepPlan:
    kind: str            # "prefill" | "decode" | "ubatch" (a caller's ubatch as given: token_ids, ...)
    n_tokens: int = 1    # prefill: prompt tokens
    seq: int = 0         # prefill: the sequence
    batch: int = 1       # decode: sequences 0..batch-1 each get one token
    idle_s: float = 0.0  # advance the runtime's clock by this much before the step
    arena_slot: int = 0  # where the step's graph structs start (0: the context's own metadata buffer)
    fault: str = ""      # a driver-call fault armed for this step ("" none; backends/drivers/faults.py)
    n_outputs: int = 1   # prefill: logits rows (1 for a prompt's last ubatch, 0 for the ubatches before it)
    offset: int = 0      # prefill: the ubatch's first token's index in its prompt
    initial: bool = False  # prefill: part of a sequence's prompt (the plan's first steps), not a timeline one
    token_ids: tuple = ()  # ubatch: the token ids, one per row
    positions: tuple = ()  # ubatch: each row's position
    seq_ids: tuple = ()    # ubatch: each row's sequence id
    removes: tuple = ()    # ubatch: (seq, pos_min) pairs whose cells are removed before it (seq_rm(seq, p0, -1))

    @property
    def tokens(self) -> int:
        """Tokens this step puts in the KV cache (one cell each)."""
        if self.kind == "ubatch":
            return len(self.token_ids)
        return self.n_tokens if self.kind == "prefill" else self.batch


def ubatch_sizes(n_tokens: int, n_ubatch: int, n_batch: int = N_BATCH) -> list[int]:
    """The ubatches a prompt of `n_tokens` is decoded in, in order: batches of at most `n_batch` tokens,
    each cut into ubatches of `n_ubatch` (split_simple over a unified KV cache), the last of each shorter."""
    n_ubatch = max(1, min(n_ubatch, n_batch))          # llama.cpp: n_ubatch = min(n_batch, n_ubatch)
    sizes = []
    for b0 in range(0, n_tokens, n_batch):
        nb = min(n_batch, n_tokens - b0)
        sizes += [min(n_ubatch, nb - u0) for u0 in range(0, nb, n_ubatch)]
    return sizes


def n_ubatches(n_tokens: int, n_ubatch: int, n_batch: int = N_BATCH) -> int:
    """len(ubatch_sizes(...)) without the list (a prompt may be absurdly long: it is refused later)."""
    n_ubatch = max(1, min(n_ubatch, n_batch))
    full, rest = divmod(max(n_tokens, 0), n_batch)
    return full * -(-n_batch // n_ubatch) + -(-rest // n_ubatch)


def plan_length(batch: int, prompt_tokens: int, n_ubatch: int, steps: int) -> int:
    """The steps of a run, as its events number them: each of the `batch` prompts as many steps as it has
    ubatches, then `steps` more (a timeline prefill of several ubatches takes that many of them)."""
    return batch * n_ubatches(prompt_tokens, n_ubatch) + steps


def prefill_ubatches(n_tokens: int, n_ubatch: int, **fields) -> list[StepPlan]:
    """A prefill of `n_tokens` as its ubatches' steps: only the last has an output."""
    sizes, steps, off = ubatch_sizes(n_tokens, n_ubatch), [], 0
    for i, n in enumerate(sizes):
        steps.append(StepPlan("prefill", n_tokens=n, offset=off, n_outputs=int(i == len(sizes) - 1), **fields))
        off += n
    return steps


class Plan:
    """The steps of one run, made on demand. len() is `batch` prefills (each as many steps as its prompt
    has ubatches) + `steps` further steps (a timeline prefill of several ubatches takes that many of them)."""

    def __init__(self, cfg, scenario=None):
        self.batch, self.steps, self.prompt_tokens = cfg.batch, cfg.steps, cfg.prompt_tokens
        self.n_ubatch = int(getattr(cfg, "ubatch_size", N_UBATCH))
        self.n_prompt = n_ubatches(self.prompt_tokens, self.n_ubatch)   # ubatches per prompt
        timeline = sorted(getattr(scenario, "timeline", None) or [], key=lambda t: t["at_step"])
        self.by_step: dict[int, list] = {}
        for item in timeline:
            self.by_step.setdefault(int(item["at_step"]), []).append(item)

    def __len__(self) -> int:
        return plan_length(self.batch, self.prompt_tokens, self.n_ubatch, self.steps)

    def __iter__(self) -> Iterator[StepPlan]:
        for q in range(self.batch):
            yield from prefill_ubatches(self.prompt_tokens, self.n_ubatch, seq=q, initial=True)
        batch, cycle, k = self.batch, None, 0
        every, since, own = 0, 0, 0        # new_arena_every, its start step; separate_arena_batch
        first = self.batch * self.n_prompt
        end = first + self.steps           # not len(self): an absurd --steps is past what len() may return
        step, covered = first, first       # covered: the first step whose timeline items are not yet read
        while step < end:
            idle, prefill, fault = 0.0, 0, ""
            items = [it for s in range(covered, step + 1) for it in self.by_step.get(s, ())]
            covered = step + 1
            for item in items:
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
                for i, u in enumerate(prefill_ubatches(prefill, self.n_ubatch, seq=0, arena_slot=slot)[:end - step]):
                    yield replace(u, idle_s=idle, fault=fault) if i == 0 else u
                    step += 1
                continue
            if cycle:
                batch, k = cycle[k % len(cycle)], k + 1
            if own and batch == own:
                slot = DRAFT_ARENA_SLOT
            yield StepPlan("decode", batch=batch, idle_s=idle, arena_slot=slot, fault=fault)
            step += 1


def max_sequences(plan) -> int:
    """The most sequences any step of the plan holds: llama.cpp's n_seq_max for it (a decode step's batch, a
    prefill's sequence id + 1), which sizes the SWA cache (kv_sizes.swa_cache_size)."""
    return max([1] + [p.batch if p.kind == "decode" else max(p.seq_ids, default=0) + 1 if p.kind == "ubatch"
                      else p.seq + 1 for p in plan])


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

"""The step plan of a run: prefills, then decode steps, shaped by a scenario's timeline.

Steps are numbered from 0 over every ubatch (prefills included), as the events number them. Timeline items
apply from their `at_step`: `batch` (sequences decoded together), `idle_s` (clock advanced before the step),
`prefill` (a prefill ubatch of that many tokens for sequence 0 instead of a decode step),
`alternate_batches` (the decode batch cycles through the list, one step each).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepPlan:
    kind: str            # "prefill" | "decode"
    n_tokens: int = 1    # prefill: prompt tokens
    seq: int = 0         # prefill: the sequence
    batch: int = 1       # decode: sequences 0..batch-1 each get one token
    idle_s: float = 0.0  # advance the runtime's clock by this much before the step


def plan_steps(cfg, scenario=None) -> list[StepPlan]:
    """Prefill each of the `batch` sequences, then `steps` decode steps, with the timeline applied."""
    timeline = sorted(getattr(scenario, "timeline", None) or [], key=lambda t: t["at_step"])
    by_step: dict[int, list[dict]] = {}
    for item in timeline:
        by_step.setdefault(int(item["at_step"]), []).append(item)
    plan: list[StepPlan] = []
    for q in range(cfg.batch):
        plan.append(StepPlan("prefill", n_tokens=cfg.prompt_tokens, seq=q))
    batch, cycle, k = cfg.batch, None, 0
    total = cfg.batch + cfg.steps
    for step in range(cfg.batch, total):
        idle, prefill = 0.0, 0
        for item in by_step.get(step, []):
            if "batch" in item:
                batch, cycle = int(item["batch"]), None
            if "alternate_batches" in item:
                cycle, k = [int(b) for b in item["alternate_batches"]], 0
            idle += float(item.get("idle_s", 0.0))
            prefill = int(item.get("prefill", 0)) or prefill
        if prefill:
            plan.append(StepPlan("prefill", n_tokens=prefill, seq=0, idle_s=idle))
            continue
        if cycle:
            batch, k = cycle[k % len(cycle)], k + 1
        plan.append(StepPlan("decode", batch=batch, idle_s=idle))
    return plan

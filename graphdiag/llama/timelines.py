"""Seeded timelines real llama.cpp can express, for holding graphdiag against it on sequences no scenario ships.

From a seed, one scenario (the format of scenario.py): sequences joining and leaving (1-16 decoded together),
alternations of batch sizes, prefills of 1-1500 tokens (some past n_ubatch 512, so split into ubatches), idle
gaps of 0-12 s (past 10 s the eviction sweep acts), n_kv growing with several sequences, and for the whole run
fusion, graph reuse or PDL off by environment (ggml reads it once per process). Total tokens stay under
`Limits.max_tokens`, within every preset's 4096 KV cells, so a run stays short. The same seed gives the same
scenario, byte for byte; nothing in it is refused by scenario validation or by expressible.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from ..plan import N_UBATCH, n_ubatches

# per-run environments: each is one run's setting, not a timeline change (ggml reads them once per process)
RUN_ENV = (("GGML_CUDA_DISABLE_FUSION", "1"), ("LLAMA_GRAPH_REUSE_DISABLE", "1"), ("GGML_CUDA_PDL", "0"))


@dataclass(frozen=True)
class Limits:
    max_tokens: int = 3000      # KV cells the run fills at most (every preset has 4096)
    max_batch: int = 16         # sequences decoded together
    max_prefill: int = 1500     # tokens of one prefill (initial prompt or mid-run)
    max_idle_s: float = 12.0
    steps: tuple[int, int] = (12, 40)   # decode steps, before any mid-run prefill's ubatches


def timeline(seed: int, model: str = "tiny", limits: Limits = Limits()) -> dict:
    """The scenario's data (name, description, run, env, timeline) for `seed`, on `model`."""
    rng = random.Random(seed)
    batch = rng.randint(1, 4)
    prompt = rng.randint(1, limits.max_prefill) if rng.random() < 0.3 else rng.randint(1, 64)
    prompt = min(prompt, limits.max_tokens // (2 * batch))
    steps = rng.randint(*limits.steps)
    first = batch * n_ubatches(prompt, N_UBATCH)        # the first decode step
    steps += first - batch                               # timeline steps are validated against batch + steps
    env = {k: v for k, v in RUN_ENV if rng.random() < 0.2}
    changes = _changes(rng, limits, (first, batch + steps - 1, first + steps - 1), batch,
                       limits.max_tokens - batch * prompt)
    return {"name": f"gen-{seed}", "description": f"generated timeline, seed {seed} (graphdiag/llama/timelines.py)",
            "run": {"model": model, "prompt_tokens": prompt, "steps": steps, "batch": batch}, "env": env,
            "timeline": changes}


def _changes(rng: random.Random, limits: Limits, steps: tuple[int, int, int], batch: int, budget: int):
    """Timeline entries at decode steps first..last (what scenario validation accepts), the plan running to
    `end`, spending at most `budget` tokens."""
    (first, last, end), out, step, cur = steps, [], steps[0], batch
    while step <= end:
        tokens, left = cur, end - step + 1
        r = rng.random() if step <= last else 1.0       # past `last` the batch stays
        if r < 0.12:
            cur = max(1, min(limits.max_batch, cur + rng.choice((-3, -2, -1, 1, 2, 3, 5, 8))))
            out.append({"at_step": step, "batch": cur})
            tokens = cur
        elif r < 0.17:
            cycle = [rng.randint(1, limits.max_batch) for _ in range(rng.choice((2, 2, 3)))]
            if len(set(cycle)) > 1:
                out.append({"at_step": step, "alternate_batches": cycle})
                cur = max(cycle)                         # tokens counted at the cycle's largest batch
                tokens = cur
        elif r < 0.23:
            n = rng.randint(1, limits.max_prefill) if rng.random() < 0.5 else rng.randint(1, 64)
            n = min(n, budget - cur * left)
            u = n_ubatches(n, N_UBATCH)
            if n >= 1 and step + u - 1 <= last:
                out.append({"at_step": step, "prefill": n})
                budget -= n
                step += u                                # its ubatches take the steps after it
                continue
        if step <= last and rng.random() < 0.08:
            out.append({"at_step": step, "idle_s": round(rng.uniform(0, limits.max_idle_s) * 2) / 2})
        if step <= last and tokens * left > budget:     # fewer sequences, to stay within the cells
            cur = max(1, budget // left)
            out = [e for e in out if e["at_step"] != step or not {"batch", "alternate_batches"} & e.keys()]
            out.append({"at_step": step, "batch": cur})
        budget -= cur
        step += 1
    return out


def to_toml(data: dict) -> str:
    """The scenario file's text."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)
    lines = [f"name = {val(data['name'])}", f"description = {val(data['description'])}", "timeline = ["]
    lines += ["  { " + ", ".join(f"{k} = {val(v)}" for k, v in e.items()) + " }," for e in data["timeline"]]
    lines += ["]", "", "[run]"] + [f"{k} = {val(v)}" for k, v in data["run"].items()]
    if data["env"]:
        lines += ["", "[env]"] + [f"{k} = {val(v)}" for k, v in data["env"].items()]
    return "\n".join(lines) + "\n"


def write_timeline(seed: int, folder: str | Path, model: str = "tiny", limits: Limits = Limits()) -> Path:
    """folder/gen-SEED.toml, loadable with load_scenario (its path)."""
    p = Path(folder) / f"gen-{seed}.toml"
    p.write_text(to_toml(timeline(seed, model, limits)), encoding="utf-8")
    return p

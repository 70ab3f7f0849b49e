"""A soak of the graph runtime on the simulated driver: many decode steps, sampling what must stay flat
(graph entries, live executables, device bytes, Python heap). The KV cache is emptied between rounds (a new
conversation), since cells are never freed within one.

    python tests/support/soak.py [STEPS]        # the benchmark: 10 000 decode steps by default
"""

from __future__ import annotations

import sys
import time
import os
from dataclasses import dataclass

ROUND = 1000          # decode steps per conversation (n_kv grows across 256-cell pads: recaptures each round)


@dataclass(frozen=True)
class Sample:
    step: int
    entries: int           # graph cache entries
    executables: int       # live instantiated graphs (one per chunk of each entry)
    device_bytes: int      # bytes allocated on the simulated device
    rss_bytes: int         # resident set of the process (/proc/self/statm; 0 where there is none)


def soak(steps: int, sample_every: int = ROUND) -> list[Sample]:
    from graphdiag import events as E
    from graphdiag.config import resolve
    from graphdiag.counters import Counters
    from graphdiag.plan import StepPlan
    from graphdiag.runner import RunResult, Session, Stepper

    cfg = resolve({"backend": "sim", "prompt_tokens": 4, "steps": 0, "nvtx": False}, environ={})
    session = Session(cfg, E.EventBus())
    samples: list[Sample] = []
    try:
        result = RunResult({}, [], Counters())
        stepper = Stepper(session, result)
        cache = session.gpu.runtime.cache
        for i in range(steps):
            if i % ROUND == 0:
                session.ctx.kv.remove(0)
                stepper.next_tok.clear()
                stepper.step(StepPlan("prefill", n_tokens=4))
            stepper.step(StepPlan("decode", batch=1))
            result.tokens.clear()
            if (i + 1) % sample_every == 0:
                samples.append(Sample(i + 1, len(cache.entries),
                                      sum(len(e.instances) for e in cache.entries.values()),
                                      session.driver.space.used, _rss()))
    finally:
        session.close()
    return samples


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    t0 = time.perf_counter()
    for s in soak(n):
        print(f"step {s.step:6d}  entries {s.entries}  executables {s.executables}  device {s.device_bytes} B  "
              f"rss {s.rss_bytes / 1e6:.1f} MB")
    print(f"{n} decode steps in {time.perf_counter() - t0:.1f} s")

"""A soak of the graph runtime on the simulated driver: many decode steps, sampling what must stay flat
(graph entries, live executables, device bytes, Python heap). The KV cache is emptied between rounds (a new
conversation), since cells are never freed within one. With `fault_every` N, every N decode steps a launch
fails at a replayed step, and the re-capture at the step after it fails in turn (its capture, its
instantiate or its launch, in rotation): each failed step is rolled back and the run goes on; with `oracle`
every finished step's logits are checked against the numpy forward.

    python tests/support/soak.py [STEPS] [--faults N] [--oracle] [--backend cuda]
                                                # the benchmark: 10 000 decode steps by default
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


SECOND_FAULTS = ("capture", "instantiate", "launch")    # the re-capture's fault, in rotation


def soak(steps: int, sample_every: int = ROUND, fault_every: int = 0, oracle: bool = False, backend: str = "sim",
         seen: list | None = None) -> list[Sample]:
    """Decode `steps` steps; a Sample every `sample_every`. Every event goes to `seen` when given (a list)."""
    from graphdiag import events as E
    from graphdiag.config import resolve
    from graphdiag.counters import Counters
    from graphdiag.errors import CudaError
    from graphdiag.plan import StepPlan
    from graphdiag.runner import RunResult, Session, Stepper

    cfg = resolve({"backend": backend, "prompt_tokens": 4, "steps": 0, "nvtx": False, "oracle": oracle}, environ={})
    bus = E.EventBus()
    if seen is not None:
        bus.subscribe(seen.append)
    session = Session(cfg, bus)
    samples: list[Sample] = []
    try:
        result = RunResult({}, [], Counters())
        stepper = Stepper(session, result)
        cache = session.gpu.runtime.cache
        k = 0
        for i in range(steps):
            if i % ROUND == 0:
                session.ctx.kv.remove(0)
                if session.reference is not None:
                    session.reference.seqs.pop(0, None)      # the oracle's conversation starts again too
                stepper.next_tok.clear()
                stepper.step(StepPlan("prefill", n_tokens=4))
            fault = ""
            if fault_every and i % fault_every == fault_every // 2:      # mid-way between samples
                fault = "launch"
            elif fault_every and i % fault_every == fault_every // 2 + 1:
                fault, k = SECOND_FAULTS[k % len(SECOND_FAULTS)], k + 1
            try:
                stepper.step(StepPlan("decode", batch=1, fault=fault))
            except CudaError:
                if not fault:
                    raise
            result.tokens.clear()
            if (i + 1) % sample_every == 0:
                samples.append(Sample(i + 1, len(cache.entries),
                                      sum(len(e.instances) for e in cache.entries.values()),
                                      _device_bytes(session), _rss()))
    finally:
        session.close()
    return samples


def _device_bytes(session) -> int:
    """Bytes allocated on the device: the simulated driver's count, or (CUDA) total minus free."""
    space = getattr(session.driver, "space", None)
    if space is not None:
        return space.used
    free, total = session.driver.mem_get_info()
    return total - free


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("steps", type=int, nargs="?", default=10_000)
    ap.add_argument("--faults", type=int, default=0, help="a pair of faults every N decode steps")
    ap.add_argument("--oracle", action="store_true")
    ap.add_argument("--backend", default="sim")
    ap.add_argument("--every", type=int, default=ROUND, help="sample every N steps")
    a = ap.parse_args()
    from graphdiag import events as E
    seen: list = []
    t0 = time.perf_counter()
    for s in soak(a.steps, a.every, a.faults, a.oracle, a.backend, seen):
        print(f"step {s.step:6d}  entries {s.entries}  executables {s.executables}  device {s.device_bytes} B  "
              f"rss {s.rss_bytes / 1e6:.1f} MB")
    checks = [e for e in seen if isinstance(e, E.OracleCheck)]
    bad = [e for e in checks if not e.ok]
    print(f"{a.steps} decode steps in {time.perf_counter() - t0:.1f} s on {a.backend}; "
          f"faults injected {sum(isinstance(e, E.FaultInjected) for e in seen)}, missed "
          f"{sum(isinstance(e, E.FaultMissed) for e in seen)}, steps failed "
          f"{sum(isinstance(e, E.StepFailed) for e in seen)}; oracle checks {len(checks)}, over the bound {len(bad)}"
          + (f", max rel err {max(e.rel_err for e in checks):.3g}" if checks else ""))

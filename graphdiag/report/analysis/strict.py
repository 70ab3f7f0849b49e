"""`run --strict`: the findings that fail a run (pure, over the events and the other analyses).

A run is strict-clean when graphs did what a runtime developer expects of them: no eager fallback the user
did not ask for (a split found incompatible, graphs disabled by the device, a capture abandoned), no key
thrash, no executable captured but never replayed, and no flood of update refusals at one key. Warmup
(a key's first calls, and the call after a named property change) and graphs the user disabled
(GGML_CUDA_DISABLE_GRAPHS, --no-graphs, a scenario's graphs_disabled) are explained. A failed step the run
did not recover from (the run ended, or no step finished after it) and a fault that never fired fail too;
a recovered one is reported, not a finding.
"""

from __future__ import annotations

from collections import Counter

from ... import events as E
from .graph_memory import GraphMemory
from .failures import Faults
from .thrash import KeyThrash

REFUSAL_FLOOD = 4        # update refusals at one key (llama.cpp #12420: "CUDA graph update failed" in a loop)


def strict_findings(events, thrash: list[KeyThrash], memory: GraphMemory, faults: Faults | None = None) -> list[str]:
    """One line per cause that fails a strict run (empty: strict-clean)."""
    out = []
    eager_incompatible: Counter = Counter()
    incompatible: dict[int, str] = {}
    refusals: dict[int, Counter] = {}
    for ev in events:
        match ev:
            case E.PhaseDecided(why="incompatible"):
                eager_incompatible[ev.key] += 1
            case E.Incompatible():
                incompatible.setdefault(ev.key, f"node {ev.node} {ev.node_name} ({ev.op}): {ev.rule}")
            case E.GraphsDisabled() if not ev.reason.startswith("env"):   # the option: env, CLI or scenario
                out.append(f"unexplained eager fallback: graphs disabled at key {ev.key:#x} ({ev.reason})")
            case E.CaptureAbandoned():
                out.append(f"unexplained eager fallback: step {ev.step} key {ev.key:#x} capture abandoned "
                           f"({ev.reason})")
            case E.UpdateRefused():
                refusals.setdefault(ev.key, Counter())[ev.reason] += 1
    for key, n in eager_incompatible.items():
        out.append(f"unexplained eager fallback: {n} eager run(s) at key {key:#x}, the split is incompatible "
                   f"({incompatible.get(key, 'MUL_MAT_ID needs a sync')})")
    out += [f"thrash: {t.cause}" for t in thrash]
    if memory.never_replayed:
        more = f" (+{len(memory.never_replayed) - 3} more)" if len(memory.never_replayed) > 3 else ""
        out.append(f"{len(memory.never_replayed)} executable(s) captured but never replayed: "
                   f"{'; '.join(memory.never_replayed[:3])}{more}")
    for key, by in refusals.items():
        if sum(by.values()) >= REFUSAL_FLOOD:
            why = ", ".join(f"{r} ×{n}" for r, n in by.most_common())
            out.append(f"update-refusal flood: key {key:#x} refused {sum(by.values())} updates ({why})")
    if faults is not None:
        out += [f"unrecovered failure: {f.line()}" for f in faults.unrecovered]
        out += [f"fault missed: {m}" for m in faults.missed]
    return out

"""Diagnoses of a traced process (`graphdiag trace`): pure functions over the converted record's events.

Each returns one report line per finding; a trace record's `--strict` fails on any (summary.py). They read
only what a trace observes: update refusals with the node CUDA named, llama.cpp's warmup log lines, the
launches, destroys and synchronisations (TracedCall), the device memory measured around instantiates, and
whether any graph was captured at all.
"""

from __future__ import annotations

import statistics
from ... import events as E

THRASH_CYCLES = 3       # warmup resets after a warmup complete, at least this many: the warmup state cycles
GROWTH_MIN = 3          # executables still held, instantiated after replays began: device memory grows
DRAFT_BUSY = 10         # batches the first llama_context decodes, at least, before a silent second one is named


def trace_findings(events: list[E.Event], reads=()) -> list[str]:
    """Every trace diagnosis, in a fixed order (`reads`: how the trace read the calls, its header's)."""
    return (refused_updates(events) + warmup_thrash(events) + destroyed_in_flight(events)
            + graph_memory_growth(events) + never_captured(events, reads) + idle_draft_context(events))


def refused_updates(events) -> list[str]:
    """Update refusals, grouped by entry, reason and the node they were refused at."""
    seen: dict[tuple, list[int]] = {}
    for ev in events:
        if isinstance(ev, E.UpdateRefused):
            seen.setdefault((ev.key, ev.reason, ev.error_node), []).append(ev.step)
    return [f"update refused ×{len(steps)} at entry {key} ({reason}"
            f"{': ' + node if node else ', no node named'}), first at step {steps[0]}"
            for (key, reason, node), steps in seen.items()]


def warmup_thrash(events) -> list[str]:
    """llama.cpp's warmup reset after warmup complete, again and again: its graph properties keep changing and
    each cycle recaptures (#28652). The period: steps and time between successive resets (medians)."""
    resets, cycles, warm = [], 0, False
    for ev in events:
        if isinstance(ev, E.WarmupTransition):
            if ev.to_state == "warm":
                warm = True
            else:
                cycles += warm
                warm = False
                resets.append((ev.step, ev.t_ns))
    if cycles < THRASH_CYCLES:
        return []
    steps = statistics.median(b[0] - a[0] for a, b in zip(resets, resets[1:]))
    ms = statistics.median(b[1] - a[1] for a, b in zip(resets, resets[1:])) / 1e6
    return [f"warmup thrash: {len(resets)} warmup resets, {cycles} after a warmup complete; one every "
            f"{steps:g} steps ({ms:.3g} ms) — llama.cpp's graph properties keep changing, each cycle recaptures"]


def destroyed_in_flight(events) -> list[str]:
    """An executable destroyed with no synchronisation of its launch's stream, its device or its process's
    context since its last launch (the launch may still run: llama.cpp #26558)."""
    unsynced: dict[tuple, tuple] = {}      # (pid, exec) -> (stream, device, step) of its last launch
    out = []
    for ev in events:
        if not isinstance(ev, E.TracedCall):
            continue
        if ev.fn == "cudaGraphLaunch":
            unsynced[(ev.pid, ev.exec_id)] = (ev.stream, ev.device, ev.step)
        elif ev.fn == "cudaStreamSynchronize":
            unsynced = {x: v for x, v in unsynced.items() if not (x[0] == ev.pid and v[0] == ev.stream)}
        elif ev.fn in ("cudaDeviceSynchronize", "cuCtxSynchronize"):
            unsynced = {x: v for x, v in unsynced.items() if not (x[0] == ev.pid and v[1] == ev.device)}
        elif ev.fn == "cudaGraphExecDestroy":
            last = unsynced.pop((ev.pid, ev.exec_id), None)
            if last is not None:
                out.append(f"executable {ev.exec_id} (entry {ev.key}) destroyed at step {ev.step} while its launch "
                           f"at step {last[2]} on stream {last[0]} may still run (no stream, device or context "
                           f"synchronisation since: llama.cpp #26558)")
    return out


def graph_memory_growth(events) -> list[str]:
    """Executables instantiated after replays began and still held at the last instantiate: device memory
    held by graph executables grows with instantiates (#25835, #26558)."""
    live: dict[int, int] = {}              # entry -> bytes of its held executable
    base, grown, replayed = 0, [], False
    for ev in events:
        match ev:
            case E.ReplayLaunched() if not replayed:
                replayed, base = True, len(live)
            case E.ChunkInstantiated():
                live[ev.key] = ev.mem_bytes
                if replayed and not ev.after_refusal:
                    grown.append((ev.key, ev.mem_bytes))
            case E.Evicted():
                live.pop(ev.key, None)
                grown = [g for g in grown if g[0] != ev.key]
    if len(grown) < GROWTH_MIN or len(live) - base < GROWTH_MIN:
        return []
    mib = sum(b for _, b in grown) / (1 << 20)
    return [f"graph memory growing: {len(grown)} executables instantiated after replays began are still held "
            f"({len(live)} in all, +{mib:.1f} MiB by cuMemGetInfo around their instantiates)"]


def never_captured(events, reads=()) -> list[str]:
    """No graph captured or instantiated in the whole trace (and llama.cpp's reason, where it logged one; where
    the calls were read by interposing libcudart's symbols, what that cannot see)."""
    if any(isinstance(ev, (E.ChunkCaptured, E.ChunkInstantiated)) for ev in events):
        return []
    why = sorted({ev.reason for ev in events if isinstance(ev, E.GraphsDisabled)})
    hint = ("; read with --api interpose, which sees no driver-API call nor a statically linked CUDA runtime: "
            "--api cupti reads both" if "interpose" in reads else "")
    return [f"no CUDA graph captured in the traced process ({'; '.join(why) or 'no reason logged'}{hint})"]


def idle_draft_context(events) -> list[str]:
    """A second llama_context (llama-server's draft model's) that decoded one batch, its warmup, while the first
    decoded many: the server loaded a draft model and never drafted (H100, 2026-12-07: b11434 with -md and no
    --spec-type, 1264 target batches against 1)."""
    per_ctx: dict[int, int] = {}
    for ev in events:
        if isinstance(ev, E.DecodeBatch) and ev.ret == 0:
            per_ctx[ev.ctx] = per_ctx.get(ev.ctx, 0) + 1
    counts = list(per_ctx.values())          # in order of each context's first batch: the target's first
    if len(counts) < 2 or counts[0] < DRAFT_BUSY:
        return []
    return [f"draft model idle: llama_context {i + 1} (a draft model's) decoded 1 batch against the first's "
            f"{counts[0]}: no draft step was made (llama-server drafts with -md only beside --spec-type "
            f"draft-simple)" for i, n in enumerate(counts[1:], start=1) if n == 1]


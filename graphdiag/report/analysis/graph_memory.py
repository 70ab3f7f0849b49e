"""Graph memory: device memory held by each key's executables over a run (pure analysis over events).

Each ChunkInstantiated carries what the executable took (free device memory before minus after the
instantiate: cuMemGetInfo on CUDA; on the simulated driver a model of ~10 KiB per kernel node, labelled
so). Executables live until an update refusal replaces them, a shorter capture drops trailing chunks
(ChunksDestroyed), the key is evicted or a pool flush invalidates every graph. Also found here:
executables captured but never replayed (memory and instantiate time spent for nothing: llama.cpp #20315's
growth), and pool flushes after which a key's graph was unchanged — upstream before PR #26771 kept those
executables and replayed pointers into the flushed pool (#26738); graphdiag (as the fix) drops them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import events as E

FAILED_STEP = "released after a failed step"
SIM_MODEL = "modelled: ~10 KiB of device memory per kernel node (simulated driver)"
CUDA_MEASURED = ("measured: free device memory before - after each instantiate (cuMemGetInfo, which moves in "
                 "the chunks the driver reserves: a small executable may show 0, the next the whole chunk)")


@dataclass
class Executable:
    key: int
    chunk: int
    step: int                     # instantiated at
    mem_bytes: int
    replayed: bool = False
    gone_step: int = -1           # destroyed at (-1: held at the end)
    gone_why: str = ""

    def describe(self) -> str:
        end = f"{self.gone_why} at step {self.gone_step}" if self.gone_step >= 0 else "held at the end"
        return f"key {self.key:#x} chunk {self.chunk} (instantiated at step {self.step}, {end})"


@dataclass
class KeyMemory:
    key: str
    executables: int = 0          # instantiated over the run
    peak_bytes: int = 0
    end_bytes: int = 0
    never_replayed: int = 0


@dataclass
class GraphMemory:
    source: str = ""              # how the bytes were obtained (SIM_MODEL or CUDA_MEASURED)
    keys: list[KeyMemory] = field(default_factory=list)
    peak_bytes: int = 0           # all keys together
    end_bytes: int = 0
    executables: int = 0
    never_replayed: list[str] = field(default_factory=list)     # Executable.describe() of each
    stale_replays_prevented: int = 0
    stale: list[str] = field(default_factory=list)              # "step 9: key 0x… (2 executables)"


def graph_memory(simulated: bool, events) -> GraphMemory:
    """Walk the executables' lifetimes; `simulated` labels the figures as modelled."""
    gm = GraphMemory(source=SIM_MODEL if simulated else CUDA_MEASURED)
    held: dict[tuple[int, int], Executable] = {}
    keys: dict[int, KeyMemory] = {}
    done: list[Executable] = []
    last_props: dict[int, str] = {}                   # key -> the ledger digest of its last graph
    captured: dict[int, str] = {}                     # key -> the digest its executables were captured from
    flushed: dict[int, tuple[int, str, int]] = {}      # key -> (step, props digest, executables) at a flush
    total = 0
    last_step = -1

    def drop(x: Executable, step: int, why: str) -> None:
        nonlocal total
        x.gone_step, x.gone_why = step, why
        total -= x.mem_bytes
        keys[x.key].end_bytes -= x.mem_bytes
        done.append(x)

    for ev in events:
        if isinstance(ev, E.StepStarted):
            last_step = max(last_step, ev.step)
        match ev:
            case E.ChunkInstantiated():
                old = held.pop((ev.key, ev.chunk), None)
                km = keys.setdefault(ev.key, KeyMemory(f"{ev.key:#x}"))
                if old is not None:
                    drop(old, ev.step, "replaced after an update refusal")
                held[(ev.key, ev.chunk)] = Executable(ev.key, ev.chunk, ev.step, ev.mem_bytes)
                km.executables += 1
                km.end_bytes += ev.mem_bytes
                km.peak_bytes = max(km.peak_bytes, km.end_bytes)
                total += ev.mem_bytes
                gm.peak_bytes = max(gm.peak_bytes, total)
            case E.ReplayLaunched():
                for (k, _), x in held.items():
                    if k == ev.key:
                        x.replayed = True
            case E.ChunksDestroyed():
                for c in range(ev.first, ev.first + ev.count):
                    if (ev.key, c) in held:
                        drop(held.pop((ev.key, c)), ev.step, "dropped by a shorter capture")
            case E.Evicted():
                for kc in [kc for kc in held if kc[0] == ev.key]:
                    drop(held.pop(kc), ev.step, "evicted")
            case E.EntryReset():
                for kc in [kc for kc in held if kc[0] == ev.key]:
                    drop(held.pop(kc), ev.step, FAILED_STEP)
            case E.CaptureRun():
                captured[ev.key] = last_props.get(ev.key, "")
            case E.PoolInvalidated():
                for kc in list(held):
                    n = sum(1 for k, _ in held if k == kc[0])
                    if captured.get(kc[0]) == last_props.get(kc[0]):   # the executables are the entry's graph
                        flushed.setdefault(kc[0], (ev.step, last_props.get(kc[0], ""), n))
                    drop(held.pop(kc), ev.step, "invalidated by a pool flush")
            case E.UidMiss() if ev.props_digest:
                last_props[ev.key] = ev.props_digest
                hit = flushed.pop(ev.key, None)
                if hit is not None and hit[1] == ev.props_digest:
                    gm.stale_replays_prevented += 1
                    gm.stale.append(f"step {ev.step}: key {ev.key:#x} would have replayed {hit[2]} "
                                    f"executable(s) captured before the pool flush at step {hit[0]}")
            case E.UidHit() if ev.key in flushed:
                hit = flushed.pop(ev.key)
                gm.stale_replays_prevented += 1
                gm.stale.append(f"step {ev.step}: key {ev.key:#x} would have replayed {hit[2]} executable(s) "
                                f"captured before the pool flush at step {hit[0]}")
    gm.end_bytes = total
    gm.keys = list(keys.values())
    everything = done + list(held.values())
    gm.executables = len(everything)
    # an executable made at the run's last step and still held had no later step to replay in: not a finding
    # nor one released because its step failed (the failure is reported as itself)
    idle = [x for x in sorted(everything, key=lambda x: (x.step, x.key, x.chunk))
            if not x.replayed and not (x.gone_step < 0 and x.step == last_step) and x.gone_why != FAILED_STEP]
    gm.never_replayed = [x.describe() for x in idle]
    for x in idle:
        keys[x.key].never_replayed += 1
    return gm

"""Lines for the diagnoses a Summary carries (thrash, graph memory, strict findings): drawing only."""

from __future__ import annotations


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def diagnosis_lines(s) -> list[str]:
    """Thrash causes, graph memory (peak, end, per key), never-replayed executables, prevented stale replays."""
    out = [f"thrash: {t.cause}; fields that differ: {', '.join(t.differing_fields) or 'none named'}"
           for t in s.thrash]
    out += [f"trace: {x}" for x in s.trace]
    gm = s.graph_memory
    if gm.executables and s.header.llama:        # real llama.cpp: no memory figure per executable
        out.append(f"graph executables: {gm.executables} (their device memory is not observable in llama.cpp)")
    elif gm.executables:
        out.append(f"graph memory ({gm.source}):")
        out.append(f"  peak {_mib(gm.peak_bytes)}, {_mib(gm.end_bytes)} at the end, over {gm.executables} "
                   f"executables")
        out += [f"  key {k.key}: {k.executables} exec, peak {_mib(k.peak_bytes)}, end {_mib(k.end_bytes)}"
                + (f", {k.never_replayed} never replayed" if k.never_replayed else "") for k in gm.keys[:6]]
        if len(gm.keys) > 6:
            out.append(f"  (+{len(gm.keys) - 6} more keys)")
    if gm.never_replayed:
        more = f" (+{len(gm.never_replayed) - 3} more)" if len(gm.never_replayed) > 3 else ""
        out.append(f"captured but never replayed: {len(gm.never_replayed)}: {'; '.join(gm.never_replayed[:3])}{more}")
    out += [f"stale replay prevented: {x}" for x in gm.stale[:3]]
    fs = s.faults
    out += [f.line() for f in fs.failures]
    out += [f"fault absorbed: {x}" for x in fs.absorbed]
    out += [f"fault missed: {x}" for x in fs.missed]
    return out

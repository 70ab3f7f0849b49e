"""A run's decision stream: every decision event with what was decided, without times, uids' absolute
values or driver-specific wording — what two drivers (or two identical runs) must agree on."""

from graphdiag import events as E

DECISION_EVENTS = (
    E.ContextDecision, E.GraphSplit, E.SchedRealloc, E.KeyLookup, E.Evicted, E.GraphsDisabled, E.Incompatible,
    E.UidHit, E.UidMiss, E.NodeCountChanged, E.PropertyDiff, E.WarmupTransition, E.PhaseDecided,
    E.FusionApplied, E.ConcurrentRegion, E.ChunkBoundary, E.ChunkCaptured, E.ChunkInstantiated, E.ChunkUpdated,
    E.UpdateRefused, E.ChunksDestroyed, E.PoolInvalidated,
)
# timings, and the wording of the node a driver blames for a refusal (CUDA describes its own node)
IGNORED = {"t_ns", "duration_ns", "capture_ns", "idle_ns", "error_node", "clock_us", "mem_bytes", "props_digest"}
UID_FIELDS = ("uid", "old_uid")


def _gpu_name(name: str) -> str:
    """The GPU backend is SIM0 on one driver and CUDA0 on the other."""
    return name.replace("SIM", "GPU").replace("CUDA", "GPU")


def decision_stream(events) -> list[tuple]:
    """(kind, field, value, ...) per decision event, uids renumbered by first appearance."""
    uids: dict[int, int] = {0: 0}
    out = []
    for ev in events:
        if not isinstance(ev, DECISION_EVENTS):
            continue
        d = ev.to_dict()
        for f in UID_FIELDS:
            if f in d:
                d[f] = uids.setdefault(d[f], len(uids))
        if "uids" in d:
            d["uids"] = tuple(uids.setdefault(u, len(uids)) for u in d["uids"])
        if "backends" in d:
            d["backends"] = tuple(_gpu_name(n) for n in d["backends"])
        if isinstance(d.get("backend"), str):
            d["backend"] = _gpu_name(d["backend"])
        if "node_name" in d:
            d["node_name"] = _gpu_name(d["node_name"])   # scheduler copies are named after their backend
        if isinstance(ev, E.PropertyDiff) and _is_address(d["field"]):
            d["old"] = d["new"] = "<address>"         # device addresses differ between drivers
        out.append(tuple((k, v) for k, v in d.items() if k not in IGNORED))
    return out


def _is_address(field: str) -> bool:
    """Fields of the node-property snapshot that hold device or struct addresses."""
    return any(w in field for w in ("data", "buffer", "extra"))


def first_difference(a: list, b: list) -> str:
    """'' when equal, else where the two streams part (for assertion messages)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"decision {i}: {dict(x)} != {dict(y)}"
    return "" if len(a) == len(b) else f"lengths {len(a)} != {len(b)} (first extra: {(a + b)[min(len(a), len(b))]})"

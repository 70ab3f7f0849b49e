"""Key thrash: a graph key that keeps switching between graph variants (pure analysis over events).

Each UidMiss carries a fingerprint of the graph the ledger was taken from (node count, a digest over every
ledger byte, a digest over each node's op/type/shape). A key *thrashes* when a variant it already saw comes
back after another one (llama.cpp #28652: with speculative decoding the draft/verify batch and the 1-token
decode alternate under one key; every switch resets warmup, so the key captures, replays little or nothing
and captures again). For each such key: its variants, how many warmup resets the switching caused, what it
cost (eager split runs, capture and instantiate time) and the fields that differ between the variants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import events as E

MIN_RETURNS = 2          # a variant coming back this often (after another one) is thrash, not a change


@dataclass
class Variant:
    """One graph a key saw: `props` digests every ledger byte, `shape` the ops and shapes only."""

    props: str
    shape: str
    n_nodes: int
    first_ne: tuple
    first_step: int
    calls: int = 0                      # ledger comparisons that found this variant


@dataclass
class KeyThrash:
    """A key that alternates between variants. Times in ns (host, or the simulated driver's host time)."""

    key: str                            # hex, as the summary prints keys
    splits: list[int]
    variants: list[Variant]
    switches: int                       # consecutive ledger comparisons that found another variant
    returns: int                        # switches back to a variant seen before
    warmup_resets: int
    eager_runs: int                     # eager split runs of this key from its first switch on
    captures: int
    capture_ns: int
    instantiates: int
    instantiate_ns: int
    replays: int
    differing_fields: list[str] = field(default_factory=list)   # as PropertyDiff names them, + "n_nodes"
    examples: list[str] = field(default_factory=list)           # "node 0 inp_embd ne[1] 4→1"

    @property
    def cause(self) -> str:
        """One line: what alternates, what it caused and cost."""
        what = ", ".join(self.examples[:2]) or ", ".join(self.differing_fields) or "the ledger"
        return (f"key {self.key} alternates between {len(self.variants)} graph variants ({what}): "
                f"{self.switches} switches, {self.warmup_resets} warmup resets, {self.eager_runs} eager runs, "
                f"{self.captures} captures ({self.capture_ns / 1e6:.1f} ms), {self.instantiates} instantiates "
                f"({self.instantiate_ns / 1e6:.1f} ms), {self.replays} replays")


def key_variants(events) -> dict[int, list[tuple[int, Variant]]]:
    """key -> [(step, variant)] in order, one per UidMiss that carries a fingerprint (older records: none)."""
    seen: dict[int, dict[str, Variant]] = {}
    out: dict[int, list[tuple[int, Variant]]] = {}
    for ev in events:
        if not isinstance(ev, E.UidMiss) or not ev.props_digest:
            continue
        vs = seen.setdefault(ev.key, {})
        v = vs.get(ev.props_digest)
        if v is None:
            v = vs[ev.props_digest] = Variant(ev.props_digest, ev.shape_digest, ev.n_nodes, tuple(ev.first_ne),
                                              ev.step)
        v.calls += 1
        out.setdefault(ev.key, []).append((ev.step, v))
    return out


def find_thrash(events, min_returns: int = MIN_RETURNS) -> list[KeyThrash]:
    """Every key whose variants alternate (a variant returns at least `min_returns` times), in key order
    of first appearance."""
    events = list(events)
    found = []
    for key, seq in key_variants(events).items():
        switches, returns, first_switch = 0, 0, None
        seen = {id(seq[0][1])}
        for (_, prev), (step, cur) in zip(seq, seq[1:]):
            if cur is prev:
                continue
            switches += 1
            first_switch = step if first_switch is None else first_switch
            returns += id(cur) in seen
            seen.add(id(cur))
        if returns >= min_returns:
            found.append(_costed(key, seq, switches, returns, first_switch, events))
    return found


def _costed(key: int, seq, switches: int, returns: int, since: int, events) -> KeyThrash:
    variants = list({id(v): v for _, v in seq}.values())
    t = KeyThrash(key=f"{key:#x}", splits=[], variants=variants, switches=switches, returns=returns,
                  warmup_resets=0, eager_runs=0, captures=0, capture_ns=0, instantiates=0, instantiate_ns=0,
                  replays=0)
    fields: dict[str, str] = {}
    for ev in events:
        if ev.key != key:
            continue
        if ev.split >= 0 and ev.split not in t.splits:
            t.splits.append(ev.split)
        match ev:
            case E.WarmupTransition() if ev.to_state != "warm":
                t.warmup_resets += 1
            case E.EagerRun() if ev.step >= since:
                t.eager_runs += 1
            case E.CaptureRun():
                t.captures += 1
                t.capture_ns += ev.duration_ns
            case E.ChunkInstantiated():
                t.instantiates += 1
                t.instantiate_ns += ev.duration_ns
            case E.ReplayLaunched():
                t.replays += 1
            case E.PropertyDiff():
                fields.setdefault(ev.field, f"node {ev.node} {ev.node_name} {ev.field} {ev.old}→{ev.new}")
            case E.NodeCountChanged():
                fields.setdefault("n_nodes", f"node count {ev.old}→{ev.new}")
    t.differing_fields = sorted(fields)
    t.examples = list(fields.values())
    return t

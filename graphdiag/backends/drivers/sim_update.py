"""cuGraphExecUpdate's checks on the simulated driver's graphs, in the order the CUDA driver makes them.

The driver API reference (cuGraphExecUpdate, CUDA 12 and 13) says how an executable's graph and the new one are
matched, and which node a refusal names:
  1. the node counts differ: TOPOLOGY_CHANGED, no node named;
  2. the new graph has more exit nodes: TOPOLOGY_CHANGED at one of its exit nodes;
  3. nodes are paired walking back from the exit nodes along their dependencies, "paired based on edge order";
     a node whose number of dependencies differs from its partner's, or one of whose dependencies is already
     paired with another node, is refused at that node of the new graph (CUgraphExecUpdateResultInfo's
     errorNode, the "to node" of the edge; errorFromNode the dependency). An edge's type is part of the edge:
     a programmatic one (a PDL launch after a kernel node) made ordinary, or back, refuses there too;
  4. on the pairs, a node's type (NODE_TYPE_CHANGED) and a memcpy's direction (PARAMETERS_CHANGED).
So the node named is the first mismatch met walking back from the end of the graph, not the first in capture
order. Measured on the H100 (2026-12-06, graphdiag on CUDA, tiny F16, GGML_CUDA_DISABLE_FUSION=1, 1 -> 2
sequences, PDL on): CUDA named "node 85 of 86", the graph's last node, the output mat-mul (mmvf's PDL launch at
one column, MMF's plain one at two), where a walk in capture order names node 3 (layer 0's Q projection, the
same change). Not measured: which exit node step 2 names where there are several (here: the last captured),
and whether step 4 runs in the walk's order (here it does).
Edges are paired in each node's dependency order (a stream's own position first, then its event waits, as
sim.py records them), so a fork/join joined in the other order pairs its branches crosswise: it updates where
the branches have the same shape, as CUDA does (measured on the H200), with each node's parameters going to
its partner.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .base import UpdateOutcome, UpdateResult
from .sim_graph import Node


@dataclass(frozen=True)
class Match:
    """The outcome and, where it is ok, the pairing: `partner[i]` is the new graph's node for the executable's i."""

    outcome: UpdateOutcome
    partner: list[int] = field(default_factory=list)


class _Refused(Exception):
    def __init__(self, result: UpdateResult, node: str | None):
        self.outcome = UpdateOutcome(False, result, node)


def match_graphs(old: list[Node], new: list[Node]) -> Match:
    """cuGraphExecUpdate's verdict on updating an executable of `old` with `new` (both in capture order)."""
    try:
        pairs = _pair(old, new)
        for n, o in pairs.items():          # the walk's order
            _same_node(old, new, o, n)
    except _Refused as r:
        return Match(r.outcome)
    partner = [0] * len(old)
    for n, o in pairs.items():
        partner[o] = n
    return Match(UpdateOutcome(True), partner)


def _deps(nodes: list[Node], i: int) -> tuple[int, ...]:
    return tuple(dict.fromkeys(nodes[i].deps))       # an edge once, in the order it was made


def _exits(nodes: list[Node]) -> list[int]:
    """Nodes no node depends on, the last captured first."""
    used = {d for n in nodes for d in n.deps}
    return [i for i in reversed(range(len(nodes))) if i not in used]


def _programmatic(nodes: list[Node], to: int, frm: int) -> bool:
    """The edge frm -> to is programmatic: `to` was launched with PDL after a kernel node."""
    return nodes[to].programmatic and nodes[frm].type == "kernel"


def _name(nodes: list[Node], i: int) -> str:
    """As the CUDA driver's refusal is described (cuda.py): 'node 85 of 86: kernel mul_mat_vec_f16'."""
    return f"node {i} of {len(nodes)}: {nodes[i].type} {nodes[i].name}"


def _pair(old: list[Node], new: list[Node]) -> dict[int, int]:
    """new node -> executable's node, in the order the walk back from the exit nodes paired them."""
    if len(old) != len(new):
        raise _Refused(UpdateResult.TOPOLOGY_CHANGED, None)
    x_old, x_new = _exits(old), _exits(new)
    if len(x_new) > len(x_old):
        raise _Refused(UpdateResult.TOPOLOGY_CHANGED,
                       f"{_name(new, x_new[0])}; {len(x_new)} exit nodes, the executable's graph has {len(x_old)}")
    pairs, taken, todo = dict(zip(x_new, x_old)), set(x_old[:len(x_new)]), deque(zip(x_new, x_old))
    while todo:
        n, o = todo.popleft()
        dn, do = _deps(new, n), _deps(old, o)
        if len(dn) != len(do):
            raise _Refused(UpdateResult.TOPOLOGY_CHANGED,
                           f"{_name(new, n)}; {len(dn)} dependencies, its partner had {len(do)}")
        for a, b in zip(dn, do):
            if pairs.get(a, b) != b or (a not in pairs and b in taken):
                raise _Refused(UpdateResult.TOPOLOGY_CHANGED,
                               f"{_name(new, n)}; its dependency node {a} does not pair with node {b}")
            if _programmatic(new, n, a) != _programmatic(old, o, b):
                kind = "programmatic" if _programmatic(new, n, a) else "ordinary"
                raise _Refused(UpdateResult.TOPOLOGY_CHANGED,
                               f"{_name(new, n)}; its edge from node {a} became {kind} (PDL launch changed)")
            if a not in pairs:
                pairs[a] = b
                taken.add(b)
                todo.append((a, b))
    if len(pairs) != len(new):              # an exit node of the executable's graph left unpaired
        raise _Refused(UpdateResult.TOPOLOGY_CHANGED, None)
    return pairs


def _same_node(old: list[Node], new: list[Node], o: int, n: int) -> None:
    a, b = old[o], new[n]
    if a.type != b.type:
        raise _Refused(UpdateResult.NODE_TYPE_CHANGED, f"{_name(new, n)}; was {a.type} {a.name}")
    if a.type == "memcpy" and a.name != b.name:
        raise _Refused(UpdateResult.PARAMETERS_CHANGED, f"{_name(new, n)}; was {a.name}")

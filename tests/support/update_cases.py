"""Pairs of graphs built the same way on any driver (simulated or CUDA), for cuGraphExecUpdate's verdict: which
update is refused, why, and which node it names (graphdiag/backends/drivers/sim_update.py). The CPU test pins the
simulated driver's answers; the GPU test asks the CUDA driver the same and must get the same."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.drivers.base import Launch
from graphdiag.backends.geometry import launch_geometry
from graphdiag.ir.dtypes import GGMLType as G

N = 64


@dataclass(frozen=True)
class Verdict:
    """ok, the result's name, and the node named: (index, node count), None where the driver named none."""

    ok: bool
    result: str
    node: tuple[int, int] | None

    @classmethod
    def of(cls, outcome) -> "Verdict":
        m = re.match(r"node (\d+) of (\d+)", outcome.error_node or "")
        return cls(outcome.ok, outcome.result.name, (int(m[1]), int(m[2])) if m else None)


class Graphs:
    """Buffers a = 1, b = 2, c on `drv`, a stream and two side streams; every launch is c = a + b (add_f32)."""

    def __init__(self, drv):
        self.drv = drv
        self.bufs = [self._put(np.full(N, v, np.float32)) for v in (1, 2, 0)]
        self.s0, self.s1, self.s2 = (drv.stream_create() for _ in range(3))
        self.events = [drv.event_create() for _ in range(3)]
        self.was_pdl = drv.pdl

    def _put(self, a: np.ndarray) -> int:
        addr = self.drv.mem_alloc(a.nbytes)
        self.drv.memcpy_htod(addr, a)
        return addr

    def launch(self, stream, pdl: bool = False) -> None:
        p = new_params()
        a, b, c = self.bufs
        for slot, addr in enumerate((c, a, b)):
            set_desc(p, slot, addr, G.F32, (N, 1, 1, 1), (4, 4 * N, 4 * N, 4 * N))
        grid, block, shmem = launch_geometry("add_f32", p)
        self.drv.launch(stream, self.drv.prepare(Launch("add_f32", grid, block, p, shmem, pdl=pdl)))

    def chain(self, pdl: list[bool]):
        """One stream, a launch per flag, each with PDL where its flag is (programmatic edge from the one before)."""
        self.drv.begin_capture(self.s0)
        for flag in pdl:
            self.launch(self.s0, flag)
        return self.drv.end_capture(self.s0)

    def fork_join(self, branch1: int, branch2: int, join_order=(0, 1)):
        """A launch, two branches of `branch1` and `branch2` launches on side streams, joined back in
        `join_order` (0: the first branch's event), a last launch."""
        d, (fork, j1, j2) = self.drv, self.events
        d.begin_capture(self.s0)
        self.launch(self.s0)
        d.event_record(fork, self.s0)
        for s, n in ((self.s1, branch1), (self.s2, branch2)):
            d.stream_wait_event(s, fork)
            for _ in range(n):
                self.launch(s)
        d.event_record(j1, self.s1)
        d.event_record(j2, self.s2)
        for k in join_order:
            d.stream_wait_event(self.s0, (j1, j2)[k])
        self.launch(self.s0)
        return d.end_capture(self.s0)

    def verdict(self, build_old, build_new) -> Verdict:
        """Capture `build_old()`, instantiate it, capture `build_new()` and update: the driver's verdict."""
        self.drv.set_pdl(True)
        try:
            g1 = build_old()
            x = self.drv.instantiate(g1)
            g2 = build_new()
            out = self.drv.exec_update(x, g2)
        finally:
            self.drv.set_pdl(self.was_pdl)
        self.drv.exec_destroy(x)
        for g in (g1, g2):
            self.drv.graph_destroy(g)
        return Verdict.of(out)

    def close(self) -> None:
        for e in self.events:
            self.drv.event_destroy(e)
        for s in (self.s0, self.s1, self.s2):
            self.drv.stream_destroy(s)
        for b in self.bufs:
            self.drv.mem_free(b)


T, F = True, False
# name -> (old graph, new graph) as calls on a Graphs, and the verdict the simulated driver gives
CASES = {
    # the first node's edge is ordinary either way (nothing before it); nodes 1 and 3 lose PDL: the walk back
    # from the exit node meets node 3 first (H100: a PDL change at nodes 3 ... 85 of 86 named node 85)
    "pdl-changed-at-1-and-3-of-4": (lambda g: g.chain([F, T, T, T]), lambda g: g.chain([F, F, T, F]),
                                    Verdict(False, "TOPOLOGY_CHANGED", (3, 4))),
    "pdl-changed-at-1-of-4": (lambda g: g.chain([F, T, T, T]), lambda g: g.chain([F, F, T, T]),
                              Verdict(False, "TOPOLOGY_CHANGED", (1, 4))),
    "pdl-unchanged": (lambda g: g.chain([F, T, F, T]), lambda g: g.chain([F, T, F, T]),
                      Verdict(True, "SUCCESS", None)),
    "one-node-more": (lambda g: g.chain([F, T, T]), lambda g: g.chain([F, T, T, T]),
                      Verdict(False, "TOPOLOGY_CHANGED", None)),
    # branches of one launch each joined in the other order: paired crosswise, the same shape: updates
    "fork-join-joined-the-other-way": (lambda g: g.fork_join(1, 1), lambda g: g.fork_join(1, 1, (1, 0)),
                                       Verdict(True, "SUCCESS", None)),
    # branches of 1 and 2 launches joined in the other order: the last node's dependencies in edge order pair
    # the 2-launch branch's end with the 1-launch branch's, and walking back the first node is met paired twice
    "fork-join-uneven-joined-the-other-way": (lambda g: g.fork_join(1, 2), lambda g: g.fork_join(1, 2, (1, 0)),
                                              Verdict(False, "TOPOLOGY_CHANGED", (3, 5))),
}

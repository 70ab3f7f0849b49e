"""The simulated driver's device timeline: a MODEL, not a measurement (labelled "modelled" everywhere).

Work is submitted at the driver's modelled host time (SimDriver.modelled_ns, which each launch, copy,
instantiate and update advances) and runs on one modelled device queue: a kernel starts when it is
submitted or when the previous one ends, whichever is later. An eager kernel costs the host LAUNCH_NS
(5 µs) to submit and the device KERNEL_NS plus a little per thread block, so eager steps show the device
waiting on the host; a graph launch submits all its nodes at once and they run back to back.

SimDeviceSource attaches the model (and a LaunchLog) to a simulated driver and hands each step's records
over, attributed and on the host clock; MultiDeviceSource does so for each device of a layer split.
"""

from __future__ import annotations

import itertools
import time

from ...backends.drivers.launch_log import ActivityRecord, LaunchLog
from .attribution import SOURCE_MODELLED, attributed_on_host_clock


class SimActivity:
    KERNEL_NS = 1_500              # modelled device time of a kernel ...
    BLOCK_NS = 4                   # ... plus this per thread block
    MEMCPY_NS = 1_000

    def __init__(self):
        self.records: list[ActivityRecord] = []
        self.cursor = 0
        self._corr = itertools.count(1)

    def _run(self, submit_ns: int, dur: int) -> tuple[int, int]:
        start = max(self.cursor, submit_ns)
        self.cursor = start + dur
        return start, self.cursor

    def kernel_ns(self, grid) -> int:
        blocks = int(grid[0]) * int(grid[1]) * int(grid[2])
        return self.KERNEL_NS + self.BLOCK_NS * blocks

    def kernel(self, name: str, grid, stream: int, submit_ns: int) -> None:
        start, end = self._run(submit_ns, self.kernel_ns(grid))
        self.records.append(ActivityRecord("kernel", name, start, end, stream, correlation=next(self._corr)))

    def memcpy(self, name: str, nbytes: int, stream: int, submit_ns: int) -> None:
        start, end = self._run(submit_ns, self.MEMCPY_NS)
        self.records.append(ActivityRecord("memcpy", name, start, end, stream, nbytes=int(nbytes),
                                           correlation=next(self._corr)))

    def graph(self, nodes, order, graph_id: int, stream: int, submit_ns: int) -> None:
        """One graph launch: its nodes in `order`, back to back, one correlation id for all."""
        corr = next(self._corr)
        for i in order:
            n = nodes[i]
            if n.type == "kernel":
                start, end = self._run(submit_ns, self.kernel_ns(n.grid))
                self.records.append(ActivityRecord("kernel", n.name, start, end, stream, graph_id, n.node_id, corr))
            else:
                start, end = self._run(submit_ns, self.MEMCPY_NS)
                self.records.append(ActivityRecord("memcpy", n.name, start, end, stream, graph_id, n.node_id, corr,
                                                   nbytes=int(n.nbytes)))

    def take(self) -> list[ActivityRecord]:
        out, self.records = self.records, []
        return out


class SimDeviceSource:
    """The simulated driver's modelled device timeline, placed on the host clock at each step's start."""

    source = SOURCE_MODELLED
    simulated = True

    def __init__(self, driver):
        self.driver = driver
        self.log = driver.tracer = LaunchLog()
        self.activity = driver.activity = SimActivity()
        self._offset = 0

    def begin_step(self, host_ns: int | None = None) -> None:
        """`host_ns`: the host instant the step's modelled records start from (now, unless given: the
        devices of a split share one, so how their timelines line up is the model's, not the host's)."""
        self.activity.take()
        self.log.take()
        self.activity.cursor = max(self.activity.cursor, self.driver.modelled_ns)
        self._offset = (time.perf_counter_ns() if host_ns is None else host_ns) - self.driver.modelled_ns

    def end_step(self) -> list[ActivityRecord]:
        """The step's records, attributed, on the host's perf_counter_ns clock."""
        return attributed_on_host_clock(self.activity.take(), self.log, self._offset)

    def close(self) -> None:
        self.driver.tracer = self.driver.activity = None


class MultiDeviceSource:
    """The simulated devices of a layer split: one modelled source each, a step's records tagged with
    their device."""

    source = SOURCE_MODELLED
    simulated = True

    def __init__(self, drivers):
        self.sources = [SimDeviceSource(d) for d in drivers]

    def begin_step(self) -> None:
        now = time.perf_counter_ns()           # one instant for every device (two would differ by host speed)
        for s in self.sources:
            s.begin_step(now)

    def end_step(self) -> list[ActivityRecord]:
        out = []
        for device, s in enumerate(self.sources):
            records = s.end_step()
            for r in records:
                r.device = device
            out += records
        return out

    def close(self) -> None:
        for s in self.sources:
            s.close()

"""Device activity from CUPTI (cupti-python): the one module that imports it.

Kernel (CONCURRENT_KERNEL), memcpy and memset records are buffered by CUPTI and flushed at each step's end
(the step has synchronised by then). With CONCURRENT_KERNEL, the kernels of a replayed graph come back one
record per kernel node, with graph_id and graph_node_id (measured on the H200, driver 580); the node ids of
each captured graph are read at capture time with cuptiGetGraphNodeId (through the driver's
graph_kernel_nodes), so each kernel is named by the graphdiag node(s) it computes. CUPTI's timestamps are
moved onto time.perf_counter_ns by an offset taken at start.
"""

from __future__ import annotations

import time

from ...backends.drivers.launch_log import ActivityRecord, LaunchLog
from .attribution import SOURCE_CUPTI, DeviceSourceUnavailable, attributed_on_host_clock

try:
    from cupti import cupti
except ImportError:          # the optional `gpu` extra
    cupti = None

BUFFER_BYTES = 8 << 20


class CuptiSource:
    source = SOURCE_CUPTI
    simulated = False

    def __init__(self, driver):
        if cupti is None:
            raise DeviceSourceUnavailable("cupti-python is not installed (pip install 'graphdiag[gpu]')")
        self.driver = driver
        self.log = driver.tracer = LaunchLog(node_id_of=cupti.get_graph_node_id)
        self._records: list[ActivityRecord] = []
        self._kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET]
        try:
            cupti.activity_register_callbacks(lambda: (BUFFER_BYTES, 0), self._completed)
            for k in self._kinds:
                cupti.activity_enable(k)
        except Exception as e:             # CUPTI present but refusing (another profiler attached, ...)
            driver.tracer = None
            raise DeviceSourceUnavailable(f"CUPTI refused to trace: {str(e).splitlines()[0]}") from None
        self._offset = time.perf_counter_ns() - cupti.get_timestamp()

    def _completed(self, activities) -> None:
        K = cupti.ActivityKind
        for a in activities:
            if a.kind == K.CONCURRENT_KERNEL or a.kind == K.KERNEL:
                self._records.append(ActivityRecord("kernel", a.name, a.start, a.end, int(a.stream_id),
                                                    int(a.graph_id), int(a.graph_node_id), int(a.correlation_id)))
            elif a.kind == K.MEMCPY:
                self._records.append(ActivityRecord("memcpy", _copy_name(a), a.start, a.end, int(a.stream_id),
                                                    int(a.graph_id), int(a.graph_node_id), int(a.correlation_id),
                                                    nbytes=int(a.bytes)))
            elif a.kind == K.MEMSET:
                self._records.append(ActivityRecord("memset", "memset", a.start, a.end, int(a.stream_id),
                                                    correlation=int(a.correlation_id), nbytes=int(a.bytes)))

    def begin_step(self) -> None:
        pass

    def end_step(self) -> list[ActivityRecord]:
        cupti.activity_flush_all(1)
        records, self._records = self._records, []
        return attributed_on_host_clock(records, self.log, self._offset)

    def close(self) -> None:
        self.driver.tracer = None
        try:
            for k in self._kinds:
                cupti.activity_disable(k)
            cupti.activity_flush_all(1)
        except Exception:
            pass


def _copy_name(a) -> str:
    try:
        return f"memcpy {cupti.ActivityMemcpyKind(a.copy_kind).name}"
    except Exception:
        return "memcpy"

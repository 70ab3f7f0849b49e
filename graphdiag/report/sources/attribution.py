"""Device activity per step, whichever source it comes from (simulated.py's modelled timeline, or CUPTI via
cupti.py): which graphdiag node(s) each kernel computes, and the step's DeviceTime figures.

Attribution (pure): eager kernels take the labels of the eager launches of the same kernel function in
issue order; the kernels of one graph launch (one correlation id) are matched to that launch's captured
kernel nodes by graph node id where the id is known ("node id"), else by their rank in node-id order
("node order"), checked against the kernel names.
"""

from __future__ import annotations

from collections import defaultdict, deque

from ... import events as E
from ...backends.drivers.launch_log import ActivityRecord, GraphLaunch, KernelLaunch, LaunchLog

SOURCE_MODELLED, SOURCE_CUPTI = "modelled", "cupti"


def attributed_on_host_clock(records: list[ActivityRecord], log: LaunchLog, offset_ns: int) -> list[ActivityRecord]:
    """A step's device records named by what the host issued (the log) and moved by offset_ns onto the
    host's perf_counter_ns clock; both device sources end a step with this."""
    attribute(records, log.take())
    for r in records:
        r.start_ns += offset_ns
        r.end_ns += offset_ns
    return records


def attribute(records: list[ActivityRecord], issued: list) -> None:
    """Fill `label` and `via` of each kernel record in place from what the host issued."""
    eager: dict[str, deque] = defaultdict(deque)
    graphs = [g for g in issued if isinstance(g, GraphLaunch)]
    for it in issued:
        if isinstance(it, KernelLaunch):
            eager[it.kernel].append(it.label)
    groups: dict[int, list[ActivityRecord]] = defaultdict(list)
    for r in sorted((r for r in records if r.kind == "kernel"), key=lambda r: r.start_ns):
        if r.graph_id or r.node_id:
            groups[r.correlation].append(r)
        elif eager[r.name]:
            r.label, r.via = eager[r.name].popleft(), "eager order"
    for launch, group in zip(graphs, sorted(groups.values(), key=lambda g: g[0].start_ns)):
        _attribute_graph(launch, group)


def _attribute_graph(launch: GraphLaunch, group: list[ActivityRecord]) -> None:
    by_id = [launch.pos_of_id.get(r.node_id) for r in group]
    if all(p is not None and p < len(launch.labels) and launch.names[p] == r.name for p, r in zip(by_id, group)):
        for p, r in zip(by_id, group):
            r.label, r.via = launch.labels[p], "node id"
        return
    if len(group) == len(launch.labels):
        ranked = sorted(group, key=lambda r: r.node_id)
        if all(launch.names[k] == r.name for k, r in enumerate(ranked)):
            for k, r in enumerate(ranked):
                r.label, r.via = launch.labels[k], "node order"


def busy_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def device_time(step: int, source: str, records: list[ActivityRecord], top: int = 12) -> E.DeviceTime:
    """The step's DeviceTime from its records (kernels: busy, span, idle; copies: time and count)."""
    ks = [r for r in records if r.kind == "kernel"]
    cs = [r for r in records if r.kind != "kernel"]
    busy = busy_ns([(r.start_ns, r.end_ns) for r in ks])
    span = (max(r.end_ns for r in ks) - min(r.start_ns for r in ks)) if ks else 0
    by: dict[str, list] = {}
    for r in ks:
        row = by.setdefault(r.name, [set(), 0, 0])
        if r.label:
            row[0].add(r.label)
        row[1] += r.end_ns - r.start_ns
        row[2] += 1
    rows = sorted(by.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    return E.DeviceTime(step=step, source=source, n_kernels=len(ks), busy_ns=busy, span_ns=span,
                        idle_ns=max(span - busy, 0), n_memcpy=len(cs),
                        memcpy_ns=sum(r.end_ns - r.start_ns for r in cs), attributed=sum(bool(r.label) for r in ks),
                        top=tuple((name, _labels(labels), ns, n) for name, (labels, ns, n) in rows))


def _labels(labels: set[str], most: int = 3) -> str:
    """'attn_norm-0, attn_norm-1 (+14)': which nodes a kernel function computed, shortened."""
    s = sorted(labels)
    return ", ".join(s[:most]) + (f" (+{len(s) - most})" if len(s) > most else "")


class DeviceSourceUnavailable(Exception):
    """No device activity here (one line saying why, e.g. cupti-python is not installed)."""

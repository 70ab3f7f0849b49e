"""What the host issued, kept so device records (CUPTI's, or the simulated driver's modelled ones) can be
named by the graphdiag node(s) each kernel computes.

A driver with a `tracer` calls the hooks below; nothing here imports cuda-python or CUPTI. Per step the log
holds, in issue order, the eager kernel launches (kernel, label) and the graph launches (the executable's
kernel-node labels and names, in the captured graph's node order, and its graph-node-id -> position map).
Executables keep the labels of the graph they were instantiated from, replaced by a successful update's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class ActivityRecord:
    """One device record, CUPTI-shaped. Times are ns (the source's clock until a source converts them to
    the host's perf_counter_ns). graph_id/node_id are 0 outside graph launches; `correlation` groups the
    kernels of one graph launch. `label` and `via` are filled by attribution (report/sources/attribution.py)."""

    kind: str                  # "kernel" | "memcpy" | "memset"
    name: str
    start_ns: int
    end_ns: int
    stream: int = 0
    graph_id: int = 0
    node_id: int = 0
    correlation: int = 0
    nbytes: int = 0
    label: str = ""
    via: str = ""              # "eager order" | "node id" | "node order" | "" (not attributed)
    device: int = 0            # which device of a layer split (--devices N) ran it


@dataclass
class _Graph:
    labels: list[str]
    names: list[str]
    ids: list[int]             # graph node id per kernel node (tools ids, or CUPTI's when node_id_of is set)


@dataclass
class _Exec:
    labels: list[str]
    names: list[str]
    pos_of_id: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GraphLaunch:
    labels: tuple
    names: tuple
    pos_of_id: dict


@dataclass(frozen=True)
class KernelLaunch:
    kernel: str
    label: str


class LaunchLog:
    """The hooks a driver calls when its `tracer` is set. `node_id_of(handle)` (optional) turns a graph node
    handle into the id device records carry (CUPTI's cuptiGetGraphNodeId); without it the driver's tools id
    is used."""

    def __init__(self, node_id_of: Callable[[int], int] | None = None):
        self.node_id_of = node_id_of
        self.issued: list = []
        self._capture: list[tuple[str, str]] | None = None
        self._graphs: dict[int, _Graph] = {}
        self._execs: dict[int, _Exec] = {}

    def on_begin_capture(self) -> None:
        self._capture = []

    def on_launch(self, kernel: str, label: str) -> None:
        if self._capture is not None:
            self._capture.append((kernel, label))
        else:
            self.issued.append(KernelLaunch(kernel, label))

    def on_end_capture(self, graph_key: int, kernel_nodes: list[tuple[int, int]]) -> None:
        got, self._capture = self._capture or [], None
        ids = []
        for handle, tools_id in kernel_nodes:
            nid = tools_id
            if self.node_id_of is not None:
                try:
                    nid = self.node_id_of(handle)
                except Exception:         # an id is a courtesy: attribution falls back to node order
                    pass
            ids.append(nid)
        self._graphs[graph_key] = _Graph([lab for _, lab in got], [k for k, _ in got], ids)
        while len(self._graphs) > 8:      # graphs are destroyed right after instantiate/update
            self._graphs.pop(next(iter(self._graphs)))

    def on_instantiate(self, graph_key: int, exec_key: int) -> None:
        g = self._graphs.get(graph_key)
        if g is not None:
            self._execs[exec_key] = _Exec(list(g.labels), list(g.names), {i: k for k, i in enumerate(g.ids)})

    def on_update(self, exec_key: int, graph_key: int) -> None:
        """A successful update: the executable now computes the new graph's nodes (node ids of both kept)."""
        g, x = self._graphs.get(graph_key), self._execs.get(exec_key)
        if g is None or x is None:
            return
        x.labels, x.names = list(g.labels), list(g.names)
        for k, i in enumerate(g.ids):
            x.pos_of_id.setdefault(i, k)

    def on_exec_destroy(self, exec_key: int) -> None:
        self._execs.pop(exec_key, None)

    def on_graph_launch(self, exec_key: int) -> None:
        x = self._execs.get(exec_key)
        if x is None:
            self.issued.append(GraphLaunch((), (), {}))
        else:
            self.issued.append(GraphLaunch(tuple(x.labels), tuple(x.names), x.pos_of_id))

    def take(self) -> list:
        """What was issued since the last call, in issue order."""
        out, self.issued = self.issued, []
        return out

"""Watch real llama.cpp's CUDA graph calls (CUPTI callbacks) and its log lines, as raw events.

llama.cpp keeps what graphdiag reports to itself: ggml's update-failure reason is thrown away, its debug
messages are compiled out of release builds. Two things still reach a watcher in the same process:

* CUPTI's Callback API on the CUDA runtime: ggml calls cudaStreamBeginCapture / cudaStreamEndCapture,
  cudaGraphInstantiate, cudaGraphExecUpdate (with a result-info struct the caller drops), cudaGraphLaunch and
  cudaGraphExecDestroy. Only those callback ids are enabled (kernel launches are hundreds a step), plus the
  resource callback for graph nodes created, so each captured graph's kernel-node count is known.
* llama.cpp's log callback, which gets ggml's lines even in a release build ("CUDA graph warmup complete",
  "... reset", "CUDA Graph id N reused").

cupti-python 13.0.x does not expose a call's parameters: the C `CUpti_CallbackData` struct is read through its
address instead (`functionParams` at offset 16, `functionReturnValue` at 24), and each call's parameter
struct by the layout CUDA's generated_cuda_runtime_api_meta.h gives it. Handles are reported as CUPTI's
small graph / graph-exec ids, never as pointers.

Each event is a plain dict handed to `sink` (the raw format of tests/data/llama/*.raw.jsonl):
  {"ev": "api", "fn": name, "t0_ns", "t1_ns", "ret", + per call: graph, exec, update_result, error_node,
   nodes, kernel_nodes, and with GRAPHDIAG_WATCH_KERNEL_NAMES=1 kernel_names: each captured kernel's function}
  {"ev": "log", "level", "text"}
Callbacks run on llama.cpp's thread inside its CUDA calls: they only read memory and append.
"""

from __future__ import annotations

import ctypes
import time
from typing import Callable

from ..errors import WatchError

RAW_VERSION = 1

# runtime API functions watched -> how to read their parameters
_CAPTURE_BEGIN, _CAPTURE_END, _INSTANTIATE, _UPDATE, _LAUNCH, _EXEC_DESTROY = (
    "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate", "cudaGraphExecUpdate",
    "cudaGraphLaunch", "cudaGraphExecDestroy")
_CBID_PREFIX = {
    "cudaStreamBeginCapture_": _CAPTURE_BEGIN, "cudaStreamEndCapture_": _CAPTURE_END,
    "cudaGraphInstantiate_": _INSTANTIATE, "cudaGraphInstantiateWithFlags_": _INSTANTIATE,
    "cudaGraphInstantiateWithParams_": _INSTANTIATE, "cudaGraphExecUpdate_": _UPDATE,
    "cudaGraphLaunch_": _LAUNCH, "cudaGraphExecDestroy_": _EXEC_DESTROY,
}
_O_PARAMS, _O_RETVAL = 16, 24          # CUpti_CallbackData: site(4)+pad, functionName*, functionParams*, ret*
_KERNEL_NODE = 0                       # CUgraphNodeType CU_GRAPH_NODE_TYPE_KERNEL


def _ptr(addr: int) -> int:
    return ctypes.c_void_p.from_address(addr).value or 0


def _u32(addr: int) -> int:
    return ctypes.c_uint32.from_address(addr).value


def _result_name(cupti, status) -> str:
    """CUPTI's name for a result code (the number where this CUPTI has no name for it)."""
    try:
        return cupti.Result(status).name
    except ValueError:
        return f"CUPTI result {status}"


def _subscribe_refused(status: str) -> str:
    """The one-line reason cuptiSubscribe refused the watcher."""
    if status == "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED":
        return ("CUPTI already has a subscriber in this process (a profiler attached through CUPTI, such as Nsight "
                "Compute or Nsight Systems?): graphdiag llama watches llama.cpp's graph calls through CUPTI "
                "callbacks, and CUPTI before 13.5 takes one subscriber per process; run it without the profiler")
    return f"CUPTI refused graphdiag's subscriber ({status}): llama.cpp's graph calls cannot be watched"


class LogWatch:
    """llama.cpp's logger routed to `sink` (attach_log), and the ns this watcher's callbacks spent (own_ns):
    they run inside llama_decode, on its thread, so the driver takes them out of llama.cpp's step time."""

    def __init__(self, sink: Callable[[dict], None]):
        self.sink, self.own_ns, self._log_tap = sink, 0, None

    def attach_log(self, llama_cpp_module, echo: bool = False) -> None:
        """Route llama.cpp's (and ggml's) log lines to the sink, one event per complete line."""
        self._log_tap = LogTap(llama_cpp_module, self.sink, self._spent, echo)

    def _spent(self, ns: int) -> None:
        self.own_ns += ns

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class Watch(LogWatch):
    """One CUPTI subscriber on the graph calls of this process, and (with `attach_log`) llama.cpp's logger.

    `start()` subscribes (one subscriber per process before CUPTI 13.5: a second fails with CUPTI's
    MULTIPLE_SUBSCRIBERS error, raised as WatchError, one line); `stop()` unsubscribes. Events go to `sink`."""

    def __init__(self, sink: Callable[[dict], None], kernel_names: bool = False):
        super().__init__(sink)                    # own_ns: CUPTI's callbacks and the log's
        self.kernel_names = kernel_names          # name each captured graph's kernels (a diagnostic; slow)
        self._sub = None
        self._open: dict[int, dict] = {}          # correlation id -> the api event begun at API_ENTER
        self._nodes: dict[int, list[int]] = {}    # graph id -> [nodes, kernel nodes] created in it

    # -- CUPTI -----------------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            from cupti import cupti
        except ImportError as e:
            raise WatchError(f"no CUPTI (cupti-python: {e}): llama.cpp's graph calls cannot be watched") from None
        self._c = cupti
        try:
            self._sub = cupti.subscribe(self._on_callback, None)
        except cupti.cuptiError as e:
            raise WatchError(_subscribe_refused(_result_name(cupti, e.status))) from None
        try:
            self._cbid_fn = {}
            for name, member in cupti.runtime_api_trace_cbid.__members__.items():
                fn = next((f for p, f in _CBID_PREFIX.items() if name.startswith(p)), None)
                if fn is not None:
                    self._cbid_fn[int(member)] = fn
                    cupti.enable_callback(1, self._sub, cupti.CallbackDomain.RUNTIME_API, int(member))
            cupti.enable_callback(1, self._sub, cupti.CallbackDomain.RESOURCE,
                                  int(cupti.CallbackIdResource.GRAPHNODE_CREATED))
        except cupti.cuptiError as e:     # subscribed, but a callback could not be enabled: let go of it
            self.stop()
            raise WatchError(f"CUPTI would not enable graphdiag's callbacks ({_result_name(cupti, e.status)}): "
                             "llama.cpp's graph calls cannot be watched") from None

    def stop(self) -> None:
        if self._sub is not None:
            self._c.unsubscribe(self._sub)
            self._sub = None

    def _on_callback(self, _user, domain, cbid, data) -> None:
        t = time.perf_counter_ns()
        try:
            self._callback(domain, cbid, data)
        finally:
            self.own_ns += time.perf_counter_ns() - t

    def _callback(self, domain, cbid, data) -> None:
        c = self._c
        if domain == c.CallbackDomain.RESOURCE:
            self._on_node(data)
            return
        fn = self._cbid_fn.get(int(cbid))
        if fn is None:
            return
        base = int(data.ptr)
        params = _ptr(base + _O_PARAMS)
        if data.callback_site == c.ApiCallbackSite.API_ENTER:
            ev = {"ev": "api", "fn": fn, "t0_ns": time.perf_counter_ns()}
            if fn == _UPDATE:
                ev["exec"] = c.get_graph_exec_id(_ptr(params))
                ev["graph"] = c.get_graph_id(_ptr(params + 8))
                ev["_info"] = _ptr(params + 16)
            elif fn in (_LAUNCH, _EXEC_DESTROY):
                ev["exec"] = c.get_graph_exec_id(_ptr(params))
            elif fn == _INSTANTIATE:
                ev["graph"] = c.get_graph_id(_ptr(params + 8))
                ev["_pexec"] = _ptr(params)
            elif fn == _CAPTURE_END:
                ev["_pgraph"] = _ptr(params + 8)
            self._open[data.correlation_id] = ev
            return
        ev = self._open.pop(data.correlation_id, None)
        if ev is None:
            return
        ev["t1_ns"] = time.perf_counter_ns()
        retp = _ptr(base + _O_RETVAL)
        ev["ret"] = _u32(retp) if retp else None
        self._finish(ev)
        self.sink(ev)

    def _finish(self, ev: dict) -> None:
        """Read what a call wrote back (its out-parameters), at API_EXIT."""
        c, ok = self._c, ev.get("ret") == 0
        info = ev.pop("_info", None)
        if info is not None:
            ev["update_result"] = _u32(info)
            ev["error_node"] = bool(_ptr(info + 8))
        pexec = ev.pop("_pexec", None)
        if pexec is not None:
            ev["exec"] = c.get_graph_exec_id(_ptr(pexec)) if ok else None
        pgraph = ev.pop("_pgraph", None)
        if pgraph is not None:
            g = _ptr(pgraph) if ok else 0
            ev["graph"] = c.get_graph_id(g) if g else None
            counts = self._nodes.pop(ev["graph"], [0, 0]) if g else [0, 0]
            ev["nodes"], ev["kernel_nodes"] = counts
            if g and self.kernel_names:
                from ..backends.drivers.cuda import graph_kernel_names
                ev["kernel_names"] = graph_kernel_names(g)

    def _on_node(self, data) -> None:
        g = self._c.GraphData.from_ptr(int(data.resource_descriptor))
        counts = self._nodes.setdefault(self._c.get_graph_id(g.graph), [0, 0])
        counts[0] += 1
        counts[1] += int(g.node_type) == _KERNEL_NODE


class LogTap:
    """llama.cpp's (and ggml's) log callback: each complete line to `sink` as {"ev": "log", "level", "text",
    "t_ns"} (perf_counter_ns when its end arrived), the ns spent in the callback to `spent`. The ctypes
    callback is kept alive with the tap: llama.cpp holds its raw pointer."""

    def __init__(self, lib, sink: Callable[[dict], None], spent: Callable[[int], None], echo: bool = False):
        self._buf = ""

        def on_log(level, text, _user):
            t = time.perf_counter_ns()
            self._buf += (text or b"").decode("utf-8", "replace")
            while "\n" in self._buf:
                line, self._buf = self._buf.split("\n", 1)
                if line.strip():
                    sink({"ev": "log", "level": int(level), "text": line, "t_ns": t})
                    if echo:
                        print(line, flush=True)
            spent(time.perf_counter_ns() - t)

        self._cb = lib.llama_log_callback(on_log)
        lib.llama_log_set(self._cb, ctypes.c_void_p())

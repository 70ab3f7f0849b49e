"""graphdiag llama's watcher on the injection library (llama/inject.py): gdtrace lines become the llama stream's
api lines (graph calls only, kernel names when asked), merged in time order with llama.cpp's log lines at each
drain, which the driver makes before each decode_begin and decode_end; without a GPU the library's start fails
with its reason in one line; the cupti-python watcher stays where the library cannot be built or is declined."""

from __future__ import annotations

import json

import pytest

from graphdiag.errors import TraceError, WatchError
from graphdiag.llama.inject import InjectedWatch, api_line
from tests.support.fake_llama import OneTokenBatcher


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    from graphdiag.trace import build
    try:
        return build.library(tmp_path_factory.mktemp("cache"))
    except TraceError as e:
        pytest.skip(str(e))


UPDATE = {"ev": "api", "fn": "cudaGraphExecUpdate", "api": "runtime", "pid": 1, "tid": 1, "device": 0,
          "t0_ns": 50, "t1_ns": 60, "ret": 910, "exec": 2, "graph": 5, "update_result": 2, "error_node": 1,
          "error_node_index": 41, "error_node_kernel": "mul_mat_q_stream_k_fixup"}


def test_a_gdtrace_line_as_a_llama_api_line():
    assert api_line(UPDATE, False) == {"ev": "api", "fn": "cudaGraphExecUpdate", "t0_ns": 50, "t1_ns": 60,
                                       "ret": 910, "graph": 5, "exec": 2, "update_result": 2, "error_node": True,
                                       "error_node_index": 41, "error_node_kernel": "mul_mat_q_stream_k_fixup"}
    end = {"ev": "api", "fn": "cudaStreamEndCapture", "t0_ns": 1, "t1_ns": 2, "ret": 0, "graph": 5, "nodes": 3,
           "kernel_nodes": 2, "kernel_names": ["a", "b"], "stream": 7}
    assert "kernel_names" not in api_line(end, False) and api_line(end, True)["kernel_names"] == ["a", "b"]
    assert "stream" not in api_line(end, True)
    assert api_line({"ev": "api", "fn": "cudaStreamSynchronize", "t0_ns": 1}, True) is None
    assert api_line({"ev": "batch", "n_tokens": 1}, True) is None


def test_drain_merges_calls_and_log_lines_in_time_order(library, tmp_path):
    out: list[dict] = []
    w = InjectedWatch(out.append, library)
    f = tmp_path / "w.raw.jsonl"
    launch = {"ev": "api", "fn": "cudaGraphLaunch", "t0_ns": 30, "t1_ns": 31, "ret": 0, "exec": 2}
    sync = {"ev": "api", "fn": "cudaStreamSynchronize", "t0_ns": 40, "t1_ns": 41, "ret": 0}
    f.write_bytes((json.dumps(launch) + "\n" + json.dumps(sync) + "\n" + json.dumps(UPDATE)[:20]).encode())
    w._f = open(f, "rb")
    w._logs.extend([{"ev": "log", "level": 2, "text": "CUDA Graph id 3 reused", "t_ns": 35},
                    {"ev": "log", "level": 2, "text": "load", "t_ns": 10}])
    w.drain()
    assert [e.get("fn", e.get("text")) for e in out] == ["load", "cudaGraphLaunch", "CUDA Graph id 3 reused"]
    with open(f, "ab") as g:                       # the rest of a line half-written at the last drain
        g.write((json.dumps(UPDATE)[20:] + "\n").encode())
    out.clear()
    w.drain()
    assert [e["fn"] for e in out] == ["cudaGraphExecUpdate"] and out[0]["error_node"] is True
    w._f.close()


def test_without_a_gpu_the_library_says_why_it_did_not_start(library, monkeypatch, tmp_path):
    """No libcuda here: gdtrace_attach returns 0 and its error line becomes the WatchError; the watch file is
    removed. (On the GPU tests/gpu/test_llama_gpu.py runs graphdiag llama on the library.)"""
    import ctypes.util
    if ctypes.util.find_library("cuda"):
        pytest.skip("a CUDA driver is installed here")
    monkeypatch.setenv("GRAPHDIAG_CUPTI_PATH", str(tmp_path / "no-libcupti.so"))
    w = InjectedWatch(lambda ev: None, library)
    with pytest.raises(WatchError, match="injection library did not start: no CUPTI"):
        w.start()
    assert w._path is not None and not w._path.exists()


def test_lead_watcher_takes_the_library_unless_declined(library, monkeypatch):
    from graphdiag.llama import driver
    from graphdiag.trace import build
    monkeypatch.setattr(build, "library", lambda cache: library)
    monkeypatch.delenv("GRAPHDIAG_WATCHER", raising=False)
    monkeypatch.delenv("GGML_CUDA_DISABLE_GRAPHS", raising=False)
    assert driver.LeadWatcher(lambda ev: None, None).kind == "injection library"
    monkeypatch.setenv("GRAPHDIAG_WATCHER", "python")
    assert driver.LeadWatcher(lambda ev: None, None).kind == "cupti-python"
    monkeypatch.delenv("GRAPHDIAG_WATCHER")

    def no_compiler(cache):
        raise TraceError("no C compiler")
    monkeypatch.setattr(build, "library", no_compiler)
    assert driver.LeadWatcher(lambda ev: None, None).kind == "cupti-python"


def test_walk_drains_before_each_decode_begin_and_end():
    from graphdiag.llama.driver import walk
    out: list = []

    class Session:
        def decode(self, b):
            out.append("decode")
            return 0, 1000, [1]

    walk(Session(), [None, None], OneTokenBatcher(), lambda ev: out.append(ev["ev"]), drain=lambda: out.append("drain"))
    assert out == ["drain", "decode_begin", "decode", "drain", "decode_end"] * 2


def test_with_graphs_off_no_cupti_subscriber_is_made_only_the_log_is_read(monkeypatch):
    """GGML_CUDA_DISABLE_GRAPHS (ggml reads its presence: "0" disables too): llama.cpp makes no graph call, so
    the watcher makes no CUPTI subscriber, whose dispatch would slow the graphs-off step `bench steps --peer
    llama` times; llama.cpp's log lines still reach the stream, and their callback's time is the watcher's."""
    import ctypes
    from graphdiag.llama import driver
    from graphdiag.trace import build

    def no_build(cache):
        raise AssertionError("the injection library was asked for")
    monkeypatch.setattr(build, "library", no_build)
    monkeypatch.setenv("GGML_CUDA_DISABLE_GRAPHS", "0")

    class FakeLlama:
        llama_log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

        def llama_log_set(self, cb, user):
            self.cb = cb
    ll, got = FakeLlama(), []
    w = driver.LeadWatcher(got.append, ll)
    assert w.kind.startswith("none: graphs off")
    w.start()
    ll.cb(2, b"ggml_cuda_init: found 1 CUDA devices\n", None)
    w.drain()
    assert [e["text"] for e in got] == ["ggml_cuda_init: found 1 CUDA devices"] and w.own_ns() > 0
    w.close()


WATCH_SCRIPT = r"""
import ctypes, json, sys
from pathlib import Path
from graphdiag.llama.inject import InjectedWatch, preload_interposer
lib = preload_interposer(Path(sys.argv[1]))          # before the consumer, as run.py before llama_cpp
out = []
w = InjectedWatch(out.append, lib, interpose=True)
w.start()
consumer = ctypes.CDLL(sys.argv[2])                   # RTLD_LOCAL with its libcudart, as llama_cpp loads libllama
r = consumer.decode_loop()
w.drain()
calls = consumer.fake_calls_through()
w.stop()
print(json.dumps({"reads": w.reads, "ret": r, "calls": calls, "own": w.own_ns,
                  "fns": [e["fn"] for e in out if e.get("ev") == "api"]}))
"""


def test_the_interposing_watcher_reads_llama_cpps_calls_in_process(tmp_path):
    """GRAPHDIAG_WATCHER=interpose: the interposing build loaded into graphdiag's process before libllama (a
    stand-in consumer of a stand-in libcudart, loaded RTLD_LOCAL as llama_cpp loads libllama): its graph calls
    come to the watcher without CUPTI, each reaching the runtime, the refused update's result returned."""
    import os
    import subprocess
    import sys
    from tests.unit.test_trace_interpose import CALLS, _fakes
    from graphdiag.trace import build
    cache = tmp_path / "cache"
    env = dict(os.environ, GRAPHDIAG_TRACE_API="interpose")
    try:
        build.library(cache, env)
        incs = build.include_dirs(env)
    except TraceError as e:
        pytest.skip(str(e))
    cc, fake_env = _fakes(tmp_path, incs)
    (tmp_path / "c.c").write_text(CALLS + "int fake_calls(void);\n"
                                  "int fake_calls_through(void) { return fake_calls(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "libconsumer.so", tmp_path / "c.c",
                    f"-L{tmp_path}", "-l:libcudart.so.12", f"-Wl,-rpath,{tmp_path}"], check=True)
    run_env = {k: v for k, v in os.environ.items() if k != "GRAPHDIAG_TRACE_API"}
    run_env |= {"LD_LIBRARY_PATH": fake_env["LD_LIBRARY_PATH"], "PYTHONPATH": os.getcwd()}
    res = subprocess.run([sys.executable, "-c", WATCH_SCRIPT, str(cache), str(tmp_path / "libconsumer.so")],
                         env=run_env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["reads"] == "interpose" and got["ret"] == 910 and got["calls"] == 15 and got["own"] >= 0
    assert got["fns"] == ["cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
                          "cudaGraphLaunch", "cudaGraphLaunch", "cudaStreamBeginCapture", "cudaStreamEndCapture",
                          "cudaGraphExecUpdate", "cudaGraphExecDestroy"]     # syncs: not in a llama stream


def test_no_interposer_once_llama_cpp_is_loaded(monkeypatch, tmp_path):
    """Its calls may be bound to libcudart already: the CUPTI watcher then, never a watcher that sees nothing."""
    import sys
    from graphdiag.llama.inject import preload_interposer
    monkeypatch.setitem(sys.modules, "llama_cpp", object())
    assert preload_interposer(tmp_path) is None


def test_lead_watcher_interposes_when_given_the_preloaded_library(monkeypatch, tmp_path):
    from graphdiag.llama import driver, inject
    made = []

    class Fake:
        def __init__(self, sink, library, kernel_names=False, interpose=False):
            made.append((library, interpose))
            self.interpose, self.reads = interpose, None

        def attach_log(self, ll):
            pass

        def start(self):
            self.reads = reads

    monkeypatch.setattr(inject, "InjectedWatch", Fake)
    monkeypatch.delenv("GRAPHDIAG_WATCHER", raising=False)
    monkeypatch.delenv("GGML_CUDA_DISABLE_GRAPHS", raising=False)
    for reads, kind in (("interpose", "injection library, interposing"),
                        ("libcupti.so.13", "injection library, CUPTI (the runtime's symbols were not the "
                                           "interposer's)")):
        w = driver.LeadWatcher(lambda ev: None, None, interposer=tmp_path / "i.so")
        assert w.kind == "injection library, interposing" and made[-1] == (tmp_path / "i.so", True)
        w.start()
        assert w.kind == kind


"""graphdiag trace on the GPU: a PyTorch program (CUDAGraph capture and replay, and an update refused between two
captured graphs of different topology), graphdiag's own CUDA run (its captures and updates one for one against
its own record), and, where llama-cpp-python is installed, a tiny llama.cpp decode loop. Each traced through
`graphdiag trace --events`, the record checked and its report run. Skipped without a GPU."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.errors import TraceError
from graphdiag.report.record.read import read_record

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def gpu():
    from graphdiag.trace.command import check_device
    try:
        check_device()
    except TraceError as e:
        pytest.skip(str(e))


def _trace(tmp_path, argv, expect_rc=0):
    events, raw = tmp_path / "trace.jsonl", tmp_path / "trace.raw.jsonl"
    rc = main(["trace", "--events", str(events), "--raw", str(raw), "-v", "--", *argv])
    assert rc == expect_rc, raw.read_text()[-3000:] if raw.exists() else "no raw stream"
    header, evs = read_record(events)
    assert header.trace["pids"] and not header.trace["errors"]
    assert main(["report", str(events)]) == 0
    return header, evs, [json.loads(x) for x in raw.read_text().splitlines()[1:]]


def _of(evs, cls):
    return [e for e in evs if isinstance(e, cls)]


TORCH = textwrap.dedent("""
    import torch
    from cuda.bindings import runtime as rt
    x = torch.ones(4096, device="cuda"); y = torch.empty_like(x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y.copy_(x * 2)                                  # warm up on a side stream, as torch asks
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y.copy_(x * 2 + 1)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()

    def capture(n):                                     # a raw graph of n kernels on a torch stream
        st = torch.cuda.Stream()
        h = rt.cudaStream_t(st.cuda_stream)
        with torch.cuda.stream(st):
            assert rt.cudaStreamBeginCapture(h, rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed)[0] == 0
            for i in range(n):
                torch.mul(x, 2, out=y) if i % 2 == 0 else torch.add(y, 1, out=x)
            err, graph = rt.cudaStreamEndCapture(h)
        assert err == 0
        return graph, h

    g1, h = capture(1)
    g2, _ = capture(3)
    err, e1 = rt.cudaGraphInstantiate(g1, 0)
    assert err == 0
    rt.cudaGraphLaunch(e1, h); rt.cudaStreamSynchronize(h)
    for _ in range(3):
        rt.cudaStreamSynchronize(h)                     # nothing launched since: not written
    err, info = rt.cudaGraphExecUpdate(e1, g2)       # the bindings give no result info on a refusal (None)
    print("update", err, None if info is None else info.result)
    err, e2 = rt.cudaGraphInstantiate(g2, 0)
    rt.cudaGraphLaunch(e2, h)
    rt.cudaGraphExecDestroy(e2)                         # its launch may still run: llama.cpp #26558's pattern
    rt.cudaStreamSynchronize(h)
    rt.cudaGraphExecDestroy(e1)
""")


def test_trace_a_pytorch_program(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("no torch")
    script = tmp_path / "capture.py"
    script.write_text(TORCH)
    header, evs, raw = _trace(tmp_path, [sys.executable, str(script)])
    caps = _of(evs, E.ChunkCaptured)
    assert len(caps) >= 3 and all(c.n_graph_nodes > 0 for c in caps)
    ends = [r for r in raw if r["ev"] == "api" and r["fn"] == "cudaStreamEndCapture" and r["ret"] == 0]
    assert all(r["kernel_names"] and "?" not in r["kernel_names"] for r in ends), ends
    assert _of(evs, E.ChunkInstantiated) and len(_of(evs, E.ReplayLaunched)) >= 4
    refused = _of(evs, E.UpdateRefused)
    assert len(refused) == 1, [r for r in raw if r.get("fn") == "cudaGraphExecUpdate"]
    upd = next(r for r in raw if r.get("fn") == "cudaGraphExecUpdate")
    assert "update_result" in upd and "error_node" in upd
    print("refused:", refused[0].reason, refused[0].error_node)
    dirty, written = set(), 0            # a sync is written only where it clears a launch (gdtrace.c)
    for r in raw:
        if r["ev"] != "api":
            continue
        if r["fn"] == "cudaGraphLaunch":
            dirty.add((r["pid"], r["device"], r["stream"]))
        elif r["fn"] == "cudaStreamSynchronize":
            hit = {d for d in dirty if d[0] == r["pid"] and d[2] == r["stream"]}
            assert hit, f"a sync with nothing launched on its stream since was written: {r}"
            dirty -= hit
            written += 1
        elif r["fn"] in ("cudaDeviceSynchronize", "cuCtxSynchronize"):
            hit = {d for d in dirty if d[0] == r["pid"] and d[1] == r["device"]}
            assert hit, f"a device sync with nothing launched since was written: {r}"
            dirty -= hit
    assert written >= 2
    from graphdiag.report.analysis.trace_checks import destroyed_in_flight
    flagged = destroyed_in_flight(evs)
    assert len(flagged) == 1 and "may still run" in flagged[0], flagged


TORCH_GRAPH = TORCH.split("\ndef capture")[0]      # torch's own graph calls alone: libcudart's, interposable


@pytest.mark.parametrize("api", ["driver", "interpose"])
def test_other_modes_read_the_same_calls(tmp_path, monkeypatch, api):
    """GRAPHDIAG_TRACE_API=driver (gdtrace.c, start): the runtime's graph and sync calls read at the driver's
    callbacks give the same calls, results and captured graphs as the runtime's callbacks (a device sync named
    cuCtxSynchronize), with half the callbacks a call. =interpose: the runtime's calls read by interposing
    libcudart's symbols, CUPTI never subscribed, give the same for a program linked against a shared libcudart
    (torch's own graph calls: cuda.bindings' runtime reaches the driver without libcudart's symbols)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("no torch")
    script = tmp_path / "capture.py"
    assert "def capture" not in TORCH_GRAPH           # cuda.bindings' calls reach no libcudart symbol
    script.write_text(TORCH if api == "driver" else TORCH_GRAPH)

    def calls(folder, mode):
        folder.mkdir()
        if mode:
            monkeypatch.setenv("GRAPHDIAG_TRACE_API", mode)
        else:
            monkeypatch.delenv("GRAPHDIAG_TRACE_API", raising=False)
        _, _, raw = _trace(folder, [sys.executable, str(script)])
        sync = {"cudaDeviceSynchronize": "cuCtxSynchronize"}
        starts = [r.get("text") for r in raw if r["ev"] == "start"]
        return ([(sync.get(r["fn"], r["fn"]), r["ret"], r.get("kernel_nodes"), r.get("update_result"),
                  r.get("kernel_names")) for r in raw if r["ev"] == "api"],
                {r["api"] for r in raw if r["ev"] == "api"}, starts)
    both, apis, _ = calls(tmp_path / "both", None)
    other, other_apis, starts = calls(tmp_path / api, api)
    assert other == both and "runtime" in apis
    if api == "driver":
        assert other_apis == {"driver"}
    else:
        assert starts == ["interpose"] and other_apis == {"runtime"}
        assert sum(c[0] == "cudaGraphLaunch" for c in other) == 5 and any(c[2] for c in other)


def test_trace_graphdiags_own_cuda_run(tmp_path):
    own = tmp_path / "own.jsonl"
    _, evs, _ = _trace(tmp_path, [sys.executable, "-m", "graphdiag", "run", "--backend", "cuda", "--model", "tiny",
                                  "--steps", "12", "--events", str(own)])
    _, mine = read_record(own)
    for cls in (E.ChunkCaptured, E.ChunkUpdated, E.UpdateRefused):
        assert len(_of(evs, cls)) == len(_of(mine, cls)), cls.__name__
    assert [c.n_graph_nodes for c in _of(evs, E.ChunkCaptured)] == [c.n_graph_nodes for c in _of(mine, E.ChunkCaptured)]
    assert len(_of(evs, E.ChunkInstantiated)) == len(_of(mine, E.ChunkInstantiated))


def _llama_decode_loop(tmp_path):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    model = tmp_path / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(model)]) == 0
    script = tmp_path / "decode.py"
    script.write_text(textwrap.dedent(f"""
        import llama_cpp
        llm = llama_cpp.Llama(model_path={str(model)!r}, n_gpu_layers=-1, n_ctx=512, flash_attn=True, verbose=True)
        llm.eval([1, 2, 3, 4, 5, 6, 7, 8])
        for t in range(16):
            llm.eval([10 + t])
    """))
    return [sys.executable, str(script)]


def test_trace_llama_cpp_decode_loop(tmp_path):
    _, evs, raw = _trace(tmp_path, _llama_decode_loop(tmp_path))
    caps = _of(evs, E.ChunkCaptured)
    assert caps and len(_of(evs, E.ReplayLaunched)) >= 8
    ends = [r for r in raw if r.get("fn") == "cudaStreamEndCapture" and r["ret"] == 0]
    assert all(r["kernel_names"] for r in ends)
    assert any(r.get("fn") == "cudaGraphExecUpdate" and "update_result" in r for r in raw)


def test_an_interposed_trace_of_llama_cpp_decides_as_cuptis(tmp_path, monkeypatch):
    """--api interpose on llama.cpp (libggml-cuda linked against a shared libcudart, loaded by ctypes): the same
    captures (kernel names), updates and their results, launches and steps as the CUPTI trace."""
    cmd = _llama_decode_loop(tmp_path)

    def traced(folder, api):
        folder.mkdir()
        monkeypatch.delenv("GRAPHDIAG_TRACE_API", raising=False)
        if api:
            monkeypatch.setenv("GRAPHDIAG_TRACE_API", api)
        _, evs, raw = _trace(folder, cmd)
        return ([type(e).__name__ for e in evs if isinstance(e, (E.ChunkCaptured, E.ChunkInstantiated, E.ChunkUpdated,
                                                                    E.UpdateRefused, E.ReplayLaunched))],
                [(r["fn"], r["ret"], r.get("kernel_names"), r.get("update_result")) for r in raw
                 if r["ev"] == "api" and r["fn"] != "cudaStreamSynchronize"],
                [r.get("text") for r in raw if r["ev"] == "start"])
    cupti, interposed = traced(tmp_path / "cupti", None), traced(tmp_path / "interpose", "interpose")
    assert interposed[2] == ["interpose"]
    assert interposed[:2] == cupti[:2]

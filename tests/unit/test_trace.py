"""graphdiag trace on the CPU: the injection library compiles and encodes its records; the raw stream converts
into a record whose report, timeline, --strict and diff work; each diagnosis; bad input is one line, exit 2."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.errors import EventFileError, TraceError
from graphdiag.report.analysis import trace_checks as tc
from graphdiag.report.analysis.summary import summarize
from graphdiag.trace import build
from graphdiag.trace.command import run_traced
from graphdiag.trace.convert import convert, convert_raw, error_node, read_record_or_raw
from graphdiag.trace.raw import read_raw

DATA = Path(__file__).resolve().parents[1] / "data" / "trace"
NONE = -(1 << 63)


# -- the C library -------------------------------------------------------------------------------------------
class Rec(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_char_p) for n in ("ev", "fn", "api", "text")]
                + [(n, ctypes.c_int64) for n in ("pid", "tid", "device", "stream", "graph", "exec", "t0_ns", "t1_ns",
                                                 "ret", "nodes", "kernel_nodes", "update_result", "error_node",
                                                 "error_node_index", "error_node_kernel_index", "mem_free_before",
                                                 "mem_free_after")]
                + [("error_node_kernel", ctypes.c_char_p), ("error_from_kernel", ctypes.c_char_p),
                   ("kernel_names", ctypes.POINTER(ctypes.c_char_p)), ("n_kernel_names", ctypes.c_int64)])


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    try:
        path = build.library(tmp_path_factory.mktemp("cache"))
    except TraceError as e:
        pytest.skip(str(e))
    so = ctypes.CDLL(str(path))
    so.gdtrace_encode.restype = ctypes.c_size_t
    so.gdtrace_encode.argtypes = [ctypes.POINTER(Rec), ctypes.c_char_p, ctypes.c_size_t]
    return path, so


def _encode(so, rec: Rec, cap: int = 4096) -> tuple[int, bytes]:
    buf = ctypes.create_string_buffer(cap)
    n = so.gdtrace_encode(ctypes.byref(rec), buf, cap)
    return n, buf.raw[:min(n, cap)]


def _rec(so, **kw) -> Rec:
    r = Rec()
    so.gdtrace_rec_init(ctypes.byref(r))
    for k, v in kw.items():
        setattr(r, k, v.encode() if isinstance(v, str) else v)
    return r


def test_library_exports_only_its_entry_points(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib[0])], capture_output=True, text=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert names == set(build.EXPORTED)


def test_encodes_each_record_kind_as_the_raw_stream_reads_it(lib, tmp_path):
    so = lib[1]
    names = (ctypes.c_char_p * 3)(b'void k<"q">(int)', b"tab\there\\", b"ctl\x01\x1f\x7f")
    recs = [
        _rec(so, ev="start", pid=7, t0_ns=5, text="/x/libcupti.so.13"),
        _rec(so, ev="error", pid=7, t0_ns=6, text='CUPTI refused: "MULTIPLE"\n'),
        _rec(so, fn="cudaStreamEndCapture", api="runtime", pid=7, tid=8, device=0, stream=13, t0_ns=10, t1_ns=20,
             ret=0, graph=1, nodes=4, kernel_nodes=3, kernel_names=ctypes.cast(names, ctypes.POINTER(ctypes.c_char_p)),
             n_kernel_names=3),
        _rec(so, fn="cudaGraphInstantiate", api="driver", pid=7, tid=8, device=1, t0_ns=30, t1_ns=40, ret=0, graph=1,
             exec=2, mem_free_before=1 << 40, mem_free_after=(1 << 40) - 4096),
        _rec(so, fn="cudaGraphExecUpdate", api="runtime", pid=7, tid=8, device=0, t0_ns=50, t1_ns=60, ret=910,
             graph=3, exec=2, update_result=2, error_node=1, error_node_index=41, error_node_kernel_index=40,
             error_node_kernel="mul_mat_q_stream_k_fixup", error_from_kernel="rope_f32"),
        _rec(so, fn="cudaGraphLaunch", api="runtime", pid=7, tid=8, device=0, stream=-1, t0_ns=70, t1_ns=71, ret=0,
             exec=2),
    ]
    lines = []
    for r in recs:
        n, raw = _encode(so, r)
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1 and n == len(raw)
        lines.append(raw.decode())
    objs = [json.loads(x) for x in lines]
    assert list(objs[2]) == ["ev", "fn", "api", "pid", "tid", "device", "stream", "t0_ns", "t1_ns", "ret", "graph",
                             "nodes", "kernel_nodes", "kernel_names"]
    assert objs[2]["kernel_names"] == ['void k<"q">(int)', "tab\there\\", "ctl\x01\x1f\x7f"]
    assert '\\u0001\\u001f\\u007f' in lines[2] and '\\t' in lines[2] and '\\"q\\"' in lines[2]
    assert objs[1] == {"ev": "error", "pid": 7, "t0_ns": 6, "text": 'CUPTI refused: "MULTIPLE"\n'}
    assert objs[3]["mem_free_before"] - objs[3]["mem_free_after"] == 4096
    assert objs[4]["error_node"] is True and objs[4]["error_node_index"] == 41
    assert objs[4]["error_node_kernel"] == "mul_mat_q_stream_k_fixup" and objs[4]["update_result"] == 2
    assert objs[5]["stream"] == -1 and "graph" not in objs[5]
    raw = tmp_path / "r.raw.jsonl"
    raw.write_text('{"raw":"graphdiag-trace","version":1,"cmd":["x"]}\n' + "".join(lines))
    assert len(read_raw(raw)[1]) == 6            # the reader takes every kind the library writes


def test_encode_reports_the_size_it_needs(lib):
    so = lib[1]
    long = "k" * 5000
    r = _rec(so, ev="error", pid=1, text=long)
    n, part = _encode(so, r, cap=64)
    assert n > 5000 and len(part) == 64
    n2, full = _encode(so, r, cap=n + 1)
    assert n2 == n and json.loads(full)["text"] == long


# -- conversion --------------------------------------------------------------------------------------------
def _summary(name):
    h, ev = convert_raw(DATA / f"{name}.raw.jsonl")
    return h, ev, summarize(h, ev)


def test_llama_stream_steps_entries_and_refusal_node():
    h, ev, s = _summary("llama-batch")
    assert s.step_modes == {"capture": 2, "replay": 4, "eager": 1}
    assert [e.key for e in ev if isinstance(e, E.ChunkInstantiated)] == [1, 1]
    assert [e.after_refusal for e in ev if isinstance(e, E.ChunkInstantiated)] == [False, True]
    assert [e.mem_bytes for e in ev if isinstance(e, E.ChunkInstantiated)] == [2 << 20, 2 << 20]
    ref = next(e for e in ev if isinstance(e, E.UpdateRefused))
    assert ref.reason == "TOPOLOGY_CHANGED" and ref.error_node.startswith("node 2: mul_mat_q_stream_k_fixup added")
    assert sum(isinstance(e, E.UidHit) for e in ev) == 3
    assert h.trace["pids"] == [4242] and "graph launch" in h.trace["step"]
    assert s.ended.status == "complete" and s.ended.steps_done == 7
    assert s.trace == [f"update refused ×1 at entry 1 (TOPOLOGY_CHANGED: {ref.error_node}), first at step 5"]


def test_error_node_names():
    old, new = ["a", "b", "c"], ["a", "x", "b", "c"]
    ln = {"error_node": True, "error_node_index": 5, "error_node_kernel_index": 1, "error_node_kernel": "x"}
    assert error_node(ln, old, new).startswith("node 5: x added")
    assert error_node(ln | {"error_node_kernel": "y"}, old, ["a", "y", "c"]).startswith("node 5: b -> y")
    assert error_node(ln | {"error_node_kernel": "c"}, old, ["a", "c"]).startswith("node 5: b removed")
    assert error_node({"error_node": False}, old, ["a"]) == "kernel 1: b removed (CUDA named no node)"
    assert error_node({"error_node": False}, old, ["a", "c"]) == "kernel 1: b removed (CUDA named no node)"
    assert error_node({"error_node": False}, ["m"], ["m", "a", "m"]) == "kernel 1: a added (CUDA named no node)"
    assert error_node({"error_node": False}, old, ["a", "y", "c"]) == "kernel 1: b -> y (CUDA named no node)"
    assert error_node({"error_node": False}, old, list(old)) == ""
    assert error_node(ln | {"error_node_kernel": None}, old, new) == "node 5: not a kernel node"


def test_each_diagnosis_on_its_stream():
    assert _summary("torch-inflight")[2].trace == [
        "executable 1 (entry 1) destroyed at step 2 while its launch at step 2 on stream 7 may still run (no "
        "stream, device or context synchronisation since: llama.cpp #26558)"]
    assert _summary("leak")[2].trace[0].startswith("graph memory growing: 5 executables instantiated after replays")
    assert _summary("thrash")[2].trace[0].startswith("warmup thrash: 4 warmup resets, 4 after a warmup complete; "
                                                     "one every 2 steps")
    assert _summary("disabled")[2].trace == ["no CUDA graph captured in the traced process (llama.cpp's log: "
                                             "disabling CUDA graphs due to unsupported node type)"]


def test_diagnoses_stay_quiet_where_nothing_is_wrong():
    _, ev, _ = _summary("llama-batch")
    assert tc.destroyed_in_flight(ev) == [] and tc.graph_memory_growth(ev) == [] and tc.warmup_thrash(ev) == []
    assert tc.never_captured(ev) == []
    synced = [e for e in _summary("torch-inflight")[1]]
    last = max(i for i, e in enumerate(synced) if isinstance(e, E.TracedCall) and e.fn == "cudaGraphExecDestroy")
    synced.insert(last, E.TracedCall(step=2, fn="cudaStreamSynchronize", stream=7, pid=777))
    assert tc.destroyed_in_flight(synced) == []


def test_diagnoses_only_for_trace_records():
    h, ev, _ = _summary("llama-batch")
    h.trace = {}
    assert summarize(h, ev).trace == []


def test_a_stream_cut_short_ends_failed():
    h, lines = read_raw(DATA / "llama-batch.raw.jsonl")
    _, ev = convert(h, [ln for ln in lines if ln["ev"] != "end"])
    assert ev[-1].status == "failed" and "no end line" in ev[-1].reason


def test_malformed_stream_is_one_line(tmp_path):
    p = tmp_path / "bad.raw.jsonl"
    p.write_text('{"raw":"graphdiag-trace","version":1}\n{"ev":"api","fn":"cudaGraphLaunch","pid":1}\n')
    with pytest.raises(EventFileError, match="bad.raw.jsonl:2: api line without a valid t0_ns"):
        read_raw(p)


# -- report, timeline, strict, diff on a converted record ---------------------------------------------------
def _record(tmp_path, name):
    from graphdiag.report.record.write import JsonlWriter
    h, ev = convert_raw(DATA / f"{name}.raw.jsonl")
    out = tmp_path / f"{name}.jsonl"
    with JsonlWriter(out, h) as w:
        for e in ev:
            w(e)
    return out, h, ev


def test_report_timeline_strict_and_diff(tmp_path, capsys):
    from graphdiag.llama.command import _render
    from graphdiag.llama.run import LlamaResult
    from graphdiag.trace.command import write_outputs
    rec, h, ev = _record(tmp_path, "llama-batch")
    assert main(["report", str(rec)]) == 0
    text = capsys.readouterr().out
    assert "a step is one graph launch" in text and "trace: update refused ×1 at entry 1" in text
    assert main(["report", str(rec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace"]
    res = LlamaResult(DATA / "llama-batch.raw.jsonl", h, ev)
    tl = tmp_path / "t.json"
    write_outputs(res, tmp_path / "e.jsonl", tl)
    trace = json.loads(tl.read_text())
    slices = [x for x in trace["traceEvents"] if x.get("name") == "graph step"]
    assert len(slices) == 7
    assert _render(res, None, True, False, 0, sys.stdout) == 1
    assert "FAILED: strict: trace: update refused" in capsys.readouterr().out
    other, _, _ = _record(tmp_path, "thrash")
    assert main(["diff", str(rec), str(rec)]) == 0
    capsys.readouterr()
    assert main(["diff", str(rec), str(other)]) == 1


# -- running CMD (no GPU: the library is never loaded) and bad input ------------------------------------------
def test_run_passes_stderr_records_graph_lines_and_returns_code(tmp_path):
    script = ("import sys; sys.stderr.write('load\\nggml_backend_cuda_graph_compute: CUDA graph warmup complete\\n');"
              "print('out'); sys.exit(3)")
    raw, echo = tmp_path / "r.raw.jsonl", tmp_path / "echo"
    with open(echo, "wb") as f:
        code = run_traced([sys.executable, "-c", script], raw, tmp_path / "none.so", tmp_path / "none", echo=f)
    assert code == 3
    assert echo.read_bytes() == b"load\nggml_backend_cuda_graph_compute: CUDA graph warmup complete\n"
    head, lines = read_raw(raw)
    assert head["cmd"][0] == sys.executable
    assert [ln["ev"] for ln in lines] == ["log", "end"]
    assert lines[1]["code"] == 3 and lines[1]["status"] == "failed: CMD exited with 3"


def test_run_reports_a_signal_as_128_plus_it(tmp_path):
    code = run_traced([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                      tmp_path / "r.raw.jsonl", tmp_path / "x.so", tmp_path / "x")
    assert code == 143
    assert read_raw(tmp_path / "r.raw.jsonl")[1][-1]["status"] == "interrupted: CMD died of SIGTERM"


@pytest.mark.parametrize("argv, env, message", [
    (["nonexistent-cmd-xyz"], {}, "nonexistent-cmd-xyz: command not found"),
    (["{tmp}/plain.txt"], {}, "plain.txt: not executable"),
    (["true"], {"CC": "/no/such/cc"}, "no C compiler"),
    (["true"], {"GRAPHDIAG_CUPTI_PATH": "/no/libcupti.so"}, "GRAPHDIAG_CUPTI_PATH=/no/libcupti.so: no such file"),
])
def test_bad_input_is_one_line_exit_2(argv, env, message, monkeypatch, capsys, tmp_path):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GRAPHDIAG_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "plain.txt").write_text("not a program\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    events = tmp_path / "e.jsonl"
    assert main(["trace", "--events", str(events), "--", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not events.exists()


def test_no_cupti_found(monkeypatch):
    monkeypatch.delenv("GRAPHDIAG_CUPTI_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(build, "_wheel_dirs", lambda sub: [])
    with pytest.raises(TraceError, match="no CUPTI library found"):
        build.cupti_library()


# -- llama_decode's batches ------------------------------------------------------------------------------------
class Batch(ctypes.Structure):
    _fields_ = [("n_tokens", ctypes.c_int32), ("token", ctypes.POINTER(ctypes.c_int32)),
                ("embd", ctypes.POINTER(ctypes.c_float)), ("pos", ctypes.POINTER(ctypes.c_int32)),
                ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
                ("seq_id", ctypes.POINTER(ctypes.POINTER(ctypes.c_int32))), ("logits", ctypes.POINTER(ctypes.c_int8))]


def _encode_batch(so, b: Batch) -> dict:
    so.gdtrace_encode_batch.restype = ctypes.c_size_t
    so.gdtrace_encode_batch.argtypes = [ctypes.POINTER(Batch)] + [ctypes.c_int64] * 6 + [ctypes.c_char_p,
                                                                                       ctypes.c_size_t]
    n = so.gdtrace_encode_batch(ctypes.byref(b), 7, 8, 0xABC, 10, 20, 0, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    assert so.gdtrace_encode_batch(ctypes.byref(b), 7, 8, 0xABC, 10, 20, 0, buf, n + 1) == n
    line = buf.raw[:n].decode()
    assert line.endswith("}\n") and line.count("\n") == 1
    return json.loads(line)


def test_encodes_a_decode_batch(lib):
    so = lib[1]
    I32 = ctypes.c_int32
    seqs = [(I32 * 2)(0, 3), (I32 * 1)(1), (I32 * 1)(2)]
    b = Batch(3, (I32 * 3)(11, -1, 2 ** 31 - 1), None, (I32 * 3)(5, 0, 9), (I32 * 3)(2, 1, 1),
              (ctypes.POINTER(I32) * 3)(*[ctypes.cast(s, ctypes.POINTER(I32)) for s in seqs]),
              (ctypes.c_int8 * 3)(0, 1, 1))
    obj = _encode_batch(so, b)
    assert obj == {"ev": "batch", "pid": 7, "tid": 8, "ctx": 0xABC, "t0_ns": 10, "t1_ns": 20, "ret": 0,
                   "n_tokens": 3, "tokens": [11, -1, 2 ** 31 - 1], "pos": [5, 0, 9], "seq": [[0, 3], [1], [2]],
                   "out": [1, 2]}
    empty = _encode_batch(so, Batch(2, (I32 * 2)(4, 5), None, None, None, None, None))
    assert (empty["pos"], empty["seq"], empty["out"]) == (None, None, None)
    embd = _encode_batch(so, Batch(1, None, (ctypes.c_float * 4)(), None, None, None, None))
    assert embd["embd"] is True and "tokens" not in embd
    big = _encode_batch(so, Batch(3000, (I32 * 3000)(*range(3000)), None, None, None, None, None))
    assert big["tokens"] == list(range(3000))      # past the 8 KB line buffer: the size it needs


FAKE_LLAMA = r"""
#include <stdint.h>
struct llama_batch { int32_t n_tokens; int32_t *token; float *embd; int32_t *pos; int32_t *n_seq_id;
                     int32_t **seq_id; int8_t *logits; };
int32_t seen_tokens;
int32_t llama_decode(void *ctx, struct llama_batch b) { seen_tokens = b.n_tokens; return b.token[0] == 99 ? 1 : 0; }
"""
FAKE_PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
struct llama_batch { int32_t n_tokens; int32_t *token; float *embd; int32_t *pos; int32_t *n_seq_id;
                     int32_t **seq_id; int8_t *logits; };
int32_t llama_decode(void *ctx, struct llama_batch b);
extern int32_t seen_tokens;
int main(void) {
    int32_t tok[4] = {1, 2, 3, 4}, pos[4] = {0, 1, 2, 3}, n1[4] = {1, 1, 1, 1}, s0 = 0;
    int32_t *seq[4] = {&s0, &s0, &s0, &s0};
    int8_t out[4] = {0, 0, 0, 1};
    struct llama_batch a = {4, tok, 0, pos, n1, seq, out};
    int r1 = llama_decode((void *)0x10, a);
    int32_t t99 = 99, p4 = 4;
    struct llama_batch b = {1, &t99, 0, &p4, 0, 0, 0};
    int r2 = llama_decode((void *)0x10, b);
    printf("%d %d %d\n", r1, r2, seen_tokens);
    return 0;
}
"""


def _build_preloaded(lib, tmp_path, libllama_c: str, program_c: str) -> tuple[Path, dict, Path]:
    """Build a fake libllama and a program linked against it: (the program, the environment graphdiag trace
    runs CMD in: the library in LD_PRELOAD, no CUDA, the raw stream path)."""
    from graphdiag.backends.drivers.launch_loop import compiler
    from graphdiag.trace.command import preload
    cc = compiler(dict(__import__("os").environ))
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "l.c").write_text(libllama_c)
    (tmp_path / "m.c").write_text(program_c)
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "libllama.so", tmp_path / "l.c"], check=True)
    subprocess.run([cc, "-o", tmp_path / "prog", tmp_path / "m.c", f"-L{tmp_path}", "-lllama",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    raw = tmp_path / "raw.jsonl"
    env = {"PATH": "/usr/bin:/bin", "GRAPHDIAG_TRACE_OUT": str(raw), "LD_PRELOAD": preload(str(lib[0]), None)}
    return tmp_path / "prog", env, raw


def _run_preloaded(lib, tmp_path, libllama_c: str, program_c: str):
    """The program of _build_preloaded run to its end: (its stdout, the raw stream path)."""
    prog, env, raw = _build_preloaded(lib, tmp_path, libllama_c, program_c)
    return subprocess.run([prog], env=env, capture_output=True, text=True, check=True).stdout, raw


def test_llama_decode_is_interposed_in_a_program_linked_against_libllama(lib, tmp_path):
    """A program linked against a libllama, run as graphdiag trace runs CMD (LD_PRELOAD): each llama_decode's
    batch is written, the real function still runs and its return comes back. No CUDA: InitializeInjection
    is never called, only the interposer writes."""
    from graphdiag.trace.command import preload
    out, raw = _run_preloaded(lib, tmp_path, FAKE_LLAMA, FAKE_PROGRAM)
    assert out.split() == ["0", "1", "1"]           # the real llama_decode ran both times, its returns kept
    a, b = [json.loads(x) for x in raw.read_text().splitlines()]
    assert (a["tokens"], a["pos"], a["seq"], a["out"], a["ret"], a["ctx"]) == ([1, 2, 3, 4], [0, 1, 2, 3],
                                                                              [[0]] * 4, [3], 0, 16)
    assert (b["tokens"], b["pos"], b["seq"], b["out"], b["ret"]) == ([99], [4], None, None, 1)
    assert a["t0_ns"] <= a["t1_ns"] <= b["t0_ns"]
    assert preload("/x/gd.so", "/a.so /b.so") == "/x/gd.so /a.so /b.so"


def test_a_program_without_cuda_keeps_its_batches(lib, tmp_path, monkeypatch, capsys):
    """graphdiag trace of a program that decodes but never initialises CUDA (a CPU build of llama.cpp): its
    batches are kept and reported as such, not refused as "nothing to trace"."""
    from graphdiag.trace import command
    prog, _, _ = _build_preloaded(lib, tmp_path, FAKE_LLAMA, FAKE_PROGRAM)
    monkeypatch.setattr(build, "library", lambda *a, **kw: lib[0])
    monkeypatch.setattr(build, "cupti_library", lambda *a, **kw: tmp_path / "no-libcupti.so")
    monkeypatch.setattr(command, "check_device", lambda: None)
    events = tmp_path / "t.jsonl"
    assert main(["trace", "--api", "cupti", "--events", str(events), "--", str(prog)]) == 0
    out = capsys.readouterr().out
    assert "no CUDA: " in out and "its 2 llama_decode batches were recorded" in out
    assert sum('"decode_batch"' in ln for ln in events.read_text().splitlines()) == 2


def test_a_header_says_whether_its_trace_never_initialised_cuda():
    """RunHeader.traced_without_cuda (report's "no CUDA:" line, replay's refusal): batches but no CUDA process."""
    from graphdiag.report.record.header import RunHeader
    said = lambda trace: RunHeader(trace=trace).traced_without_cuda
    assert said({"pids": [], "decode_batches": 2})
    assert not said({"pids": [41], "decode_batches": 2})      # a CUDA process: its decisions were traced
    assert not said({"pids": [], "decode_batches": 0})         # nothing at all (trace refuses such a run)
    assert not said({})                                        # not a trace


FAKE_LONG_PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
struct llama_batch { int32_t n_tokens; int32_t *token; float *embd; int32_t *pos; int32_t *n_seq_id;
                     int32_t **seq_id; int8_t *logits; };
int32_t llama_decode(void *ctx, struct llama_batch b);
int main(void) {
    int32_t t = 7, p = 0;
    struct llama_batch b = {1, &t, 0, &p, 0, 0, 0};
    llama_decode((void *)0x10, b);
    printf("decoded\n");
    fflush(stdout);
    sleep(30);                              /* a server between requests: the test reads, then kills it */
    return 0;
}
"""


FAKE_FORKING_PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
struct llama_batch { int32_t n_tokens; int32_t *token; float *embd; int32_t *pos; int32_t *n_seq_id;
                     int32_t **seq_id; int8_t *logits; };
int32_t llama_decode(void *ctx, struct llama_batch b);
static void decode(int32_t t) { int32_t p = 0; struct llama_batch b = {1, &t, 0, &p, 0, 0, 0}; llama_decode(0, b); }
int main(void) {
    decode(1);                              /* buffered in the parent when it forks */
    pid_t child = fork();
    if (child == 0) { decode(2); return 0; }
    waitpid(child, 0, 0);
    decode(3);
    return 0;
}
"""


def test_a_forked_child_writes_its_own_lines_not_its_parents_buffer(lib, tmp_path):
    """A line the parent buffered before fork() is the parent's to write: the child starts with an empty buffer
    (pthread_atfork), so every batch is in the file once; and the child's line carries the child's process and
    thread ids, not the ids the library read (and keeps) in the parent."""
    out, raw = _run_preloaded(lib, tmp_path, FAKE_LLAMA, FAKE_FORKING_PROGRAM)
    lines = {json.loads(x)["tokens"][0]: json.loads(x) for x in raw.read_text().splitlines()}
    assert sorted(lines) == [1, 2, 3]
    assert lines[1]["pid"] == lines[3]["pid"] != lines[2]["pid"]
    assert lines[2]["tid"] == lines[2]["pid"] and lines[1]["tid"] == lines[1]["pid"]


def test_a_buffered_line_is_written_while_the_process_runs(lib, tmp_path):
    """The per-token lines (batches, launches, syncs) wait in the library's buffer, but no longer than its
    flusher's period (GD_FLUSH_NS, 20 ms): a long-running process's last batch is in the file while it still
    runs, and a process killed outright (SIGKILL: no destructor) has lost nothing older than that."""
    import signal
    import time
    prog, env, raw = _build_preloaded(lib, tmp_path, FAKE_LLAMA, FAKE_LONG_PROGRAM)
    proc = subprocess.Popen([prog], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "decoded"
        deadline = time.monotonic() + 5
        while not raw.exists() or not raw.read_text():
            assert time.monotonic() < deadline, "the batch line was not written while the process ran"
            time.sleep(0.01)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (line,) = raw.read_text().splitlines()
    assert json.loads(line)["tokens"] == [7]


FAKE_LLAMA_EXT = r"""
#include <stdint.h>
#include <stdlib.h>
#include <stdbool.h>
/* a stand-in for llama.cpp's llama_batch_ext: up to 8 tokens, refuses a 9th and tokens >= 1000 */
struct llama_batch_ext { int n; int32_t tok[8]; };
struct llama_embd { const float *data; size_t n_rows, n_embd; };
int32_t decoded;
struct llama_batch_ext *llama_batch_ext_init(void *ctx) { return calloc(1, sizeof(struct llama_batch_ext)); }
void llama_batch_ext_free(struct llama_batch_ext *b) { free(b); }
void llama_batch_ext_clear(struct llama_batch_ext *b) { b->n = 0; }
int32_t llama_batch_ext_add_token(struct llama_batch_ext *b, int32_t seq, int32_t id) {
    if (b->n == 8) return -1;
    if (id >= 1000) return -2;
    b->tok[b->n] = id; return b->n++;
}
int32_t llama_batch_ext_add_embd(struct llama_batch_ext *b, int32_t seq, struct llama_embd e) {
    if (b->n == 8 || !e.data) return -1;
    b->tok[b->n] = -1; return b->n++;
}
bool llama_batch_ext_add_seq(struct llama_batch_ext *b, int32_t idx, int32_t seq) { return idx < b->n; }
bool llama_batch_ext_set_pos(struct llama_batch_ext *b, int32_t idx, const int32_t *pos) { return idx < b->n; }
bool llama_batch_ext_set_output_logits(struct llama_batch_ext *b, int32_t idx, bool v) { return idx < b->n; }
int32_t llama_process(void *ctx, int32_t type, struct llama_batch_ext *b) { decoded += b->n; return b->tok[0] == 99; }
"""
FAKE_SERVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
struct llama_batch_ext;
struct llama_embd { const float *data; size_t n_rows, n_embd; };
struct llama_batch_ext *llama_batch_ext_init(void *ctx);
void llama_batch_ext_free(struct llama_batch_ext *b);
void llama_batch_ext_clear(struct llama_batch_ext *b);
int32_t llama_batch_ext_add_token(struct llama_batch_ext *b, int32_t seq, int32_t id);
int32_t llama_batch_ext_add_embd(struct llama_batch_ext *b, int32_t seq, struct llama_embd e);
bool llama_batch_ext_add_seq(struct llama_batch_ext *b, int32_t idx, int32_t seq);
bool llama_batch_ext_set_pos(struct llama_batch_ext *b, int32_t idx, const int32_t *pos);
bool llama_batch_ext_set_output_logits(struct llama_batch_ext *b, int32_t idx, bool v);
int32_t llama_process(void *ctx, int32_t type, struct llama_batch_ext *b);
extern int32_t decoded;
/* as llama.cpp's common_batch::get_sub_batch builds a server's batch: clear, add, set_pos, add_seq, output */
static void add(struct llama_batch_ext *b, int32_t tok, int32_t pos, int32_t seq, int out) {
    int32_t p[4] = {pos, 0, 0, 0};
    int32_t i = llama_batch_ext_add_token(b, seq, tok);
    if (i < 0) return;
    llama_batch_ext_set_pos(b, i, p);
    if (out) llama_batch_ext_set_output_logits(b, i, true);
}
int main(void) {
    struct llama_batch_ext *b = llama_batch_ext_init((void *)0x20);
    llama_batch_ext_clear(b);
    add(b, 5, 0, 0, 0); add(b, 6, 1, 0, 1); add(b, 7, 40, 2, 1);
    llama_batch_ext_add_seq(b, 0, 3);
    int r1 = llama_process((void *)0x20, 1, b);                 /* decode: written */
    int r0 = llama_process((void *)0x20, 0, b);                 /* encode: not written */
    llama_batch_ext_clear(b);
    add(b, 99, 2, 0, 1);
    int r2 = llama_process((void *)0x20, 1, b);
    llama_batch_ext_clear(b);
    add(b, 5, 3, 0, 0); add(b, 5000, 4, 0, 1);                  /* the real add refuses 5000: not mirrored */
    int r3 = llama_process((void *)0x20, 1, b);
    llama_batch_ext_clear(b);
    float e[4] = {0};
    struct llama_embd em = {e, 1, 4};
    int32_t p[4] = {7, 0, 0, 0};
    llama_batch_ext_set_pos(b, llama_batch_ext_add_embd(b, 1, em), p);
    int r4 = llama_process((void *)0x20, 1, b);
    llama_batch_ext_free(b);
    printf("%d %d %d %d %d %d\n", r1, r0, r2, r3, r4, decoded);
    return 0;
}
"""


def test_llama_process_batches_are_mirrored_from_their_builder_calls(lib, tmp_path):
    """llama.cpp's extended batch is opaque: a program building it through llama_batch_ext_* and decoding it with
    llama_process (as llama-server and llama-bench do since 2026) has each decode written from the builder calls
    the library mirrored; every real call still runs and returns as it would; an encode is not written."""
    out, raw = _run_preloaded(lib, tmp_path, FAKE_LLAMA_EXT, FAKE_SERVER)
    assert out.split() == ["0", "0", "1", "0", "0", "9"]     # the real functions ran: 3+3+1+1+1 tokens decoded
    a, b, c, d = [json.loads(x) for x in raw.read_text().splitlines()]
    assert (a["n_tokens"], a["tokens"], a["pos"], a["seq"], a["out"], a["ctx"], a["ret"]) == (
        3, [5, 6, 7], [0, 1, 40], [[0, 3], [0], [2]], [1, 2], 0x20, 0)
    assert (b["tokens"], b["pos"], b["out"], b["ret"]) == ([99], [2], [0], 1)
    assert (c["tokens"], c["pos"], c["out"]) == ([5], [3], [])   # the refused token is not there, nor its output
    assert (d["n_tokens"], d.get("embd"), d["pos"], d["seq"]) == (1, True, [7], [[1]])
    converted = tmp_path / "c.raw.jsonl"
    head = {"raw": "graphdiag-trace", "version": 1, "cmd": ["llama-server"]}
    converted.write_text(json.dumps(head) + "\n" + raw.read_text())
    header, events = convert_raw(converted)
    batches = [e for e in events if isinstance(e, E.DecodeBatch)]
    assert header.trace["decode_batches"] == 4 and batches[0].seqs == ((0, 3), (0,), (2,))


def test_batches_convert_to_decode_batch_events(tmp_path):
    head = {"raw": "graphdiag-trace", "version": 1, "cmd": ["llama-server"]}
    lines = [
        {"ev": "start", "pid": 1, "t0_ns": 1},
        {"ev": "batch", "pid": 1, "tid": 2, "ctx": 5, "t0_ns": 10, "t1_ns": 90, "ret": 0, "n_tokens": 2,
         "tokens": [7, 8], "pos": [0, 1], "seq": [[0], [0]], "out": [1]},
        {"ev": "api", "fn": "cudaGraphLaunch", "api": "runtime", "pid": 1, "tid": 2, "device": 0, "stream": 3,
         "t0_ns": 50, "t1_ns": 60, "ret": 0, "exec": 4},
        {"ev": "batch", "pid": 1, "tid": 2, "ctx": 5, "t0_ns": 100, "t1_ns": 190, "ret": 0, "n_tokens": 1,
         "embd": True, "pos": None, "seq": None, "out": None},
    ]
    raw = tmp_path / "b.raw.jsonl"
    raw.write_text("\n".join(json.dumps(x) for x in [head, *lines]) + "\n")
    header, events = convert_raw(raw)
    batches = [e for e in events if isinstance(e, E.DecodeBatch)]
    assert [(b.step, b.tokens, b.positions, b.seqs, b.outputs, b.duration_ns) for b in batches] == [
        (-1, (7, 8), (0, 1), ((0,), (0,)), (1,), 80), (0, (), None, None, None, 90)]
    assert batches[1].embd and header.trace["decode_batches"] == 2
    assert not any("llama_decode" in x for x in header.trace["not_observable"])
    assert E.Event.from_dict(json.loads(json.dumps(batches[0].to_dict()))) == batches[0]
    bare = tmp_path / "n.raw.jsonl"
    bare.write_text("\n".join(json.dumps(x) for x in [head, lines[0], lines[2]]) + "\n")
    assert any("no llama_decode seen" in x for x in convert_raw(bare)[0].trace["not_observable"])


# -- bench trace ---------------------------------------------------------------------------------------------
FAKE_BENCH = """#!/bin/sh
# a llama-bench stand-in: JSON lines when asked (-o jsonl, the last -o), slower when traced
case "$*" in *"-o jsonl"*) ;; *) echo "no jsonl asked" >&2; exit 3;; esac
ts=100
if [ -n "$GRAPHDIAG_TRACE_OUT" ]; then   # traced: two launches and the library's own time at exit, as gdtrace
  ts=98
  L='{"ev":"api","fn":"cudaGraphLaunch","api":"runtime","pid":1,"tid":1,"t0_ns":1,"t1_ns":2,"ret":0,"exec":3,"stream":4}'
  S='{"ev":"start","pid":1,"t0_ns":0,"text":"'"${GRAPHDIAG_TRACE_API:-libcupti.so.13}"'"}'
  printf '%s\n%s\n%s\n%s\n' "$S" "$L" "$L" '{"ev":"own","pid":1,"t_ns":5,"own_ns":6000}' >> "$GRAPHDIAG_TRACE_OUT"
fi
echo "| model | test | t/s |"
echo '{"n_prompt": 512, "n_gen": 0, "avg_ts": 5000.0}'
echo "{\\"n_prompt\\": 0, \\"n_gen\\": 128, \\"avg_ts\\": $ts.0}"
"""


def test_bench_trace_compares_plain_and_traced_llama_bench(tmp_path):
    from graphdiag.trace.overhead import bench_trace, parse_llama_bench
    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE_BENCH)
    exe.chmod(0o755)
    rows = bench_trace([str(exe), "-m", "x.gguf"], 3, tmp_path / "none.so", tmp_path / "none")
    by = {r["test"]: r for r in rows}
    assert set(by) == {"pp512", "tg128"}
    assert by["tg128"]["plain"] == 100 and by["tg128"]["traced"] == 98 and by["tg128"]["ratio"] == 0.98
    assert by["pp512"]["ratio"] == 1.0 and by["pp512"]["unit"] == "tokens/s"
    assert parse_llama_bench('{"n_prompt": 512, "n_gen": 128, "avg_ts": 7}\nnot json\n') == {"pp512+tg128": 7.0}
    from graphdiag.trace.overhead import render
    lines = []
    render(rows, [str(exe)], lines.append)
    assert "  one traced run recorded: 2 cudaGraphLaunch, 1 end" in lines and "  calls read through: cupti" in lines
    import os
    rows = bench_trace([str(exe)], 1, tmp_path / "none.so", tmp_path / "none",
                       environ=dict(os.environ, GRAPHDIAG_TRACE_API="interpose"))
    lines = []
    render(rows, [str(exe)], lines.append)
    assert "  calls read through: interpose" in lines           # the traced runs took the environment given
    assert "  the library's own time in its CUDA calls: 0.01 ms, 3.00 µs per graph launch" in lines


FAKE_FLIPPING_BENCH = """#!/bin/sh
# a llama-bench stand-in on a host that runs at half speed for the 2nd and 4th runs (round 1's traced run,
# round 2's plain one: round 2 runs traced first)
n=$(cat "$COUNTER" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$COUNTER"
ts=100; [ -n "$GRAPHDIAG_TRACE_OUT" ] && ts=98
case $n in 2|4) ts=$((ts / 2));; esac
echo "{\\"n_prompt\\": 0, \\"n_gen\\": 128, \\"avg_ts\\": $ts.0}"
"""


def test_bench_trace_compares_each_sides_fastest_round_too(tmp_path, monkeypatch):
    """Round ratios 49/100 and 98/50 (the host slow for one side of each round): their median says 1.22, the
    two sides' fastest rounds 98/100."""
    from graphdiag.trace.overhead import bench_trace, render
    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE_FLIPPING_BENCH)
    exe.chmod(0o755)
    monkeypatch.setenv("COUNTER", str(tmp_path / "n"))
    (row,) = bench_trace([str(exe)], 2, tmp_path / "none.so", tmp_path / "none")
    assert row["ratio"] == pytest.approx((0.49 + 1.96) / 2) and row["ratio_fastest"] == pytest.approx(0.98)
    lines = []
    render([row], [str(exe)], lines.append)
    assert lines[2].split()[-1] == "0.9800"


def test_bench_trace_times_any_other_program_and_needs_it_to_succeed(tmp_path):
    from graphdiag.trace.overhead import bench_trace
    rows = bench_trace(["true"], 2, tmp_path / "none.so", tmp_path / "none")
    assert [r["test"] for r in rows] == ["wall_s"] and rows[0]["unit"] == "s" and rows[0]["rounds"] == 2
    with pytest.raises(TraceError, match="exited with 1 in round 1"):
        bench_trace(["false"], 1, tmp_path / "none.so", tmp_path / "none")
    loop = tmp_path / "loop"                        # any program printing llama-bench's lines is read as it is
    loop.write_text('#!/bin/sh\necho \'{"n_prompt": 0, "n_gen": 1000, "avg_ts": 6480.5}\'\n')
    loop.chmod(0o755)
    (row,) = bench_trace([str(loop)], 1, tmp_path / "none.so", tmp_path / "none")
    assert (row["test"], row["unit"], row["plain"]) == ("tg1000", "tokens/s", 6480.5)
    exe = tmp_path / "llama-bench-quiet"
    exe.write_text("#!/bin/sh\necho nothing\n")
    exe.chmod(0o755)
    with pytest.raises(TraceError, match="printed no llama-bench results"):
        bench_trace([str(exe)], 1, tmp_path / "none.so", tmp_path / "none")


def test_bench_trace_without_a_command_is_one_line(capsys):
    assert main(["bench", "trace"]) == 2
    assert "give the command to measure after --" in capsys.readouterr().err


def test_an_unmirrored_batch_is_named_and_not_replayed(tmp_path):
    """A llama_process batch whose builder calls the library missed is written with n_tokens -1: the record says
    so, and replay refuses it rather than guessing its tokens."""
    from graphdiag.errors import UsageError
    from graphdiag.trace.replay_plan import trace_batches
    head = {"raw": "graphdiag-trace", "version": 1, "cmd": ["llama-server"]}
    lines = [{"ev": "start", "pid": 1, "t0_ns": 1},
             {"ev": "batch", "pid": 1, "tid": 2, "ctx": 5, "t0_ns": 10, "t1_ns": 90, "ret": 0, "n_tokens": -1,
              "tokens": None, "pos": None, "seq": None, "out": None}]
    raw = tmp_path / "u.raw.jsonl"
    raw.write_text("\n".join(json.dumps(x) for x in [head, *lines]) + "\n")
    header, events = convert_raw(raw)
    assert any("contents of 1 decode batches" in x for x in header.trace["not_observable"])
    with pytest.raises(UsageError, match="1 of the trace's 1 decode batches were not mirrored"):
        trace_batches(events)


# -- a raw stream read as a record; what a report says of a program that is not llama.cpp ---------------------
def test_report_and_diff_read_a_raw_stream_as_trace_converts_it(capsys):
    raw = DATA / "llama-batch.raw.jsonl"
    h, ev = read_record_or_raw(raw)
    h2, ev2 = convert_raw(raw)
    assert h.trace == h2.trace and [e.to_dict() for e in ev] == [e.to_dict() for e in ev2]
    assert main(["report", str(raw)]) == 0
    assert "trace: update refused ×1 at entry 1" in capsys.readouterr().out
    assert main(["diff", str(raw), str(raw)]) == 0


def test_llama_counters_of_a_trace_are_its_logged_reuses_and_none_for_other_programs(capsys):
    h, ev, s = _summary("llama-batch")
    assert h.trace["graph_log_lines"] > 0
    assert s.llama_counters == {"graphs reused (its log's uid hits)": 3}
    h, ev, s = _summary("torch-inflight")
    assert h.trace["graph_log_lines"] == 0 and h.trace["decode_batches"] == 0
    assert s.llama_counters == {}
    assert main(["report", str(DATA / "torch-inflight.raw.jsonl")]) in (0, 1)
    out = capsys.readouterr().out
    assert "llama.cpp counters" not in out
    assert "graph management:" in out and "(no tokens seen: none per token)" in out
    assert "device time not observable in a trace" in out and "--cupti" not in out


def test_a_destroyed_executable_is_evicted_after_its_idle_time_since_its_last_launch():
    _, ev, _ = _summary("torch-inflight")
    (evicted,) = [e for e in ev if isinstance(e, E.Evicted)]
    assert evicted.idle_ns == 1000042000 - 1000041000


def test_untimed_eager_computes_make_no_median(capsys):
    """A trace sees llama.cpp's warmup resets (eager computes) in its log, not their host time: they are steps
    of 0 ns, which the timing table leaves out (no "step (eager)" of 0.0 µs, no replay speedup of 0.0×)."""
    header, events = convert_raw(DATA / "server-np4-h100.raw.jsonl")
    eager = [e for e in events if isinstance(e, E.StepFinished) and e.mode == "eager"]
    assert eager and all(e.duration_ns == 0 for e in eager)
    t = summarize(header, events).timings
    assert not {"eager split", "step (eager)", "step (eager decode)"} & set(t)
    assert t["step"].n == sum(isinstance(e, E.StepFinished) for e in events) - len(eager)
    main(["report", str(DATA / "server-np4-h100.raw.jsonl")])
    assert "replay speedup" not in capsys.readouterr().out


def test_an_idle_draft_context_is_named_and_a_busy_one_is_not():
    def batches(ctx, n, ret=0):
        return [E.DecodeBatch(step=i, ctx=ctx, n_tokens=1, ret=ret) for i in range(n)]
    target = batches(0xA, tc.DRAFT_BUSY)
    (line,) = tc.idle_draft_context(target + batches(0xB, 1))
    assert line.startswith("draft model idle: llama_context 2 (a draft model's) decoded 1 batch against the "
                           f"first's {tc.DRAFT_BUSY}")
    assert tc.idle_draft_context(target + batches(0xB, 2)) == []               # it drafted
    assert tc.idle_draft_context(target[:-1] + batches(0xB, 1)) == []          # too few target batches to say
    assert tc.idle_draft_context(target) == []                                 # one context: no draft model
    assert tc.idle_draft_context(target + batches(0xB, 1, ret=1)) == []        # a failed decode is no batch

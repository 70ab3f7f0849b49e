"""GRAPHDIAG_TRACE_API=interpose (gdtrace.c built with GD_INTERPOSE): the CUDA runtime's graph and sync calls read
by interposing libcudart's symbols, CUPTI never subscribed. On CPU, against a stand-in libcudart (calls counted,
handles made up) and a stand-in libcuda.so.1 (a captured graph of two kernels and a memcpy, names, free memory):
what each call writes, that the real function runs and its result comes back, and that a libcudart loaded
RTLD_LOCAL (as Python loads torch's) is still found behind the interposers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from graphdiag.errors import TraceError
from graphdiag.trace import build

DATA = Path(__file__).resolve().parents[1] / "data" / "trace"

FAKE_CUDART = r"""
#include <stdint.h>
/* a stand-in libcudart.so.12: every call counted, handles made up; returns as the real one would */
typedef struct { int result; void *errorNode, *errorFromNode; } info_t;
int calls;
int fake_calls(void) { return calls; }
int cudaGetDevice(int *d) { *d = 0; return 0; }     /* read by the library, not counted */
int cudaStreamBeginCapture(void *s, int mode) { calls++; return s ? 0 : 1; }
int cudaStreamEndCapture(void *s, void **g) {
    static uintptr_t next = 0x1000;
    calls++; *g = (void *)(next += 0x100); return 0;
}
int cudaGraphInstantiate(void **e, void *g, unsigned long long f) {
    calls++; *e = (void *)((uintptr_t)g + 1); return 0;
}
int cudaGraphLaunch(void *e, void *s) { calls++; return 0; }
int cudaStreamSynchronize(void *s) { calls++; return 0; }
int cudaDeviceSynchronize(void) { calls++; return 0; }
int cudaGraphExecUpdate(void *e, void *g, info_t *i) {
    calls++; i->result = 3; i->errorNode = (void *)0xB2; i->errorFromNode = (void *)0xA1; return 910;
}
int cudaGraphExecDestroy(void *e) { calls++; return 0; }
int cudaGraphDestroy(void *g) { calls++; return 0; }
"""

FAKE_CUDA = r"""
#include <string.h>
#include <cuda.h>
/* a stand-in libcuda.so.1: every graph holds kernel a (node 0xA1), a memcpy (0xA2), kernel b (0xB2) */
static CUgraphNode nodes[3] = {(CUgraphNode)0xA1, (CUgraphNode)0xA2, (CUgraphNode)0xB2};
static size_t free_b = 1000000;
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *out, size_t *n) {
    if (out) memcpy(out, nodes, sizeof nodes);
    *n = 3;
    return CUDA_SUCCESS;
}
CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *t) {
    *t = n == (CUgraphNode)0xA2 ? CU_GRAPH_NODE_TYPE_MEMCPY : CU_GRAPH_NODE_TYPE_KERNEL;
    return CUDA_SUCCESS;
}
CUresult cuGraphKernelNodeGetParams(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS *p) {
    p->func = (CUfunction)n;
    return CUDA_SUCCESS;
}
CUresult cuFuncGetName(const char **name, CUfunction f) {
    *name = f == (CUfunction)0xA1 ? "k_rms_norm" : "k_mul_mat";
    return CUDA_SUCCESS;
}
CUresult cuMemGetInfo(size_t *f, size_t *t) { *f = free_b; *t = 2000000; free_b -= 4096; return CUDA_SUCCESS; }
"""

CALLS = r"""
int cudaStreamBeginCapture(void *, int); int cudaStreamEndCapture(void *, void **);
int cudaGraphInstantiate(void **, void *, unsigned long long); int cudaGraphLaunch(void *, void *);
int cudaStreamSynchronize(void *); int cudaDeviceSynchronize(void);
int cudaGraphExecUpdate(void *, void *, void *); int cudaGraphExecDestroy(void *); int cudaGraphDestroy(void *);
int decode_loop(void) {      /* capture, instantiate, two launches, syncs, a refused update, destroy */
    void *s = (void *)0x50, *g, *g2, *e;
    struct { int result; void *a, *b; } info;
    int r = cudaStreamBeginCapture(s, 0) + cudaStreamEndCapture(s, &g) + cudaGraphInstantiate(&e, g, 0);
    r += cudaGraphLaunch(e, s) + cudaStreamSynchronize(s) + cudaStreamSynchronize(s);
    r += cudaGraphLaunch(e, s) + cudaDeviceSynchronize() + cudaDeviceSynchronize();
    r += cudaStreamBeginCapture(s, 0) + cudaStreamEndCapture(s, &g2);
    r += cudaGraphExecUpdate(e, g2, &info);       /* 910: cudaErrorGraphExecUpdateFailure */
    r += cudaGraphExecDestroy(e) + cudaGraphDestroy(g) + cudaGraphDestroy(g2);
    return r;
}
"""

PROGRAM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int fake_calls(void);
int decode_loop(void);
int main(void) {
    int (*init)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "InitializeInjection");
    int started = init ? init() : -1;             /* what the driver does at cuInit */
    int r = decode_loop();
    printf("%d %d %d\n", started, r, fake_calls());
    return 0;
}
"""

LOCAL_PROGRAM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {      /* the consumer and its libcudart loaded RTLD_LOCAL, as Python loads torch */
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
    int (*loop)(void) = (int (*)(void))dlsym(h, "decode_loop");
    int (*calls)(void) = (int (*)(void))dlsym(h, "fake_calls_through");
    int r = loop();
    printf("%d %d\n", r, calls());
    return 0;
}
"""


@pytest.fixture(scope="module")
def ilib(tmp_path_factory):
    env = dict(os.environ, GRAPHDIAG_TRACE_API="interpose")
    try:
        return build.library(tmp_path_factory.mktemp("cache"), env), build.include_dirs(env)
    except TraceError as e:
        pytest.skip(str(e))


def _cc():
    from graphdiag.backends.drivers.launch_loop import compiler
    cc = compiler(dict(os.environ))
    if cc is None:
        pytest.skip("no C compiler")
    return cc


def _fakes(tmp_path, incs) -> tuple[str, dict]:
    cc = _cc()
    for name, text in (("cudart.c", FAKE_CUDART), ("cuda.c", FAKE_CUDA), ("calls.c", CALLS)):
        (tmp_path / name).write_text(text)
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-o", tmp_path / "libcudart.so.12",
                    tmp_path / "cudart.c"], check=True)
    subprocess.run([cc, "-shared", "-fPIC", *(f"-I{d}" for d in incs), "-o", tmp_path / "libcuda.so.1",
                    tmp_path / "cuda.c"], check=True)
    return cc, {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path), "GRAPHDIAG_TRACE_API": "interpose",
                "GRAPHDIAG_TRACE_OUT": str(tmp_path / "raw.jsonl")}


def test_the_interpose_build_exports_the_runtimes_graph_and_sync_functions(ilib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(ilib[0])], capture_output=True, text=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert names == set(build.EXPORTED) | set(build.INTERPOSED)
    assert build.library(ilib[0].parent, dict(os.environ)) != ilib[0]     # the default build: its own file


def test_each_runtime_call_is_written_and_goes_on_to_the_real_one(ilib, tmp_path):
    cc, env = _fakes(tmp_path, ilib[1])
    (tmp_path / "m.c").write_text(PROGRAM + CALLS)
    subprocess.run([cc, "-o", tmp_path / "prog", tmp_path / "m.c", f"-L{tmp_path}", "-l:libcudart.so.12",
                    "-ldl", f"-Wl,-rpath,{tmp_path}"], check=True)
    out = subprocess.run([tmp_path / "prog"], env=dict(env, LD_PRELOAD=str(ilib[0])), capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["1", "910", "15"]        # started; the update's 910 came back; all 15 calls ran
    lines = [json.loads(x) for x in (tmp_path / "raw.jsonl").read_text().splitlines()]
    assert lines[0]["ev"] == "start" and lines[0]["text"] == "interpose"
    api = [x for x in lines[1:] if x["ev"] == "api"]
    assert all(x["api"] == "runtime" and x["device"] == 0 and x["t0_ns"] <= x["t1_ns"] for x in api)
    assert [x["fn"] for x in api] == [
        "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate", "cudaGraphLaunch",
        "cudaStreamSynchronize",                        # the second sync of the stream: nothing launched since
        "cudaGraphLaunch", "cudaDeviceSynchronize", "cudaStreamBeginCapture", "cudaStreamEndCapture",
        "cudaGraphExecUpdate", "cudaGraphExecDestroy"]
    begin, end, inst, launch, sync, _, _, _, end2, update, destroy = api
    assert begin["stream"] == end["stream"] == launch["stream"] == sync["stream"] == 1      # the first stream seen
    assert (end["nodes"], end["kernel_nodes"], end["kernel_names"]) == (3, 2, ["k_rms_norm", "k_mul_mat"])
    assert inst["graph"] == end["graph"] and inst["exec"] == launch["exec"] == update["exec"] == destroy["exec"]
    assert end2["graph"] != end["graph"] and update["graph"] == end2["graph"]
    assert inst["mem_free_before"] - inst["mem_free_after"] == 4096 and inst["ret"] == 0
    assert (update["ret"], update["update_result"], update["error_node"], update["error_node_index"],
            update["error_node_kernel"], update["error_node_kernel_index"], update["error_from_kernel"]) == (
        910, 3, True, 2, "k_mul_mat", 1, "k_rms_norm")
    assert lines[-1]["ev"] == "own" and lines[-1]["own_ns"] >= 0


def test_a_runtime_loaded_rtld_local_is_found_behind_the_interposers(ilib, tmp_path):
    """Python loads torch's libraries RTLD_LOCAL: their libcudart is not in the global scope, so dlsym(RTLD_NEXT)
    from a preloaded library misses it; the interposers find it among the loaded objects."""
    cc, env = _fakes(tmp_path, ilib[1])
    (tmp_path / "c.c").write_text(CALLS + "int fake_calls(void);\n"
                                  "int fake_calls_through(void) { return fake_calls(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "libconsumer.so", tmp_path / "c.c",
                    f"-L{tmp_path}", "-l:libcudart.so.12", f"-Wl,-rpath,{tmp_path}"], check=True)
    (tmp_path / "m.c").write_text(LOCAL_PROGRAM)
    subprocess.run([cc, "-o", tmp_path / "prog", tmp_path / "m.c", "-ldl"], check=True)
    out = subprocess.run([tmp_path / "prog", str(tmp_path / "libconsumer.so")],
                         env=dict(env, LD_PRELOAD=str(ilib[0])), capture_output=True, text=True, check=True).stdout
    assert out.split() == ["910", "15"]             # every call reached the RTLD_LOCAL runtime, results back


def test_auto_interposes_where_cmd_links_a_shared_libcudart(tmp_path):
    from graphdiag.trace.command import API_ENV, trace_environ
    cc, _ = _fakes(tmp_path, build.include_dirs())
    (tmp_path / "m.c").write_text("int cudaDeviceSynchronize(void);\n"
                                  "int main(void) { return cudaDeviceSynchronize(); }\n")
    subprocess.run([cc, "-o", tmp_path / "prog", tmp_path / "m.c", f"-L{tmp_path}", "-l:libcudart.so.12",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    assert trace_environ([str(tmp_path / "prog")], "auto", {})[API_ENV] == "interpose"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcudart.so.11.0", "-o", tmp_path / "libcudart.so.11.0",
                    tmp_path / "cudart.c"], check=True)
    subprocess.run([cc, "-o", tmp_path / "prog11", tmp_path / "m.c", f"-L{tmp_path}", "-l:libcudart.so.11.0",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    assert API_ENV not in trace_environ([str(tmp_path / "prog11")], "auto", {})   # CUDA 11's signatures differ
    assert API_ENV not in trace_environ(["/bin/sh"], "auto", {})            # no libcudart: CUPTI
    assert API_ENV not in trace_environ([str(tmp_path / "prog")], "cupti", {API_ENV: "driver"})
    assert trace_environ(["/bin/sh"], "interpose", {})[API_ENV] == "interpose"
    assert trace_environ(["/bin/sh"], None, {API_ENV: "driver"})[API_ENV] == "driver"     # no --api: the user's
    assert API_ENV not in trace_environ([str(tmp_path / "prog")], None, {API_ENV: "cupti"})
    assert trace_environ([str(tmp_path / "prog")], None, {API_ENV: "auto"})[API_ENV] == "interpose"
    assert trace_environ([str(tmp_path / "prog")], None, {})[API_ENV] == "interpose"       # else auto
    assert API_ENV not in trace_environ(["/bin/sh"], None, {})
    with pytest.raises(TraceError, match="GRAPHDIAG_TRACE_API=bogus: expected one of auto, cupti, interpose"):
        trace_environ(["/bin/sh"], None, {API_ENV: "bogus"})


def test_an_interposed_trace_says_so_and_what_it_cannot_see(tmp_path, capsys):
    from graphdiag.cli.main import main
    from graphdiag.trace.convert import INTERPOSED_ONLY, convert_raw
    src = (DATA / "thrash.raw.jsonl").read_text().replace('"text":"libcupti.so.13"', '"text":"interpose"', 1)
    raw = tmp_path / "t.raw.jsonl"
    raw.write_text(src)
    header, _ = convert_raw(raw)
    assert header.trace["reads"] == ["interpose"] and INTERPOSED_ONLY in header.trace["not_observable"]
    assert "libcudart's calls interposed" in header.note
    cupti, _ = convert_raw(DATA / "thrash.raw.jsonl")
    assert cupti.trace["reads"] == ["cupti"] and INTERPOSED_ONLY not in cupti.trace["not_observable"]
    main(["report", str(raw)])
    assert "calls read through: interpose" in capsys.readouterr().out


def test_an_interposed_trace_without_graphs_names_what_interposing_cannot_see():
    """A program whose runtime is linked statically (or that calls the driver API) shows no graph call to the
    interposers: the never-captured diagnosis says so and names --api cupti."""
    from graphdiag.report.analysis import trace_checks as tc
    from graphdiag.trace.convert import convert_raw
    _, ev = convert_raw(DATA / "disabled.raw.jsonl")
    (plain,) = tc.never_captured(ev)
    (hinted,) = tc.never_captured(ev, ["interpose"])
    assert "--api cupti" not in plain and hinted.startswith(plain[:-1]) and hinted.endswith("--api cupti reads both)")


def test_the_off_knob_starts_without_cupti(tmp_path):
    """GRAPHDIAG_TRACE_API=off (a measurement knob for bench trace): the library starts without loading CUPTI or
    libcuda — its start line says "off", its own time is written at exit — and nothing else is read."""
    try:
        lib = build.library(tmp_path / "cache", {k: v for k, v in os.environ.items() if k != "GRAPHDIAG_TRACE_API"})
    except TraceError as e:
        pytest.skip(str(e))
    cc = _cc()
    (tmp_path / "m.c").write_text(PROGRAM.replace("int fake_calls(void);\nint decode_loop(void);\n", "")
                                  .replace("    int r = decode_loop();\n    printf(\"%d %d %d\\n\", started, r, "
                                           "fake_calls());", "    printf(\"%d\\n\", started);"))
    subprocess.run([cc, "-o", tmp_path / "prog", tmp_path / "m.c", "-ldl"], check=True)
    raw = tmp_path / "raw.jsonl"
    out = subprocess.run([tmp_path / "prog"], env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(lib),
                                                   "GRAPHDIAG_TRACE_API": "off", "GRAPHDIAG_TRACE_OUT": str(raw),
                                                   "GRAPHDIAG_CUPTI_PATH": "/no/libcupti.so"},
                         capture_output=True, text=True, check=True).stdout
    lines = [json.loads(x) for x in raw.read_text().splitlines()]
    assert out.split() == ["1"] and [x["ev"] for x in lines] == ["start", "own"] and lines[0]["text"] == "off"


def test_a_real_interposed_server_trace(tmp_path, capsys):
    """llama-server b11434 (-np 4 -kvu, the tiny file, loaded with itself as -md draft model but no --spec-type)
    traced on the H100 by interposing (2026-12-07) while graphdiag load sent 64 requests, kept xz-compressed (read
    as it is): its record says how its calls were read and carries the diagnoses CUPTI's traces of the same
    server carry (the prefill graphs' refused updates named at their kernel, warmup thrash) and the idle draft
    model; whatif --model-draft finds the draft context warmed up once and never drafting."""
    from graphdiag.cli.main import main
    from graphdiag.trace.convert import convert_raw
    raw = DATA / "server-spec-interposed-b11434-h100.raw.jsonl.xz"
    header, _ = convert_raw(raw)
    assert header.trace["reads"] == ["interpose"] and "-md" in header.trace["cmd"]
    assert main(["report", str(raw)]) == 0
    out = capsys.readouterr().out
    assert "calls read through: interpose" in out
    assert "update refused ×1 at entry 1 (TOPOLOGY_CHANGED: kernel 67: unary_gated_op_kernel added" in out
    assert "warmup thrash: 70 warmup resets" in out
    assert ("draft model idle: llama_context 2 (a draft model's) decoded 1 batch against the first's 1264: no "
            "draft step was made (llama-server drafts with -md only beside --spec-type draft-simple)") in out
    tiny = tmp_path / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(tiny)]) == 0
    capsys.readouterr()
    assert main(["whatif", str(raw), "--model", str(tiny), "--model-draft", str(tiny), "--backend", "sim"]) == 2
    assert "decoded 1 batch and drafted nothing" in capsys.readouterr().err


def test_a_damaged_compressed_stream_is_one_line(tmp_path, capsys):
    from graphdiag.cli.main import main
    bad = tmp_path / "t.raw.jsonl.xz"
    bad.write_bytes(b"not xz")
    assert main(["report", str(bad)]) == 2
    assert capsys.readouterr().err.strip().endswith("t.raw.jsonl.xz: not an xz-compressed graphdiag trace raw stream")
    cut = tmp_path / "cut.raw.jsonl.xz"
    cut.write_bytes((DATA / "server-spec-interposed-b11434-h100.raw.jsonl.xz").read_bytes()[:5000])
    assert main(["report", str(cut)]) == 2
    assert "cut.raw.jsonl.xz: not a whole xz file" in capsys.readouterr().err

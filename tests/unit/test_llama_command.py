"""`graphdiag llama` on the CPU: its up-front errors, and the whole path (plan -> llama_batch -> raw stream ->
record -> report, diff) with a fake llama_cpp and a fake watcher (tests/support/fake_llama.py)."""

from __future__ import annotations

import io
import json
import sys
import os
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.errors import NoDeviceError, UsageError
from graphdiag.llama.command import llama_cli, resolve_llama
from graphdiag.llama.run import run_llama
from graphdiag.report.record.read import read_record
from tests.support.cli import one_line
from tests.support.fake_llama import FakeLlama, FakeWatcher, OneTokenBatcher


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    from graphdiag.cli.main import main
    p = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    return p


@pytest.fixture(autouse=True)
def _keep_env(monkeypatch):
    """run_llama sets llama.cpp's environment in this process: every test gets it back."""
    for k in ("GGML_CUDA_DISABLE_GRAPHS", "GGML_CUDA_DISABLE_FUSION", "GGML_CUDA_GRAPH_OPT",
              "LLAMA_GRAPH_REUSE_DISABLE", "GGML_CUDA_PDL"):
        monkeypatch.delenv(k, raising=False)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _run(model, settings=None, scenario=None, lib=None, **kw):
    cfg, sc = resolve_llama(str(model), settings or {}, scenario)
    lib = lib or FakeLlama()
    return run_llama(str(model), cfg, sc, lib=lib, watcher=FakeWatcher, gpu=lambda: ("FAKE H200", 90), **kw), lib


def _phases(events):
    return {e.step: e.phase for e in events if isinstance(e, E.PhaseDecided)}


def test_batches_follow_graphdiag_plan(tiny_gguf, tmp_path):
    res, lib = _run(tiny_gguf, {"steps": 4, "batch": 2, "prompt_tokens": 3, "seed": 5},
                    raw_path=tmp_path / "r.jsonl")
    toks, pos, seqs, logits = zip(*lib.batches)
    assert [len(t) for t in toks] == [3, 3, 2, 2, 2, 2]
    assert seqs[:3] == ([0, 0, 0], [1, 1, 1], [0, 1])
    assert pos[:4] == ([0, 1, 2], [0, 1, 2], [3, 3], [4, 4])
    assert logits[0] == [0, 0, 1] and logits[2] == [1, 1]
    import numpy as np
    assert toks[0] == np.random.default_rng(6).integers(1, 4096, 3).tolist()   # graphdiag's Stepper draw
    assert toks[3] == [(7 * 3 + 0) % 4096, (7 * 3 + 1) % 4096]                # greedy from step 2's logits
    assert lib.ctx_params.kv_unified and lib.ctx_params.n_seq_max == 2 and lib.ctx_params.flash_attn_type == 1
    assert lib.ctx_params.n_ctx == 4096 and lib.ctx_params.n_ubatch == 512
    assert lib.model_params.n_gpu_layers == 999
    assert lib.freed == ["batch", "ctx", "model"] and FakeWatcher.instances[-1].closed
    raw = [json.loads(l) for l in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert raw[0]["device"] == "FAKE H200" and raw[0]["cc"] == 90 and raw[-1] == {"ev": "end", "status": "complete"}
    assert [r.get("ev") for r in raw if r.get("ev") in ("perf", "end")] == ["perf", "end"]


def test_decisions_of_a_batch_change(tiny_gguf):
    """The fake ggml: eager, capture, replays; 1 -> 2 sequences: reset, refused + re-instantiated."""
    res, _ = _run(tiny_gguf, scenario="fusion-boundary")
    ph = _phases(res.events)
    assert ph[0] == "eager" and ph[1] == "capture" and ph[2] == "replay"     # a 1-token prompt: reused at once
    assert ph[10] == "eager" and ph[11] == "capture"
    (ref,) = [e for e in res.events if isinstance(e, E.UpdateRefused)]
    assert ref.step == 11 and ref.reason == "TOPOLOGY_CHANGED"
    assert res.header.scenario == "fusion-boundary" and res.header.settings["steps"] == 40


def test_env_settings_reach_llama_cpp(tiny_gguf):
    _run(tiny_gguf, {"graphs_disabled": True, "fusion": False, "reuse_disabled": True, "steps": 2})
    assert os.environ["GGML_CUDA_DISABLE_GRAPHS"] == "1" and os.environ["GGML_CUDA_DISABLE_FUSION"] == "1"
    assert os.environ["LLAMA_GRAPH_REUSE_DISABLE"] == "1"


def test_failed_decode_ends_the_stream(tiny_gguf):
    res, _ = _run(tiny_gguf, {"steps": 3}, lib=FakeLlama(fail_at=2))
    fails = [e for e in res.events if isinstance(e, E.StepFailed)]
    assert [(f.step, f.status) for f in fails] == [(2, -3)]


def test_cli_report_record_and_timeline(tiny_gguf, tmp_path):
    out = io.StringIO()
    ev, tl = tmp_path / "l.jsonl", tmp_path / "t.json"
    rc = llama_cli(str(tiny_gguf), {"steps": 6}, events_path=str(ev), timeline_path=str(tl), out=out,
                   lib=FakeLlama(), watcher=FakeWatcher, gpu=lambda: ("FAKE H200", 90))
    assert rc == 0
    text = out.getvalue()
    assert "not observable in llama.cpp:" in text and "raw stream:" in text and "FAKE H200" in text
    h, events = read_record(ev)
    assert h.llama and _phases(events)[2] == "capture"
    trace = json.loads(tl.read_text())
    names = {e.get("name") for e in (trace["traceEvents"] if isinstance(trace, dict) else trace)}
    assert "llama_decode" in names


def test_scenario_expectations_checked_where_observable(tiny_gguf):
    out = io.StringIO()
    rc = llama_cli(str(tiny_gguf), {}, scenario="batch-change", out=out, lib=FakeLlama(), watcher=FakeWatcher,
                   gpu=lambda: ("FAKE H200", 90))
    text = out.getvalue()
    assert "not checked (not observable in llama.cpp): property_diff_fields" in text
    assert rc == 0, text


def test_no_gpu_and_cpu_only_build(tiny_gguf):
    cfg, sc = resolve_llama(str(tiny_gguf), {"steps": 2}, None)

    def no_gpu():
        raise NoDeviceError("no CUDA driver: libcuda.so.1 not found")
    with pytest.raises(NoDeviceError, match="no CUDA driver"):
        run_llama(str(tiny_gguf), cfg, sc, lib=FakeLlama(), watcher=FakeWatcher, gpu=no_gpu)
    with pytest.raises(NoDeviceError, match="no GPU backend"):
        run_llama(str(tiny_gguf), cfg, sc, lib=FakeLlama(gpu=False), watcher=FakeWatcher,
                  gpu=lambda: ("FAKE", 90))


def test_prompt_ids_outside_the_vocabulary(tiny_gguf):
    with pytest.raises(UsageError, match="prompt id 5000 is not in the model's vocabulary"):
        _run(tiny_gguf, {"prompt_ids": "1,5000"})


@pytest.mark.parametrize("argv, message", [
    (["llama", "/nonexistent.gguf"], "no such file"),
    (["llama", "{tmp}/x.txt"], "not a GGUF file"),
    (["llama", "{gguf}"], "llama_cpp is not installed"),
    (["llama", "{gguf}", "--scenario", "speculative-draft-arena"], "cannot run on real llama.cpp"),
    (["llama", "{gguf}", "--scenario", "graph-growth-changing-pointers"], "new_arena_every"),
    (["llama", "{gguf}", "--scenario", "pool-pressure"], "pool-cap"),
    (["llama", "{gguf}", "--scenario", "moe-cpu-offload"], "cannot be given to real llama.cpp"),
    (["llama", "{gguf}", "--steps", "5000", "--batch", "4"], "KV cells"),
])
def test_one_line_errors(capsys, tmp_path, tiny_gguf, argv, message):
    (tmp_path / "x.txt").write_text("hello")
    argv = [a.format(tmp=tmp_path, gguf=tiny_gguf) for a in argv]
    assert message in one_line(capsys, argv)


def test_whatif_refuses_a_llama_record(capsys, tmp_path, tiny_gguf):
    ev = tmp_path / "l.jsonl"
    llama_cli(str(tiny_gguf), {"steps": 3}, events_path=str(ev), out=io.StringIO(), lib=FakeLlama(),
              watcher=FakeWatcher, gpu=lambda: ("FAKE", 90))
    line = one_line(capsys, ["whatif", str(ev), "--key", "first-node+shape"])
    assert "not observable in llama.cpp" in line


def test_strict_and_plot_on_a_llama_run(tiny_gguf, tmp_path):
    """The refusal flood (1,1,2,2,...) fails --strict on llama.cpp's record as on graphdiag's; --plot draws."""
    pytest.importorskip("matplotlib")
    out = io.StringIO()
    rc = llama_cli(str(tiny_gguf), {}, scenario="update-refusal-flood", strict=True, plot_path=str(tmp_path / "p.png"),
                   out=out, lib=FakeLlama(), watcher=FakeWatcher, gpu=lambda: ("FAKE", 90))
    text = out.getvalue()
    assert rc == 1 and "FAILED: strict: update-refusal flood: key 0x1 refused" in text
    assert "scenario update-refusal-flood: not checked" not in text      # every expectation is observable
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_from_raw_converts_a_recorded_stream(tmp_path, capsys):
    from graphdiag.cli.main import main
    from tests.support.llama_raw import steady
    raw = steady().write(tmp_path / "r.raw.jsonl")
    rc = main(["llama", "--from-raw", str(raw), "--events", str(tmp_path / "c.jsonl")])
    out = capsys.readouterr().out
    assert rc == 0 and "not observable in llama.cpp" in out and f"raw stream: {raw}" in out
    h, ev = read_record(tmp_path / "c.jsonl")
    assert h.llama and _phases(ev)[2] == "capture"
    assert "give no MODEL" in one_line(capsys, ["llama", "x.gguf", "--from-raw", str(raw)])
    assert "give MODEL.gguf" in one_line(capsys, ["llama"])


def test_a_prompt_over_ubatch_size_is_the_same_ubatches_on_llama_cpp(tiny_gguf):
    """--ubatch-size reaches llama_context_params; each llama_decode is one of graphdiag's ubatches (at most
    n_ubatch tokens, so llama.cpp makes one ubatch of it), only the prompt's last with an output."""
    ids = ",".join(str(1 + i) for i in range(40))
    res, lib = _run(tiny_gguf, {"steps": 2, "prompt_ids": ids, "ubatch_size": 16})
    toks, pos, seqs, logits = zip(*lib.batches)
    assert [len(t) for t in toks] == [16, 16, 8, 1, 1]
    assert toks[0] + toks[1] + toks[2] == list(range(1, 41)) and pos[1] == list(range(16, 32))
    assert [sum(f) for f in logits] == [0, 0, 1, 1, 1] and logits[2][-1] == 1
    assert lib.ctx_params.n_ubatch == 16 and lib.ctx_params.n_batch == 2048


def test_the_prompt_over_ubatch_scenario_is_expressible_on_llama_cpp(tiny_gguf):
    res, lib = _run(tiny_gguf, scenario="prompt-over-ubatch")
    assert [len(t) for t, *_ in lib.batches][:3] == [16, 16, 1] and lib.ctx_params.n_ubatch == 16


def test_kernel_names_of_captures_are_asked_for_by_environment(monkeypatch):
    """GRAPHDIAG_WATCH_KERNEL_NAMES=1 makes the watch name each captured graph's kernels (the parity
    diagnostic tools/captured_kernels.py reads them); off by default (a capture's kernels are hundreds)."""
    from graphdiag.llama.driver import LeadWatcher
    monkeypatch.delenv("GRAPHDIAG_WATCH_KERNEL_NAMES", raising=False)
    assert LeadWatcher(lambda ev: None, None).watch.kernel_names is False
    monkeypatch.setenv("GRAPHDIAG_WATCH_KERNEL_NAMES", "1")
    assert LeadWatcher(lambda ev: None, None).watch.kernel_names is True
    monkeypatch.setenv("GRAPHDIAG_WATCH_KERNEL_NAMES", "0")
    assert LeadWatcher(lambda ev: None, None).watch.kernel_names is False


def test_raw_stream_keeps_kernel_names(tmp_path):
    from graphdiag.llama.raw import RawWriter, read_raw
    w = RawWriter(tmp_path / "r.raw.jsonl", {"model": "m"})
    w.emit({"ev": "api", "fn": "cudaStreamEndCapture", "graph": 3, "nodes": 2, "kernel_nodes": 2,
            "kernel_names": ["rms_norm_f32", "mul_mat_vec_q"]})
    w.close()
    _, lines = read_raw(tmp_path / "r.raw.jsonl")
    assert lines[0]["kernel_names"] == ["rms_norm_f32", "mul_mat_vec_q"]


def test_the_watchers_own_callback_time_is_taken_out_of_llama_cpps_step():
    """CUPTI's and the log's callbacks run inside llama_decode (graphdiag's Python, not llama.cpp's work): what
    a decode spent in them leaves its host_ns and is recorded as watch_ns."""
    from graphdiag.llama.driver import walk

    spent = [0]

    class Session:
        def decode(self, b):
            spent[0] += 300                     # the watcher's callbacks during this decode
            return 0, 1000, [1]

    out = []
    assert walk(Session(), [None, None], OneTokenBatcher(), out.append, own_ns=lambda: spent[0]) == 2
    ends = [e for e in out if e["ev"] == "decode_end"]
    assert [(e["host_ns"], e["watch_ns"]) for e in ends] == [(700, 300), (700, 300)]
    out.clear()
    walk(Session(), [None], OneTokenBatcher(), out.append)           # a watcher without the counter: nothing taken out
    assert [(e["host_ns"], e["watch_ns"]) for e in out if e["ev"] == "decode_end"] == [(1000, 0)]


def _fake_cupti(monkeypatch, status: str):
    """A cupti module whose cuptiSubscribe fails with `status` (cupti-python is a GPU-machine wheel)."""
    import enum
    import types

    class Result(enum.IntEnum):
        SUCCESS = 0
        ERROR_NOT_INITIALIZED = 15
        ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39

    class cuptiError(Exception):
        def __init__(self, status):
            super().__init__(status)
            self.status = status

    def subscribe(cb, user):
        raise cuptiError(status if isinstance(status, int) else int(Result[status]))

    inner = types.SimpleNamespace(Result=Result, cuptiError=cuptiError, subscribe=subscribe)
    pkg = types.ModuleType("cupti")
    pkg.cupti = inner
    monkeypatch.setitem(sys.modules, "cupti", pkg)


@pytest.mark.parametrize("status,words", [("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED", "a profiler attached"),
                                          ("ERROR_NOT_INITIALIZED", "ERROR_NOT_INITIALIZED"),
                                          (999, "CUPTI result 999")])
def test_a_refused_cupti_subscriber_is_one_line_not_an_internal_error(monkeypatch, status, words):
    """Under Nsight Compute (a CUPTI subscriber of its own) graphdiag llama used to end as an internal error."""
    from graphdiag.errors import INTERNAL_EXIT, WatchError
    from graphdiag.llama.watch import Watch
    _fake_cupti(monkeypatch, status)
    with pytest.raises(WatchError, match=words) as e:
        Watch(lambda ev: None).start()
    assert "\n" not in str(e.value) and e.value.exit_code == 2 != INTERNAL_EXIT


def test_a_watch_that_cannot_start_ends_the_record_saying_so(tmp_path):
    """The raw stream's end names why: the model loaded, the watcher did not (not 'could not load the model')."""
    from graphdiag.errors import WatchError
    from graphdiag.llama import run as lrun

    class Session:
        n_vocab = 100

        def __init__(self, *a):
            pass

        def close(self):
            pass

        def perf(self):
            return {}

    class Watcher:
        closed = False

        def start(self):
            raise WatchError("CUPTI refused")

        def close(self):            # a watcher that failed to start is closed too (LeadWatcher keeps its log callback)
            Watcher.closed = True

    events = []

    class Writer:
        def emit(self, ev):
            events.append(ev)

    cfg = type("Cfg", (), {"prompt_ids": None})()
    orig = lrun.LlamaSession
    lrun.LlamaSession = Session
    try:
        with pytest.raises(WatchError):
            lrun._session(None, tmp_path / "m.gguf", None, cfg, None, Writer(), lambda emit: Watcher())
    finally:
        lrun.LlamaSession = orig
    assert events[-1] == {"ev": "end", "status": "failed: llama.cpp's graph calls could not be watched (CUPTI)"}
    assert Watcher.closed


def test_no_cupti_is_one_line(monkeypatch):
    from graphdiag.errors import WatchError
    from graphdiag.llama.watch import Watch
    monkeypatch.setitem(sys.modules, "cupti", None)          # import cupti raises ImportError
    with pytest.raises(WatchError, match="no CUPTI"):
        Watch(lambda ev: None).start()



class LogOnlyWatcher(FakeWatcher):
    """What GRAPHDIAG_WATCHER=log gives the driver (watch.LogWatch): llama.cpp's log lines, no graph call."""

    def __init__(self, emit):
        super().__init__(lambda obj: obj.get("ev") == "api" or emit(obj))


def test_an_unwatched_graphs_on_run_completes_with_every_step_timed(tiny_gguf, tmp_path):
    """bench steps' llama.cpp peer times its graphs-on child unwatched (no graph call seen) and reads which
    steps replayed from a watched child of the same plan (bench/llama_peer.retimed): the unwatched run must end
    with exit 0 and a StepFinished for every step the watched run has."""
    from graphdiag.bench.llama_peer import retimed
    runs = {}
    for name, watcher in (("watched", FakeWatcher), ("unwatched", LogOnlyWatcher)):
        ev = tmp_path / f"{name}.jsonl"
        assert llama_cli(str(tiny_gguf), {"steps": 8}, events_path=str(ev), out=io.StringIO(), lib=FakeLlama(),
                         watcher=watcher, gpu=lambda: ("FAKE H200", 90)) == 0
        runs[name] = read_record(ev)[1]
    modes = {e.step: e.mode for e in runs["watched"] if isinstance(e, E.StepFinished)}
    assert "replay" in modes.values()
    assert {e.mode for e in runs["unwatched"] if isinstance(e, E.StepFinished)} == {"eager"}
    both = retimed(runs["watched"], runs["unwatched"])
    times = {e.step: e.duration_ns for e in runs["unwatched"] if isinstance(e, E.StepFinished)}
    assert {e.step: (e.mode, e.duration_ns) for e in both if isinstance(e, E.StepFinished)} == {
        s: (m, times[s]) for s, m in modes.items()}

"""graphdiag trace on a real llama-server (a CUDA build of the user's llama.cpp, named by GRAPHDIAG_LLAMA_SERVER):
the server started under `graphdiag trace -v`, sent concurrent completions over HTTP on loopback, stopped with
Ctrl-C (SIGINT to graphdiag, forwarded); the record's graph steps, llama.cpp's uid-reuse lines and the batches
llama_decode received (several sequences in one batch: the slots) checked, and its report run. With
GRAPHDIAG_FIXTURE_OUT set, the raw stream is copied there (how tests/data/trace's real fixtures are recorded).
Skipped without a GPU or without the server binary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.report.record.read import read_record

pytestmark = pytest.mark.gpu
SERVER = os.environ.get("GRAPHDIAG_LLAMA_SERVER", "")
PORT = 18080 + os.getpid() % 1000


@pytest.fixture(scope="module")
def server_bin():
    from graphdiag.errors import TraceError
    from graphdiag.trace.command import check_device
    try:
        check_device()
    except TraceError as e:
        pytest.skip(str(e))
    if not SERVER or not os.access(SERVER, os.X_OK):
        pytest.skip("GRAPHDIAG_LLAMA_SERVER does not name a llama-server binary")
    return SERVER


def _get(path: str, timeout=2.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout) as r:
        return r.status, r.read()


def _complete(prompt: list[int], n: int, out: list) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out.append(json.loads(r.read()))


def test_trace_llama_server_under_concurrent_completions(server_bin, tmp_path):
    model = tmp_path / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(model)]) == 0
    events, raw, log = tmp_path / "server.jsonl", tmp_path / "server.raw.jsonl", tmp_path / "server.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "graphdiag", "trace", "--events", str(events), "--raw", str(raw),
                                 "-v", "--", server_bin, "-m", str(model), "-np", "4", "-kvu", "-c", "4096", "-ngl", "99",
                                 "--port", str(PORT), "--host", "127.0.0.1", "-v"],
                                stdout=logf, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if _get("/health")[0] == 200:
                        break
                except OSError:
                    pass
                if proc.poll() is not None:
                    pytest.fail(f"llama-server ended early: {log.read_text()[-3000:]}")
                time.sleep(0.5)
            else:
                pytest.fail(f"llama-server not healthy in 120 s: {log.read_text()[-3000:]}")
            # all at once and long enough to overlap: tiny decodes ~5000 tokens/s, so completions started 50 ms
            # apart each ran alone on llama-server b11434 (one sequence a batch, H100 2026-12-07)
            done: list = []
            go = threading.Barrier(8)
            threads = [threading.Thread(target=lambda *a: (go.wait(), _complete(*a)),
                                        args=([1 + (7 * i + j) % 200 for j in range(8 + 40 * i)], 160 + 8 * i, done))
                       for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=180)
            assert len(done) == 8, done
        finally:
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=60)
    text = log.read_text(errors="replace")
    print(text[-4000:])
    if os.environ.get("GRAPHDIAG_FIXTURE_OUT"):
        out = Path(os.environ["GRAPHDIAG_FIXTURE_OUT"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(raw, out / "llama-server-np4.raw.jsonl")
        shutil.copy(log, out / "llama-server-np4.log")
    header, evs = read_record(events)
    assert header.trace["pids"] and not header.trace["errors"], header.trace
    batches = [e for e in evs if isinstance(e, E.DecodeBatch)]
    assert header.trace["decode_batches"] == len(batches) > 8
    assert max(len({s for q in b.seqs for s in q}) for b in batches if b.seqs) >= 2   # slots decoded together
    assert sum(1 for b in batches if b.n_tokens == 1) > 0 and any(b.n_tokens > 64 for b in batches)
    assert [e for e in evs if isinstance(e, E.ChunkCaptured)] and [e for e in evs if isinstance(e, E.ReplayLaunched)]
    assert [e for e in evs if isinstance(e, E.UidHit)], "llama-server -v printed no 'CUDA Graph id N reused'"
    ended = [e for e in evs if isinstance(e, E.RunEnded)][-1]
    assert ended.status in ("interrupted", "complete"), (rc, ended)
    assert main(["report", str(events)]) in (0, 1)

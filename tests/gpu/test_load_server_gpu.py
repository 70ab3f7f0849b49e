"""graphdiag load on a real llama-server (a CUDA build, named by GRAPHDIAG_LLAMA_SERVER) serving graphdiag's
exported tiny model, or GRAPHDIAG_LOAD_MODEL (a GGUF file): 8 concurrent streaming clients, 64 requests with
prompts of 16-1500 tokens sized exactly through the server's /tokenize; every request completes with a time to
first token, a decode rate and llama-server's timings, the server's prompt counts equal the drawn lengths; the chat
endpoint too. Skipped without a GPU or without the server binary."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

import pytest

from graphdiag.cli.main import main
from graphdiag.load.prompts import plan_requests

pytestmark = pytest.mark.gpu
SERVER = os.environ.get("GRAPHDIAG_LLAMA_SERVER", "")
PORT = 19080 + os.getpid() % 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from graphdiag.errors import TraceError
    from graphdiag.trace.command import check_device
    try:
        check_device()
    except TraceError as e:
        pytest.skip(str(e))
    if not SERVER or not os.access(SERVER, os.X_OK):
        pytest.skip("GRAPHDIAG_LLAMA_SERVER does not name a llama-server binary")
    model = os.environ.get("GRAPHDIAG_LOAD_MODEL") or str(tmp_path_factory.mktemp("model") / "tiny.gguf")
    if not os.environ.get("GRAPHDIAG_LOAD_MODEL"):
        assert main(["export-gguf", "--model", "tiny", model]) == 0
    log = tmp_path_factory.mktemp("log") / "server.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen([SERVER, "-m", model, "-np", "8", "-c", "16384", "-ngl", "99", "--port", str(PORT),
                                 "--host", "127.0.0.1"], stdout=logf, stderr=subprocess.STDOUT)
        try:
            t = time.monotonic()
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() - t > 120:
                    pytest.fail(f"llama-server not healthy: {log.read_text(errors='replace')[-3000:]}")
                time.sleep(0.5)
            yield f"http://127.0.0.1:{PORT}"
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_load_on_llama_server(server, capsys):
    rc = main(["load", server, "--clients", "8", "--requests", "64", "--prompt-tokens", "16-1500",
               "--output-tokens", "16-128", "--seed", "1", "--deadline", "300", "--json"])
    out, err = capsys.readouterr()
    print(err[-3000:])
    res = json.loads(out)
    print(json.dumps(res["summary"], indent=1))
    assert rc == 0, res["summary"]["errors"]
    assert res["exact_prompt_tokens"] and res["summary"]["ok"] == 64
    plan = plan_requests(64, (16, 1500), (16, 128), 1)
    for r, p in zip(res["requests"], plan):
        assert r["usage"]["prompt_tokens"] == p.prompt_tokens == r["timings"]["prompt_n"] + r["timings"].get("cache_n", 0)
        assert r["output_tokens"] == p.max_tokens            # ignore_eos: the drawn length exactly
        assert r["ttft_ms"] > 0 and r["tokens_per_s"] > 0 and r["timings"]["predicted_per_second"] > 0
    assert {r["client"] for r in res["requests"]} == set(range(8))


def test_load_on_chat_endpoint(server, capsys):
    rc = main(["load", server + "/v1/chat/completions", "--clients", "4", "--requests", "8",
               "--prompt-tokens", "16-200", "--output-tokens", "8", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["summary"]["ok"] == 8, res["summary"]["errors"]


"""graphdiag load against a stub OpenAI-compatible server on loopback (a thread in this process, streaming as
llama-server does: chunked server-sent events, one token a chunk, usage and timings in the last chunk, [DONE]):
normal, slow, failing, dead, wrong endpoints and the deadline, each bounded to a few seconds; the input checks;
the pure parts (ranges, the loopback rule, SSE lines, the plan, the results)."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.errors import UsageError
from graphdiag.load import config as C
from graphdiag.load import events as E
from graphdiag.load.prompts import plan_requests, size_exactly
from graphdiag.load.results import Collector, percentile, stats
from graphdiag.load.sse import Chunk, StreamError, error_body_text, parse_line

ROOT = Path(__file__).resolve().parents[2]


# -- the stub server -------------------------------------------------------------------------------------------
class Stub:
    """What the stub does, set per test. `fail_every`: every k-th completion request (the probe is the first)
    answers 500; `status`/`content_type`/`body`: every completion answers that instead of a stream."""

    def __init__(self):
        self.token_delay = 0.001
        self.first_delay = 0.0
        self.fail_every = 0
        self.stream_error_every = 0
        self.status, self.content_type, self.body = 200, "text/event-stream", None
        self.tokenize = True
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = self.count = 0
        self.stop = threading.Event()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stub: Stub

    def log_message(self, *args):
        pass

    def _send(self, code: int, obj, ctype: str = "application/json") -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        s = self.stub
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path in ("/tokenize", "/detokenize"):
            if not s.tokenize:
                return self._send(404, {"error": {"code": 404, "message": "File Not Found"}})
            if self.path == "/tokenize":     # one token a word, ids from the word's letters
                return self._send(200, {"tokens": [sum(map(ord, w)) for w in body["content"].split()]})
            return self._send(200, {"content": " ".join(f"t{i}" for i in body["tokens"])})
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._send(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
        with s.lock:
            s.count += 1
            n_req = s.count
            s.bodies.append(body)
        if s.body is not None:
            return self._send(s.status, s.body, s.content_type)
        if s.fail_every and n_req % s.fail_every == 0:
            return self._send(500, {"error": {"code": 500, "message": "stub failure", "type": "server_error"}})
        with s.lock:
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
        try:
            self._stream(body, chat=self.path.endswith("chat/completions"),
                         error=bool(s.stream_error_every and n_req % s.stream_error_every == 0))
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with s.lock:
                s.in_flight -= 1

    def _stream(self, body: dict, chat: bool, error: bool) -> None:
        s = self.stub
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n = body.get("max_tokens") or 16
        if s.stop.wait(s.first_delay):
            return
        for i in range(n):
            if error and i == 1:
                self._chunk(b'data: {"error": {"code": 500, "message": "slot died", "type": "server_error"}}\n\n')
                self._chunk(b"")
                return
            choice = {"delta": {"content": f" w{i}"}} if chat else {"text": f" w{i}"}
            self._chunk(b"data: " + json.dumps({"choices": [{"index": 0, "finish_reason": None, **choice}]}).encode()
                        + b"\n\n")
            if s.stop.wait(s.token_delay):
                return
        prompt = body.get("prompt") if not chat else body["messages"][0]["content"]
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        final = {"choices": [{"index": 0, "finish_reason": "length", **({"delta": {}} if chat else {"text": ""})}],
                 "usage": {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n},
                 "timings": {"prompt_n": n_prompt, "prompt_ms": 1.5, "prompt_per_second": n_prompt / 1.5e-3,
                             "predicted_n": n, "predicted_ms": 2.0 * n, "predicted_per_second": 500.0}}
        self._chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


class QuietServer(ThreadingHTTPServer):
    """The stub's server: a client that hangs up mid-response (graphdiag load's deadline, a 404 it read
    enough of) is no error of the stub's, so socketserver's traceback to stderr, which the tests read as
    graphdiag's, is not printed."""

    def handle_error(self, request, client_address):
        pass


@pytest.fixture
def stub():
    s = Stub()
    handler = type("H", (Handler,), {"stub": s})
    server = QuietServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    s.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield s
    s.stop.set()
    server.shutdown()
    server.server_close()


def _load(capsys, *args):
    t = time.monotonic()
    rc = main(["load", *args])
    out, err = capsys.readouterr()
    return rc, out, err, time.monotonic() - t


def _json_load(capsys, *args):
    rc, out, err, dt = _load(capsys, *args, "--json")
    return rc, json.loads(out) if out.strip() else None, err, dt


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- runs against the stub --------------------------------------------------------------------------------------
def test_normal_run_reports_every_request(stub, capsys):
    rc, res, err, _ = _json_load(capsys, stub.url, "--clients", "3", "--requests", "9", "--prompt-tokens", "5-40",
                                 "--output-tokens", "3-8", "--seed", "7")
    assert rc == 0
    s = res["summary"]
    assert (s["requests"], s["sent"], s["ok"], s["failed"], s["errors"]) == (9, 9, 9, 0, {})
    st = res["settings"]
    assert (st["seed"], st["prompt_tokens"], st["output_tokens"], st["clients"]) == (7, [5, 40], [3, 8], 3)
    plan = plan_requests(9, (5, 40), (3, 8), 7)
    assert [r["max_tokens"] for r in res["requests"]] == [p.max_tokens for p in plan]
    for r in res["requests"]:
        assert r["ok"] and r["finish_reason"] == "length"
        assert r["output_tokens"] == r["chunks"] == r["max_tokens"]
        assert 0 < r["ttft_ms"] <= r["latency_ms"] and r["tokens_per_s"] > 0
        assert r["timings"]["predicted_per_second"] == 500.0         # llama-server's timings kept
        assert r["client"] in (0, 1, 2)
    assert s["ttft_ms"]["p50"] is not None and s["output_tokens"] == sum(p.max_tokens for p in plan)
    assert "load: 9/9 done" in err                                     # live progress on stderr
    assert len(stub.bodies) == 10 and stub.bodies[0]["max_tokens"] == 1   # the probe, then the 9
    assert all(b["stream"] and b["ignore_eos"] for b in stub.bodies)


def test_clients_run_concurrently_and_no_more(stub, capsys):
    stub.token_delay = 0.02
    rc, res, _, _ = _json_load(capsys, stub.url, "--clients", "4", "--requests", "8", "--output-tokens", "5")
    assert rc == 0 and res["summary"]["ok"] == 8
    assert stub.max_in_flight == 4


def test_exact_prompt_lengths_through_tokenize(stub, capsys):
    rc, res, _, _ = _json_load(capsys, stub.url, "--requests", "4", "--prompt-tokens", "16-60", "--output-tokens", "2")
    assert rc == 0 and res["exact_prompt_tokens"]
    plan = plan_requests(4, (16, 60), (2, 2), 0)
    sent = sorted(stub.bodies[1:], key=lambda b: len(b["prompt"]))
    assert sorted(len(b["prompt"]) for b in sent) == sorted(p.prompt_tokens for p in plan)
    assert all(isinstance(t, int) for b in sent for t in b["prompt"])      # completions: the token ids
    assert sorted(r["usage"]["prompt_tokens"] for r in res["requests"]) == sorted(p.prompt_tokens for p in plan)


def test_chat_prompts_are_detokenized_text(stub, capsys):
    rc, res, _, _ = _json_load(capsys, stub.url + "/v1/chat/completions", "--requests", "3",
                               "--prompt-tokens", "10-20", "--output-tokens", "2")
    assert rc == 0 and res["exact_prompt_tokens"] and res["url"].endswith("/v1/chat/completions")
    plan = plan_requests(3, (10, 20), (2, 2), 0)
    words = sorted(len(b["messages"][0]["content"].split()) for b in stub.bodies[1:])
    assert words == sorted(p.prompt_tokens for p in plan)
    assert all(w.startswith("t") for b in stub.bodies[1:] for w in b["messages"][0]["content"].split())


def test_without_tokenize_lengths_are_approximate_and_said_so(stub, capsys):
    stub.tokenize = False
    rc, out, _, _ = _load(capsys, stub.url, "--requests", "2", "--output-tokens", "2")
    assert rc == 0 and "prompt≈" in out and "approximate" in out
    assert all(isinstance(b["prompt"], str) for b in stub.bodies)
    rc, _, err, _ = _load(capsys, stub.url, "--requests", "2", "--tokenize", "on")
    assert rc == 2 and "/tokenize" in err and len(err.strip().splitlines()) == 1


def test_table_shows_rows_summary_and_errors(stub, capsys):
    stub.fail_every = 3                 # requests 3 and 6 of 7 (the probe is the first)
    rc, out, _, _ = _load(capsys, stub.url, "--requests", "6", "--clients", "1", "--output-tokens", "2")
    assert rc == 1
    assert "TTFT ms" in out and "summary" in out and "4 of 6 requests ok, 2 failed" in out
    assert "error x2: HTTP 500: stub failure" in out


def test_failing_requests_are_counted_not_fatal(stub, capsys):
    stub.fail_every = 2
    rc, res, _, _ = _json_load(capsys, stub.url, "--requests", "6", "--clients", "2", "--output-tokens", "2")
    assert rc == 1
    s = res["summary"]
    assert (s["sent"], s["ok"], s["failed"]) == (6, 3, 3)
    assert s["errors"] == {"HTTP 500: stub failure": 3}
    assert all(r["status"] == 500 for r in res["requests"] if not r["ok"])


def test_an_error_inside_the_stream_fails_that_request(stub, capsys):
    stub.stream_error_every = 3             # the second of 3 (the probe is the first)
    rc, res, _, _ = _json_load(capsys, stub.url, "--requests", "3", "--clients", "1", "--output-tokens", "4")
    assert rc == 1
    bad = [r for r in res["requests"] if not r["ok"]]
    assert len(bad) == 1 and bad[0]["error"] == "server error 500: slot died" and bad[0]["chunks"] == 1


def test_failing_endpoint_is_one_line_exit_2(stub, capsys):
    stub.status, stub.body = 500, json.dumps({"error": {"code": 500, "message": "model crashed"}}).encode()
    rc, out, err, dt = _load(capsys, stub.url, "--requests", "50")
    assert rc == 2 and out == "" and dt < 10
    assert err.strip().splitlines() == [f"graphdiag: error: {stub.url}/v1/completions: HTTP 500: model crashed"]


def test_dead_endpoint_is_one_line_exit_2_within_seconds(capsys):
    url = f"http://127.0.0.1:{_dead_port()}"
    rc, out, err, dt = _load(capsys, url, "--requests", "50")
    assert rc == 2 and out == "" and dt < 5
    assert err.strip().splitlines() == [f"graphdiag: error: {url}/v1/completions: connection refused (nothing "
                                        "listening there)"]


def test_hung_endpoint_is_one_line_exit_2_within_its_timeout(capsys):
    with socket.socket() as s:                  # listening, never accepting: connects, never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        rc, out, err, dt = _load(capsys, url, "--request-timeout", "0.5")
    assert rc == 2 and out == "" and dt < 5
    assert err.strip().splitlines() == [f"graphdiag: error: {url}/v1/completions: timed out after 0.5 s"]


@pytest.mark.parametrize("path, status, ctype, body, says", [
    ("/v1/completion", None, None, None, "neither /v1/completions"),               # a path that is no endpoint
    ("", 404, "application/json", b'{"error": {"code": 404, "message": "File Not Found"}}', "HTTP 404: File Not Found"),
    ("", 200, "application/json", b'{"choices": [{"text": "hi"}]}', "not a server-sent event stream"),
    ("", 200, "text/html", b"<html>a web page</html>", "not a server-sent event stream (Content-Type text/html)"),
    ("", 200, "text/event-stream", b"hello\n\n", "not a server-sent event stream (line 'hello')"),
])
def test_wrong_endpoint_is_one_line_exit_2(stub, capsys, path, status, ctype, body, says):
    if status is not None:
        stub.status, stub.content_type, stub.body = status, ctype, body
    rc, out, err, dt = _load(capsys, stub.url + path, "--requests", "5")
    assert rc == 2 and out == "" and dt < 10
    assert len(err.strip().splitlines()) == 1 and says in err


def test_slow_endpoint_shows_in_time_to_first_token(stub, capsys):
    stub.first_delay = 0.3
    rc, res, _, _ = _json_load(capsys, stub.url, "--requests", "2", "--clients", "2", "--output-tokens", "3")
    assert rc == 0
    assert all(r["ttft_ms"] >= 290 for r in res["requests"])
    assert all(r["latency_ms"] - r["ttft_ms"] < r["ttft_ms"] for r in res["requests"])   # the wait was up front


def test_request_slower_than_its_timeout_fails(stub, capsys):
    stub.token_delay = 0.3
    rc, res, _, dt = _json_load(capsys, stub.url, "--requests", "2", "--clients", "2", "--output-tokens", "50",
                                "--request-timeout", "1")
    assert rc == 1 and dt < 10
    assert res["summary"]["errors"] == {"timed out after 1 s": 2}
    assert all(1 <= r["chunks"] < 50 and r["ttft_ms"] is not None for r in res["requests"])


def test_deadline_cuts_the_run(stub, capsys):
    stub.token_delay = 0.1
    # the deadline counts the probe and the sizing too: 2.5 s leaves room for them on a busy machine, and each
    # request (100 tokens, 10 s) outlasts it
    rc, res, err, dt = _json_load(capsys, stub.url, "--requests", "20", "--clients", "2", "--output-tokens", "100",
                                  "--deadline", "2.5")
    assert rc == 1 and 2.5 <= dt < 8
    s = res["summary"]
    assert s["deadline_reached"] and s["cut"] == 2 and s["not_sent"] == 18 and s["sent"] == 2
    assert s["errors"] == {"cut by the deadline": 2}
    assert "deadline reached" in err


def test_prompts_file_used_in_turn(stub, capsys, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("first prompt here\n\n  second one  \n", encoding="utf-8")
    stub.tokenize = False
    rc, res, _, _ = _json_load(capsys, stub.url, "--prompts", str(f), "--requests", "3", "--clients", "1",
                               "--output-tokens", "2")
    assert rc == 0
    assert [b["prompt"] for b in stub.bodies[1:]] == ["first prompt here", "second one", "first prompt here"]
    assert [r["prompt_tokens"] for r in res["requests"]] == [5, 3, 5]     # approximate: 4 characters a token


def test_interrupt_prints_what_was_measured_and_exits_130(stub):
    stub.token_delay = 0.1
    # SIGINT as a terminal user's shell leaves it: an xdist worker starts its children with SIGINT ignored
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from graphdiag.cli.main import main\n"
            f"sys.exit(main(['load', '{stub.url}', '--requests', '4', '--clients', '2', '--output-tokens', '50', "
            "'--json']))")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT)
    t = time.monotonic()
    while stub.in_flight < 2 and time.monotonic() - t < 20:   # both clients streaming
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "graphdiag: interrupted"
    res = json.loads(out)
    assert res["summary"]["sent"] == 2 and res["summary"]["errors"] == {"cut by an interrupt": 2}


# -- bad input: one line, exit 2, nothing sent -----------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["http://10.1.2.3:8080"], "not a loopback address; name it with --allow-host 10.1.2.3"),
    (["http://example.org:8080", "--allow-host", "example.com"], "not a loopback address"),
    (["ftp://127.0.0.1:8080"], "expected http://HOST:PORT"),
    (["127.0.0.1:8080"], "expected http://HOST:PORT"),
    (["http://127.0.0.1:99999"], "Port out of range"),
    (["http://127.0.0.1:8080/v1/completions?x=1"], "no query"),
    (["http://127.0.0.1:8080/v1/chat/completions", "--endpoint", "completions"], "names the chat endpoint"),
    (["http://127.0.0.1:8080", "--prompt-tokens", "100-10"], "--prompt-tokens '100-10': needs 1 <= A <= B"),
    (["http://127.0.0.1:8080", "--output-tokens", "0"], "needs 1 <= A"),
    (["http://127.0.0.1:8080", "--output-tokens", "a-b"], "expected N or A-B"),
    (["http://127.0.0.1:8080", "--clients", "0"], "--clients"),
    (["http://127.0.0.1:8080", "--deadline", "0"], "--deadline"),
    (["http://127.0.0.1:8080", "--prompts", "/nonexistent/prompts.txt"], "--prompts /nonexistent/prompts.txt"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, says):
    rc, out, err, _ = _load(capsys, *args)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err


def test_empty_prompts_file(capsys, tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("\n  \n")
    rc, _, err, _ = _load(capsys, "http://127.0.0.1:8080", "--prompts", str(f))
    assert rc == 2 and "no prompt in it" in err


def test_without_httpx_one_line_exit_2():
    code = ("import sys; sys.modules['httpx'] = None\n"
            "from graphdiag.cli.main import main; sys.exit(main(['load', 'http://127.0.0.1:9']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == ["graphdiag: error: graphdiag load needs httpx (module 'httpx' is "
                                             "missing): pip install 'graphdiag[load]'"]


# -- the pure parts ---------------------------------------------------------------------------------------------
def test_loopback_rule():
    for host in ("127.0.0.1", "127.8.9.10", "::1", "localhost", "LOCALHOST"):
        assert C.is_loopback(host), host
    for host in ("10.0.0.1", "0.0.0.0", "example.org", "localhost.example.org", "::"):
        assert not C.is_loopback(host), host
    assert C.split_url("http://[::1]:8080/v1", None, None) == ("http://[::1]:8080", "completions")
    assert C.split_url("https://gpu-box:8443/v1/chat/completions/", None, "gpu-box") == ("https://gpu-box:8443", "chat")
    assert C.split_url("http://localhost:8080", "chat", None) == ("http://localhost:8080", "chat")
    with pytest.raises(UsageError, match="--allow-host gpu-box"):
        C.split_url("http://gpu-box:8080", None, None)


def test_ranges():
    assert C.parse_range("16-1500", "--x") == (16, 1500)
    assert C.parse_range(" 7 ", "--x") == (7, 7)
    for bad in ("", "1-2-3", "-5", "5-", "3-2", "0-4", "x"):
        with pytest.raises(UsageError):
            C.parse_range(bad, "--x")


def test_plan_is_seeded_and_within_ranges():
    a = plan_requests(50, (16, 1500), (8, 64), seed=3)
    assert a == plan_requests(50, (16, 1500), (8, 64), seed=3)
    assert a != plan_requests(50, (16, 1500), (8, 64), seed=4)
    assert all(16 <= r.prompt_tokens <= 1500 and 8 <= r.max_tokens <= 64 for r in a)
    assert all(len(r.prompt.split()) == r.prompt_tokens and not r.exact for r in a)
    assert len({r.prompt for r in a}) == 50                     # no shared prefix for the server's cache to reuse


def test_size_exactly_extends_and_cuts():
    plan = plan_requests(3, (30, 30), (4, 4), seed=1)
    two_a_word = lambda text: [len(w) for w in text.split() for _ in (0, 1)]
    sized = size_exactly(plan, two_a_word, None, seed=1)
    assert all(r.exact and len(r.prompt_ids) == 30 and r.prompt_tokens == 30 for r in sized)
    half_a_word = lambda text: [len(w) for w in text.split()[::2]]        # a tokenizer that merges words
    sized = size_exactly(plan, half_a_word, lambda ids: "x" * len(ids), seed=1)
    assert all(len(r.prompt_ids) == 30 and r.prompt == "x" * 30 for r in sized)


def test_sse_lines():
    assert parse_line("") is None and parse_line(": keep-alive") is None and parse_line("event: message") is None
    assert parse_line("data: [DONE]") == Chunk(done=True)
    assert parse_line('data: {"choices":[{"text":"a","finish_reason":null}]}') == Chunk(text="a")
    assert parse_line('data:{"choices":[{"delta":{"content":"b"}}]}').text == "b"
    assert parse_line('data: {"choices":[{"delta":{"reasoning_content":"r"}}]}').text == "r"
    assert parse_line('data: {"choices":[{"delta":{"role":"assistant"}}]}').text == ""
    last = parse_line('data: {"choices":[{"text":"","finish_reason":"stop"}],"usage":{"completion_tokens":3},'
                      '"timings":{"predicted_n":3}}')
    assert (last.finish_reason, last.usage, last.timings) == ("stop", {"completion_tokens": 3}, {"predicted_n": 3})
    assert parse_line('data: {"choices":[],"usage":{"prompt_tokens":9}}').usage == {"prompt_tokens": 9}
    for line, says in (('data: {"error":{"code":400,"message":"too long"}}', "server error 400: too long"),
                       ('error: {"code":503,"message":"busy"}', "server error 503: busy"),
                       ("data: {oops", "not JSON"), ("data: [1]", "not a JSON object"),
                       ("<html>", "not a server-sent event stream")):
        with pytest.raises(StreamError, match=says):
            parse_line(line)
    assert error_body_text(404, b'{"error":{"code":404,"message":"File Not Found"}}') == "HTTP 404: File Not Found"
    assert error_body_text(502, b"Bad Gateway\n") == "HTTP 502: Bad Gateway"
    assert error_body_text(500, b"") == "HTTP 500"


def test_results_from_events():
    c = Collector()
    for e in (E.LoadStarted(t_ns=0, url="u", clients=2, requests=3, exact_prompts=True),
              E.RequestSent(t_ns=0, index=0, client=0, prompt_tokens=10, max_tokens=5),
              E.RequestSent(t_ns=0, index=1, client=1, prompt_tokens=20, max_tokens=5),
              E.FirstToken(t_ns=100_000_000, index=0),
              E.RequestFinished(t_ns=500_000_000, index=0, chunks=5, finish_reason="length",
                                usage={"completion_tokens": 5}),
              E.RequestFailed(t_ns=600_000_000, index=1, error="HTTP 500: x", status=500),
              E.LoadEnded(t_ns=1_000_000_000, not_sent=1)):
        c(e)
    r = c.result
    assert not r.complete and [row.ok for row in r.ordered] == [True, False]
    row = r.ordered[0]
    assert (row.ttft_ms, row.latency_ms, row.tokens_per_s) == (100.0, 500.0, 10.0)
    s = r.summary()
    assert (s["ok"], s["failed"], s["not_sent"], s["wall_s"], s["output_tokens"]) == (1, 1, 1, 1.0, 5)
    assert s["errors"] == {"HTTP 500: x": 1} and s["ttft_ms"]["p50"] == 100.0
    assert json.loads(json.dumps(r.to_dict()))["requests"][1]["status"] == 500


def test_live_progress_on_a_terminal_is_drawn_from_events():
    import io
    from rich.console import Console
    from graphdiag.load.display import RichProgress, progress_for
    buf = io.StringIO()
    bar = RichProgress(Console(file=buf, force_terminal=True, width=120))
    for e in (E.LoadStarted(t_ns=0, url="u", clients=1, requests=2),
              E.RequestSent(t_ns=0, index=0), E.FirstToken(t_ns=42_000_000, index=0),
              E.RequestFinished(t_ns=50_000_000, index=0, chunks=7, finish_reason="length"),
              E.RequestSent(t_ns=60_000_000, index=1), E.RequestFailed(t_ns=70_000_000, index=1, error="x"),
              E.LoadEnded(t_ns=80_000_000)):
        bar(e)
    text = buf.getvalue()
    assert "2/2" in text and "errors 1" in text and "tokens 7" in text and "last TTFT 42 ms" in text
    assert bar.task is None                                   # stopped at LoadEnded
    assert type(progress_for(io.StringIO())).__name__ == "PlainProgress"


def test_stats():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([7.0], 99) == 7.0
    xs = [random.Random(0).random() for _ in range(101)]
    s = stats(xs + [None])
    assert s["min"] == round(min(xs), 3) and s["max"] == round(max(xs), 3)
    assert stats([None])["p50"] is None

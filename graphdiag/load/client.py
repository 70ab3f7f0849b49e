"""The HTTP side of a load run, and the only module that imports httpx: the probe (is the endpoint there, and
does it stream?), prompt sizing through llama-server's /tokenize, and the concurrent streaming clients.

Each client is a coroutine that takes the next planned request, streams it and emits what happened; the run
ends when the plan is done or at the deadline, when requests in flight are cancelled (reported as cut) and the
rest are not sent. Proxies from the environment are ignored (trust_env=False): a load meant for loopback never
goes through one."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

from ..errors import EndpointError, UsageError
from .config import LoadConfig
from .events import FirstToken, LoadEnded, LoadStarted, RequestFailed, RequestFinished, RequestSent, Sink
from .prompts import PlannedRequest, size_exactly
from .sse import StreamError, error_body_text, parse_line

try:
    import httpx
except ModuleNotFoundError as e:
    if e.name not in ("httpx", "httpcore", "h11", "anyio", "certifi", "idna", "sniffio"):
        raise
    raise UsageError(f"graphdiag load needs httpx (module {e.name!r} is missing): "
                     "pip install 'graphdiag[load]'") from None

PROBE_READ_S = 15.0         # the probe asks for one token: a server this slow to answer one is not usable


def request_body(cfg: LoadConfig, r: PlannedRequest) -> dict[str, Any]:
    """The JSON body of one streamed request (llama-server's OpenAI-compatible fields; ignore_eos is its own)."""
    body: dict[str, Any] = {"max_tokens": r.max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": r.prompt}]
    else:
        body["prompt"] = list(r.prompt_ids) if r.prompt_ids is not None else r.prompt
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.model:
        body["model"] = cfg.model
    return body


def describe(e: BaseException, timeout_s: float) -> str:
    """An httpx error as one line for a report."""
    if isinstance(e, httpx.ConnectTimeout):
        return f"no connection within {timeout_s:g} s"
    if isinstance(e, (httpx.TimeoutException, TimeoutError)):
        return f"timed out after {timeout_s:g} s"
    text = str(e) or type(e).__name__
    if isinstance(e, httpx.ConnectError):
        return "connection refused (nothing listening there)" if "refused" in text.lower() else f"cannot connect: {text}"
    if isinstance(e, httpx.RemoteProtocolError):
        return f"connection closed: {text}"
    return f"{type(e).__name__}: {text}"


def _check_stream_response(resp: "httpx.Response", body: bytes | None = None) -> None:
    if resp.status_code != 200:
        raise StreamError(error_body_text(resp.status_code, body or b""))
    ctype = resp.headers.get("content-type", "")
    if "text/event-stream" not in ctype:
        raise StreamError(f"not a server-sent event stream (Content-Type {ctype or 'none'})")


def probe(cfg: LoadConfig) -> None:
    """One streamed request for one token: returns when the endpoint answers 200 with server-sent events whose
    first event is a completion chunk; else EndpointError, one line (exit 2), within the connect timeout or
    PROBE_READ_S (or --request-timeout where shorter) of silence."""
    body = request_body(cfg, PlannedRequest(-1, "Hello", 1, 1))
    read_s = min(PROBE_READ_S, cfg.request_timeout_s)
    timeout = httpx.Timeout(read_s, connect=cfg.connect_timeout_s)
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            with client.stream("POST", cfg.url, json=body) as resp:
                _check_stream_response(resp, resp.read() if resp.status_code != 200 else None)
                for line in resp.iter_lines():
                    if parse_line(line) is not None:
                        return
                raise StreamError("the stream ended without a data event")
    except StreamError as e:
        raise EndpointError(f"{cfg.url}: {e}") from None
    except httpx.HTTPError as e:
        t = cfg.connect_timeout_s if isinstance(e, httpx.ConnectTimeout) else read_s
        raise EndpointError(f"{cfg.url}: {describe(e, t)}") from None


def sized(cfg: LoadConfig, plan: Sequence[PlannedRequest]) -> list[PlannedRequest]:
    """The plan sized exactly through the server's /tokenize (and /detokenize for chat), when cfg.tokenize is
    'on', or 'auto' and the server has them; else the plan as drawn (approximate lengths)."""
    if cfg.tokenize == "off":
        return list(plan)
    timeout = httpx.Timeout(PROBE_READ_S, connect=cfg.connect_timeout_s)
    with httpx.Client(base_url=cfg.base_url, timeout=timeout, trust_env=False) as client:
        def post(path: str, payload: dict) -> dict:
            resp = client.post(path, json=payload)
            if resp.status_code != 200:
                raise StreamError(error_body_text(resp.status_code, resp.content))
            return resp.json()

        tokenize = lambda text: list(post("/tokenize", {"content": text, "add_special": False})["tokens"])
        detok = (lambda ids: post("/detokenize", {"tokens": ids})["content"]) if cfg.endpoint == "chat" else None
        try:
            ids = tokenize("Hello")
            if detok:
                detok(ids)
        except (StreamError, httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            if cfg.tokenize == "on":
                raise EndpointError(f"{cfg.base_url}: /tokenize{' or /detokenize' if detok else ''}: {e} "
                                    "(--tokenize on needs llama-server's)") from None
            return list(plan)
        try:
            return size_exactly(plan, tokenize, detok, cfg.seed)
        except (StreamError, httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise EndpointError(f"{cfg.base_url}: sizing prompts through /tokenize failed: {e}") from None


class _Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic_ns()

    def __call__(self) -> int:
        return time.monotonic_ns() - self.t0

    def left_s(self, deadline_s: float) -> float:
        return deadline_s - self() / 1e9


def run(cfg: LoadConfig, plan: Sequence[PlannedRequest], emit: Sink) -> None:
    """Probe, size the prompts, then run the plan on cfg.clients concurrent clients; every outcome is an event
    on `emit`. Ends at the deadline at the latest (counted from the call)."""
    clock = _Clock()
    probe(cfg)
    plan = sized(cfg, plan)
    emit(LoadStarted(t_ns=clock(), url=cfg.url, clients=cfg.clients, requests=len(plan),
                     exact_prompts=all(r.exact for r in plan), settings=cfg.to_dict()))
    asyncio.run(_load(cfg, plan, emit, clock))


class _Cut:
    """Why requests in flight were cancelled: the deadline (set before cancelling them), else an interrupt."""
    deadline = False

    def reason(self) -> str:
        return "cut by the deadline" if self.deadline else "cut by an interrupt"


async def _load(cfg: LoadConfig, plan: Sequence[PlannedRequest], emit: Sink, clock: _Clock) -> None:
    todo = iter(plan)
    sent, cut = 0, _Cut()

    async def client_loop(client: "httpx.AsyncClient", c: int) -> None:
        nonlocal sent
        for r in todo:                      # one shared iterator: each request is taken by one client
            sent += 1
            await _one(client, cfg, r, c, emit, clock, cut)

    limits = httpx.Limits(max_connections=cfg.clients, max_keepalive_connections=cfg.clients)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        tasks = [asyncio.create_task(client_loop(client, c)) for c in range(cfg.clients)]
        pending = set(tasks)
        try:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, clock.left_s(cfg.deadline_s)))
            cut.deadline = bool(pending)
        finally:                            # the deadline, or an interrupt cancelling this task: cut the clients
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()
    emit(LoadEnded(t_ns=clock(), deadline_reached=bool(pending), not_sent=len(plan) - sent))


async def _one(client: "httpx.AsyncClient", cfg: LoadConfig, r: PlannedRequest, c: int, emit: Sink,
               clock: Callable[[], int], cut: _Cut) -> None:
    """One streamed request, start to end, as events."""
    emit(RequestSent(t_ns=clock(), index=r.index, client=c, prompt_tokens=r.prompt_tokens, max_tokens=r.max_tokens))
    chunks, finish, usage, timings, status = 0, None, {}, {}, None
    try:
        async with asyncio.timeout(cfg.request_timeout_s):
            async with client.stream("POST", cfg.url, json=request_body(cfg, r)) as resp:
                status = resp.status_code
                _check_stream_response(resp, await resp.aread() if status != 200 else None)
                async for line in resp.aiter_lines():
                    ch = parse_line(line)
                    if ch is None:
                        continue
                    if ch.done:
                        break
                    if ch.text:
                        chunks += 1
                        if chunks == 1:
                            emit(FirstToken(t_ns=clock(), index=r.index))
                    finish = ch.finish_reason or finish
                    usage = ch.usage or usage
                    timings = ch.timings or timings
        if finish is None:
            raise StreamError("the stream ended before a finish reason")
    except StreamError as e:
        emit(RequestFailed(t_ns=clock(), index=r.index, error=str(e), status=status, chunks=chunks))
    except (httpx.HTTPError, TimeoutError) as e:
        emit(RequestFailed(t_ns=clock(), index=r.index, error=describe(e, cfg.request_timeout_s), status=status,
                           chunks=chunks))
    except (asyncio.CancelledError, KeyboardInterrupt):    # the deadline, or Ctrl-C/SIGTERM raised right here
        emit(RequestFailed(t_ns=clock(), index=r.index, error=cut.reason(), status=status, chunks=chunks,
                           cut=True))
        raise
    else:
        emit(RequestFinished(t_ns=clock(), index=r.index, chunks=chunks, finish_reason=finish, usage=usage,
                             timings=timings))

"""What a load run shows: live progress on stderr while it runs (a rich bar on a terminal, a plain line every
tenth of the requests otherwise), then the per-request table and the summary, or the result as JSON. The
progress is a sink of the run's events; the tables draw only what results.LoadResult holds."""

from __future__ import annotations

import json
import sys
import time
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .events import FirstToken, LoadEnded, LoadEvent, LoadStarted, RequestFailed, RequestFinished, RequestSent
from .results import LoadResult

WIDE = 140


class _Counts:
    def __init__(self) -> None:
        self.total = self.done = self.in_flight = self.failed = self.tokens = 0
        self.last_ttft_ms: float | None = None
        self._sent: dict[int, int] = {}

    def take(self, e: LoadEvent) -> bool:
        """Count the event; True when a request ended (done changed)."""
        if isinstance(e, LoadStarted):
            self.total = e.requests
        elif isinstance(e, RequestSent):
            self.in_flight += 1
            self._sent[e.index] = e.t_ns
        elif isinstance(e, FirstToken):
            self.last_ttft_ms = (e.t_ns - self._sent.get(e.index, e.t_ns)) / 1e6
        elif isinstance(e, (RequestFinished, RequestFailed)):
            self.in_flight -= 1
            self.done += 1
            self.failed += isinstance(e, RequestFailed)
            self.tokens += e.chunks
            return True
        return False

    def text(self) -> str:
        ttft = "-" if self.last_ttft_ms is None else f"{self.last_ttft_ms:.0f} ms"
        return f"in flight {self.in_flight} · errors {self.failed} · tokens {self.tokens} · last TTFT {ttft}"


class RichProgress:
    """A bar on stderr, redrawn from the events at most every REFRESH_S (never by rich's refresh thread, which
    would hold the interpreter inside the clients' timing)."""

    REFRESH_S = 0.1
    sink_name = "progress"

    def __init__(self, console: Console | None = None):
        self.counts = _Counts()
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console or Console(stderr=True), auto_refresh=False)
        self.task = None
        self._drawn = 0.0

    def __call__(self, e: LoadEvent) -> None:
        self.counts.take(e)
        if isinstance(e, LoadStarted):
            self.bar.start()
            self.task = self.bar.add_task("requests", total=e.requests)
        if self.task is None:
            return
        self.bar.update(self.task, completed=self.counts.done, description=f"requests · {self.counts.text()}")
        t = time.monotonic()
        if isinstance(e, LoadEnded) or t - self._drawn >= self.REFRESH_S:
            self.bar.refresh()
            self._drawn = t
        if isinstance(e, LoadEnded):
            self.close()

    def close(self) -> None:
        """Stop drawing (the run ended, or was interrupted before LoadEnded)."""
        if self.task is not None:
            self.bar.stop()
            self.task = None


class PlainProgress:
    """One line on `stream` at every tenth of the requests ended, and at the end."""

    sink_name = "progress"

    def __init__(self, stream: IO[str]):
        self.stream, self.counts, self._next = stream, _Counts(), 0

    def __call__(self, e: LoadEvent) -> None:
        ended = self.counts.take(e)
        c = self.counts
        if isinstance(e, LoadStarted):
            self._line(f"load: {c.total} requests on {e.clients} clients to {e.url}")
            self._next = max(1, c.total // 10)
        elif ended and c.done >= self._next:
            self._line(f"load: {c.done}/{c.total} done · {c.text()}")
            self._next = c.done + max(1, c.total // 10)
        elif isinstance(e, LoadEnded) and e.deadline_reached:
            self._line(f"load: deadline reached · {c.done}/{c.total} done")

    def close(self) -> None:
        pass

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


def progress_for(stream: IO[str] | None = None):
    """The progress sink for `stream` (stderr): rich on a terminal, plain lines otherwise."""
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    return RichProgress() if isatty is not None and isatty() else PlainProgress(stream)


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _server_rate(timings: dict, key: str) -> float | None:
    v = timings.get(key)
    return v if isinstance(v, (int, float)) else None


def render(result: LoadResult, file: IO[str] | None = None, width: int | None = None) -> None:
    """The per-request table and the summary."""
    console = Console(file=file, highlight=False, width=width)
    if width is None and not console.is_terminal:
        console.width = WIDE                     # a file or a pipe: rows whole, not folded to 80 columns
    prompt_head = "prompt" if result.exact_prompts else "prompt≈"
    t = Table(title=f"graphdiag load: {result.url}, {result.clients} clients", title_justify="left")
    for head in ("#", "client", prompt_head, "out", "TTFT ms", "tok/s", "total ms", "server pp/s",
                 "server tg/s", "end"):
        t.add_column(head, justify="left" if head == "end" else "right")
    for r in result.ordered:
        t.add_row(str(r.index), str(r.client), str(r.prompt_tokens), str(r.output_tokens), _f(r.ttft_ms),
                  _f(r.tokens_per_s), _f(r.latency_ms), _f(_server_rate(r.timings, "prompt_per_second")),
                  _f(_server_rate(r.timings, "predicted_per_second")),
                  (r.finish_reason or "ok") if r.ok else f"[red]{r.error}[/red]")
    console.print(t)
    console.print("tokens: prompt and out (out: the server's completion_tokens, else chunks); tok/s: the client's "
                  "decode rate after the first token; server pp/s, tg/s: llama-server's timings")
    _render_summary(result, console)


def _render_summary(result: LoadResult, console: Console) -> None:
    s = result.summary()
    t = Table(title="summary", title_justify="left")
    for head in ("", "min", "p50", "p90", "p99", "max", "mean"):
        t.add_column(head, justify="right" if head else "left")
    for name, key in (("TTFT ms", "ttft_ms"), ("tok/s per request", "tokens_per_s"), ("total ms", "latency_ms")):
        t.add_row(name, *(_f(s[key][k]) for k in ("min", "p50", "p90", "p99", "max", "mean")))
    console.print(t)
    console.print(f"{s['ok']} of {s['requests']} requests ok, {s['failed']} failed"
                  + (f", {s['cut']} cut by the deadline" if s["cut"] else "")
                  + (f", {s['not_sent']} not sent" if s["not_sent"] else "")
                  + f" in {s['wall_s']:.2f} s; {s['output_tokens']} output tokens, "
                  f"{_f(s['output_tokens_per_s'])} tok/s overall, {_f(s['requests_per_s'], '.2f')} requests/s")
    if not result.exact_prompts:
        console.print("prompt≈: approximate, no /tokenize used (synthetic prompts: about one token a word; "
                      "a file's prompts: one token a 4 characters); the server's own counts are in --json")
    for err, n in s["errors"].items():
        console.print(f"[red]error[/red] x{n}: {err}")


def render_json(result: LoadResult, file: IO[str] | None = None) -> None:
    print(json.dumps(result.to_dict(), indent=1), file=file or sys.stdout)

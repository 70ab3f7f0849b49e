"""Events to results: one row per request (time to first token, tokens per second, the server's own counts and
timings, the error) and the run's summary. Pure: a Collector is a sink that keeps what the events said."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from .events import FirstToken, LoadEnded, LoadEvent, LoadStarted, RequestFailed, RequestFinished, RequestSent


@dataclass
class RequestRow:
    """One request. Times in ns from the run's start; derived values in ms and tokens per second."""

    index: int
    client: int
    prompt_tokens: int
    max_tokens: int
    sent_ns: int
    first_ns: int | None = None
    end_ns: int | None = None
    chunks: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    status: int | None = None
    cut: bool = False

    @property
    def ok(self) -> bool:
        return self.end_ns is not None and self.error is None

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_ns is None else (self.first_ns - self.sent_ns) / 1e6

    @property
    def latency_ms(self) -> float | None:
        return None if self.end_ns is None else (self.end_ns - self.sent_ns) / 1e6

    @property
    def output_tokens(self) -> int:
        """The server's completion_tokens where it said, else the chunks with text (one a token)."""
        n = self.usage.get("completion_tokens")
        return n if isinstance(n, int) else self.chunks

    @property
    def tokens_per_s(self) -> float | None:
        """Decode rate seen by the client: tokens after the first over the time after the first."""
        if not self.ok or self.first_ns is None or self.output_tokens < 2 or self.end_ns <= self.first_ns:
            return None
        return (self.output_tokens - 1) / ((self.end_ns - self.first_ns) / 1e9)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "client": self.client, "ok": self.ok, "prompt_tokens": self.prompt_tokens,
                "max_tokens": self.max_tokens, "output_tokens": self.output_tokens, "chunks": self.chunks,
                "ttft_ms": _r(self.ttft_ms), "latency_ms": _r(self.latency_ms), "tokens_per_s": _r(self.tokens_per_s),
                "finish_reason": self.finish_reason, "usage": self.usage, "timings": self.timings,
                "error": self.error, "status": self.status, "cut": self.cut}


@dataclass
class LoadResult:
    url: str = ""
    clients: int = 0
    planned: int = 0
    exact_prompts: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    rows: dict[int, RequestRow] = field(default_factory=dict)
    end_ns: int | None = None
    deadline_reached: bool = False
    not_sent: int = 0

    @property
    def ordered(self) -> list[RequestRow]:
        return [self.rows[i] for i in sorted(self.rows)]

    @property
    def failed(self) -> list[RequestRow]:
        return [r for r in self.ordered if not r.ok]

    @property
    def complete(self) -> bool:
        """Every planned request sent and answered in full."""
        return not self.deadline_reached and not self.not_sent and not self.failed and len(self.rows) == self.planned

    def summary(self) -> dict[str, Any]:
        rows = self.ordered
        ok = [r for r in rows if r.ok]
        start = min((r.sent_ns for r in rows), default=0)
        wall_s = ((self.end_ns or start) - start) / 1e9
        out_tokens = sum(r.output_tokens for r in ok)
        return {"requests": self.planned, "sent": len(rows), "ok": len(ok), "failed": len(rows) - len(ok),
                "cut": sum(r.cut for r in rows), "not_sent": self.not_sent, "deadline_reached": self.deadline_reached,
                "wall_s": round(wall_s, 3), "output_tokens": out_tokens,
                "output_tokens_per_s": _r(out_tokens / wall_s if wall_s > 0 else None),
                "requests_per_s": _r(len(ok) / wall_s if wall_s > 0 else None),
                "ttft_ms": stats([r.ttft_ms for r in ok]), "tokens_per_s": stats([r.tokens_per_s for r in ok]),
                "latency_ms": stats([r.latency_ms for r in ok]),
                "errors": dict(Counter(r.error or "" for r in rows if not r.ok).most_common())}

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "graphdiag-load", "version": 1, "url": self.url, "clients": self.clients,
                "exact_prompt_tokens": self.exact_prompts, "settings": self.settings, "summary": self.summary(),
                "requests": [r.to_dict() for r in self.ordered]}


class Collector:
    """A sink that builds the LoadResult from the run's events."""

    sink_name = "results"

    def __init__(self, planned: int = 0):
        self.result = LoadResult(planned=planned)

    def __call__(self, e: LoadEvent) -> None:
        res = self.result
        if isinstance(e, LoadStarted):
            res.url, res.clients, res.planned, res.exact_prompts = e.url, e.clients, e.requests, e.exact_prompts
            res.settings = dict(e.settings)
        elif isinstance(e, RequestSent):
            res.rows[e.index] = RequestRow(e.index, e.client, e.prompt_tokens, e.max_tokens, e.t_ns)
        elif isinstance(e, FirstToken):
            res.rows[e.index].first_ns = e.t_ns
        elif isinstance(e, RequestFinished):
            row = res.rows[e.index]
            row.end_ns, row.chunks, row.finish_reason = e.t_ns, e.chunks, e.finish_reason
            row.usage, row.timings = dict(e.usage), dict(e.timings)
        elif isinstance(e, RequestFailed):
            row = res.rows[e.index]
            row.error, row.status, row.chunks, row.cut = e.error, e.status, e.chunks, e.cut
        elif isinstance(e, LoadEnded):
            res.end_ns, res.deadline_reached, res.not_sent = e.t_ns, e.deadline_reached, e.not_sent


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted xs, linear between closest ranks."""
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats(values: Sequence[float | None]) -> dict[str, float | None]:
    """min, p50, p90, p99, max and mean of the values given (None ones left out); all None when there are none."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return dict.fromkeys(("min", "p50", "p90", "p99", "max", "mean"))
    return {"min": _r(xs[0]), "p50": _r(percentile(xs, 50)), "p90": _r(percentile(xs, 90)),
            "p99": _r(percentile(xs, 99)), "max": _r(xs[-1]), "mean": _r(sum(xs) / len(xs))}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)

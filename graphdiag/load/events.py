"""What happened during a load run, as small frozen events with integer-ns timestamps (time.monotonic_ns from
the run's start): the live progress, the per-request rows and the summary are all built from these."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar


@dataclass(frozen=True)
class LoadEvent:
    kind: ClassVar[str] = "load"
    t_ns: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class LoadStarted(LoadEvent):
    """The endpoint answered the probe; `requests` are planned for `clients` clients."""
    kind: ClassVar[str] = "load_started"
    url: str = ""
    clients: int = 0
    requests: int = 0
    exact_prompts: bool = False
    settings: dict[str, Any] = field(default_factory=dict)      # the run's LoadConfig, as to_dict gives it


@dataclass(frozen=True)
class RequestSent(LoadEvent):
    kind: ClassVar[str] = "request_sent"
    index: int = 0
    client: int = 0
    prompt_tokens: int = 0
    max_tokens: int = 0


@dataclass(frozen=True)
class FirstToken(LoadEvent):
    """The first chunk carrying generated text arrived."""
    kind: ClassVar[str] = "first_token"
    index: int = 0


@dataclass(frozen=True)
class RequestFinished(LoadEvent):
    """The stream ended ([DONE] or closed after a finish reason). `chunks`: chunks with text (llama-server
    sends one a token); `usage` and `timings` as the server reported them (empty where it did not)."""
    kind: ClassVar[str] = "request_finished"
    index: int = 0
    chunks: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestFailed(LoadEvent):
    """The request ended without a complete stream: an HTTP error, an error in the stream, a timeout, a
    closed connection, or the deadline (`cut`). `chunks` counts those that had arrived."""
    kind: ClassVar[str] = "request_failed"
    index: int = 0
    error: str = ""
    status: int | None = None
    chunks: int = 0
    cut: bool = False


@dataclass(frozen=True)
class LoadEnded(LoadEvent):
    kind: ClassVar[str] = "load_ended"
    deadline_reached: bool = False
    not_sent: int = 0


Sink = Callable[[LoadEvent], None]

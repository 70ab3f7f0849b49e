"""A streamed completion's server-sent events, one line at a time, to what a load run measures: the text each
chunk carries (/v1/completions: choices[0].text; /v1/chat/completions: choices[0].delta.content or its
reasoning_content), the finish reason, the usage and llama-server's `timings` (in its final chunk), and errors
sent inside the stream. Pure: tested on literal lines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"


class StreamError(Exception):
    """The stream said something a completion stream does not: an error object, or a line that is not an
    SSE field. The message is what the report shows for the request."""


@dataclass(frozen=True)
class Chunk:
    """One `data:` event of a completion stream. `text` is '' for a chunk with no generated text (the final
    one, a role-only delta); `done` for the closing [DONE]."""

    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    done: bool = False


def parse_line(line: str) -> Chunk | None:
    """One line of the stream -> a Chunk, or None for a line that carries none (blank, comment, event:/id:/
    retry: fields). Raises StreamError for an error event or a line that is not SSE."""
    if not line or line.startswith(":"):
        return None
    field, _, value = line.partition(":")
    value = value[1:] if value.startswith(" ") else value
    if field in ("event", "id", "retry"):
        return None
    if field == "error":                       # llama-server's older form of an error inside a stream
        raise StreamError(_error_text(_json(value, line)))
    if field != "data":
        raise StreamError(f"not a server-sent event stream (line {line[:80]!r})")
    if value.strip() == DONE:
        return Chunk(done=True)
    obj = _json(value, line)
    if not isinstance(obj, dict):
        raise StreamError(f"a data line that is not a JSON object ({value[:80]!r})")
    if "error" in obj:
        raise StreamError(_error_text(obj))
    return _chunk(obj)


def _json(value: str, line: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise StreamError(f"a data line that is not JSON ({line[:80]!r})") from None


def _chunk(obj: dict[str, Any]) -> Chunk:
    choices = obj.get("choices") or []
    first = choices[0] if choices and isinstance(choices[0], dict) else {}
    text = first.get("text")
    if text is None:
        delta = first.get("delta") or {}
        text = delta.get("content") or delta.get("reasoning_content") or ""
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    timings = obj.get("timings") if isinstance(obj.get("timings"), dict) else None
    return Chunk(text=text if isinstance(text, str) else "", finish_reason=first.get("finish_reason"),
                 usage=usage, timings=timings)


def _error_text(obj: Any) -> str:
    """An OpenAI-style error object ({"error": {"code", "message"}}) as one line."""
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        code, msg = err.get("code"), err.get("message") or err.get("type") or json.dumps(err)[:120]
        return f"server error {code}: {msg}" if code is not None else f"server error: {msg}"
    return f"server error: {str(err)[:120]}"


def error_body_text(status: int, body: bytes) -> str:
    """A non-200 response's body (JSON error or text) as one line."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        snippet = body[:120].decode("utf-8", "replace").strip().replace("\n", " ")
        return f"HTTP {status}" + (f": {snippet}" if snippet else "")
    msg = _error_text(obj) if isinstance(obj, dict) and "error" in obj else json.dumps(obj)[:120]
    return f"HTTP {status}: {msg.removeprefix(f'server error {status}: ')}"

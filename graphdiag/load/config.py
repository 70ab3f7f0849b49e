"""What one load run is: the endpoint, the clients and requests, the length ranges, the seed and the deadline.
Every check on the user's input lives here and raises UsageError (one line, exit 2) before anything is sent."""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import UsageError

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
MAX_CLIENTS = 1024
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 1 << 20            # a range bound past any context a server has


@dataclass(frozen=True)
class LoadConfig:
    """One load run. Times in seconds; lengths in tokens (prompt lengths are approximate unless the server's
    /tokenize sized them: see prompts.py)."""

    base_url: str                       # scheme://host:port, no path
    endpoint: str                       # "completions" or "chat"
    clients: int = 4
    requests: int = 32
    prompt_tokens: tuple[int, int] = (16, 256)
    output_tokens: tuple[int, int] = (16, 128)
    prompts_file: str | None = None
    seed: int = 0
    deadline_s: float = 600.0           # the whole run, probe and prompt sizing included
    request_timeout_s: float = 120.0    # one request, connect to last byte
    connect_timeout_s: float = 3.0
    model: str | None = None
    tokenize: str = "auto"              # "auto": the server's /tokenize if it has one; "off": approximate
    ignore_eos: bool = True             # ask llama-server for exactly the drawn output length

    @property
    def url(self) -> str:
        return self.base_url + ENDPOINTS[self.endpoint]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["url"] = self.url
        return d


def parse_range(text: str, option: str, lo: int = 1, hi: int = MAX_TOKENS) -> tuple[int, int]:
    """'A-B' or 'A' (A..A) -> (A, B), lo <= A <= B <= hi."""
    parts = text.strip().split("-")
    try:
        if len(parts) not in (1, 2):
            raise ValueError
        a, b = int(parts[0]), int(parts[-1])
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected N or A-B (whole numbers, e.g. 16-1500)") from None
    if not lo <= a <= b <= hi:
        raise UsageError(f"{option} {text!r}: needs {lo} <= A <= B <= {hi}")
    return a, b


def is_loopback(host: str) -> bool:
    """An IP literal in 127.0.0.0/8 or ::1, or the name localhost. Other names are not resolved: a name that
    happens to resolve to loopback still needs --allow-host (what the user typed is what is checked)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_url(url: str, endpoint: str | None, allow_host: str | None) -> tuple[str, str]:
    """URL -> (base URL, endpoint name). The URL's path may name the endpoint (/v1/completions or
    /v1/chat/completions), or be empty or /v1 and leave it to `endpoint` (default completions). Only http(s);
    a host other than loopback only when `allow_host` names it."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise UsageError(f"URL {url!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"URL {url!r}: expected http://HOST:PORT[/v1/completions|/v1/chat/completions]")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UsageError(f"URL {url!r}: no query, fragment or credentials (the endpoint is scheme://host:port/path)")
    host = parts.hostname
    if not is_loopback(host) and (allow_host or "").strip("[]").lower() != host.lower():
        raise UsageError(f"URL {url!r}: {host} is not a loopback address; name it with --allow-host {host} "
                         "to send load there")
    path = parts.path.rstrip("/")
    named = {v: k for k, v in ENDPOINTS.items()}.get(path)
    if path not in ("", "/v1") and named is None:
        raise UsageError(f"URL {url!r}: path {parts.path!r} is neither /v1/completions nor /v1/chat/completions")
    if named and endpoint and endpoint != named:
        raise UsageError(f"URL {url!r} names the {named} endpoint but --endpoint is {endpoint}")
    netloc = f"[{host}]" if ":" in host else host
    base = f"{parts.scheme}://{netloc}" + (f":{port}" if port is not None else "")
    return base, named or endpoint or "completions"


def read_prompts(path: str) -> tuple[str, ...]:
    """A prompts file: one prompt a line (UTF-8), blank lines skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--prompts {path}: {getattr(e, 'strerror', None) or e}") from None
    prompts = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not prompts:
        raise UsageError(f"--prompts {path}: no prompt in it (one a line, blank lines skipped)")
    return prompts

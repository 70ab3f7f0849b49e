"""Reading a raw JSON-lines stream (`graphdiag llama`'s llama-watch, `graphdiag trace`'s): the header named
and versioned, every line JSON; any defect is one EventFileError naming the file and line."""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

from .errors import EventFileError


def read_lines(path: str | Path, name: str, version: int) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
    """(header, [(line number, parsed object)]) of the stream at `path`, whose header must be
    `{"raw": name, "version": version, ...}`."""
    path = Path(path)
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise EventFileError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise EventFileError(f"{path}: not a {name} raw stream (not UTF-8 text)") from None
    except (lzma.LZMAError, EOFError) as e:
        raise EventFileError(f"{path}: not a whole xz file ({e})") from None
    except OSError as e:
        raise EventFileError(f"{path}: cannot read: {e.strerror}") from None
    rows = [(n, line) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]
    if not rows:
        raise EventFileError(f"{path}: empty file (no header line)")
    header = _parse(path, *rows[0])
    if not isinstance(header, dict) or header.get("raw") != name:
        raise EventFileError(f"{path}: not a {name} raw stream (no \"raw\": \"{name}\" header)")
    if header.get("version") != version:
        raise EventFileError(f"{path}: unsupported {name} stream version {header.get('version')!r} "
                             f"(this graphdiag reads version {version})")
    return header, [(n, _parse(path, n, line)) for n, line in rows[1:]]


def read_text(path: Path) -> str:
    """The stream's text; a name ending in .xz is read through lzma (raw streams compress ~20x: the H100's
    fixtures are kept so)."""
    if path.suffix == ".xz":
        with lzma.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


def first_line(path: str | Path) -> bytes:
    """The stream's first line, read through lzma where its name ends in .xz (OSError, EOFError or
    lzma.LZMAError where it cannot be read)."""
    opener = lzma.open if Path(path).suffix == ".xz" else open
    with opener(path, "rb") as f:
        return f.readline()


def _parse(path: Path, n: int, line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise EventFileError(f"{path}:{n}: not JSON (a line cut short?)") from None


def require_fields(path: Path, n: int, obj: dict[str, Any], need) -> dict[str, Any]:
    """`obj` if each field in `need` is there and typed (text, status, fn and kind strings, the rest integers)."""
    for field in need:
        v = obj.get(field)
        text = field in ("text", "status", "fn", "kind")
        if isinstance(v, str) if text else isinstance(v, int) and not isinstance(v, bool):
            continue
        raise EventFileError(f"{path}:{n}: {obj['ev']} line without a valid {field} ({json.dumps(v)[:40]})")
    return obj

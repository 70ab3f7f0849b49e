"""Where a key sits in a TOML text: the line numbers scenario errors name (tomllib reports none for
values that parse but do not validate)."""

from __future__ import annotations

import re


def line_of(text: str, table: str | None, key: str | None, index: int | None) -> int:
    """1-based line of `key` in `table` (top level when None), in the `index`-th entry of an array of
    tables; the table's own line when the key is not found; 1 when neither is."""
    start, end = _table_span(text, table, index)
    if key is not None:
        pattern = re.compile(rf'(?:^|[{{,])[ \t]*"?(?P<k>{re.escape(key)})"?[ \t]*=', re.M)
        m = pattern.search(text, start, end)
        if m:
            return text.count("\n", 0, m.start("k")) + 1
        if table is None:                    # a top-level [key] table
            m = re.compile(rf"^[ \t]*\[\[?[ \t]*{re.escape(key)}[ \t]*\]", re.M).search(text)
            if m:
                return text.count("\n", 0, m.start()) + 1
    return text.count("\n", 0, start) + 1


def _table_span(text: str, table: str | None, index: int | None) -> tuple[int, int]:
    """Character range of a table's body: [name], the index-th [[name]], or the index-th {…} of name = [ … ]."""
    if table is None:
        first = re.search(r"^[ \t]*\[", text, re.M)
        return 0, first.start() if first else len(text)
    header = re.compile(rf"^[ \t]*\[\[?[ \t]*{re.escape(table)}[ \t]*\]\]?", re.M)
    heads = list(header.finditer(text))
    if heads:
        h = heads[min(index or 0, len(heads) - 1)]
        nxt = re.compile(r"^[ \t]*\[", re.M).search(text, h.end())
        return h.start(), nxt.start() if nxt else len(text)
    m = re.search(rf"^[ \t]*{re.escape(table)}[ \t]*=", text, re.M)
    if not m:
        return 0, len(text)
    if index is None:
        return m.start(), len(text)
    return _inline_entry(text, m.end(), index)


def _inline_entry(text: str, pos: int, index: int) -> tuple[int, int]:
    """The index-th {…} inline table after `pos` (nesting-aware, ignores strings' braces roughly)."""
    depth, count, begin = 0, -1, pos
    for i in range(pos, len(text)):
        ch = text[i]
        if ch == "{":
            if depth == 0:
                count += 1
                begin = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and count == index:
                return begin, i + 1
        elif ch == "]" and depth == 0:
            break
    return pos, len(text)

"""The house's shape: graphdiag's floors, bottom to top, and the rule that no import runs back up them.

The import graph is read from every import statement of every graphdiag module, at module level and inside
functions alike (a function-level import is still a dependency, only a later one), each resolved to the
graphdiag module it names (`from .x import y` where y is a submodule points at y). A package's __init__
importing its own children is not an edge back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "graphdiag"

# Bottom to top. A module may import its own floor and the floors below it, never one above. Names are
# module paths under graphdiag ("" is the package itself); a name covers its sub-modules.
FLOORS = (
    ("base", ("", "errors", "events", "counters", "release", "resources", "plan", "_toml_lines", "interrupts", "early_signals",
              "parallel")),
    ("engine", ("ir", "quants", "memory", "backends", "model", "sched", "sim_mode", "oracle_check", "oracle_router", "rawstream")),
    ("settings", ("config", "scenario")),
    ("record", ("report", "report.record")),         # report/__init__ is a docstring
    ("sources", ("report.sources",)),
    ("analysis", ("report.analysis",)),
    ("views", ("report.views",)),
    ("sinks", ("report.sinks",)),
    ("run", ("runner", "bench", "llama", "trace", "load", "cli", "__main__", "entry")),   # llama: drives real llama.cpp, as runner ours
)

# What a room never imports, said outright (the floors forbid the rooms above it already; a device source,
# on a floor below, is no business of an analysis or a view either).
NEVER = {
    "report.analysis": ("report.views", "report.sinks", "report.sources", "rich", "matplotlib", "nvtx", "cupti"),
    "report.views": ("report.sinks", "report.sources"),          # data in, drawing out
    "report.record": ("rich", "matplotlib"),
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """{'report.analysis.diff': (path, is_package)} for every graphdiag module ('' is graphdiag itself)."""
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if pkg else parts)] = (p, pkg)
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The graphdiag module `name` (dotted, relative to graphdiag) is or lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(mod: str) -> set[str]:
    """What `mod` imports: graphdiag modules (relative to graphdiag) and '!name' for other top-level names."""
    path, pkg = MODULES[mod]
    here = mod.split(".") if mod else []
    base = here if pkg else here[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            up = base[:len(base) - (node.level - 1)] if node.level else None
            full = ".".join(["graphdiag", *up, *([node.module] if node.module else [])]) if node.level \
                else node.module or ""
            targets = [(full, a.name) for a in node.names]
        else:
            continue
        for full, name in targets:
            if full != "graphdiag" and not full.startswith("graphdiag."):
                out.add("!" + full.split(".")[0])
                continue
            inner = full[len("graphdiag."):] if full != "graphdiag" else ""
            sub = f"{inner}.{name}".lstrip(".") if name else None
            if inner not in MODULES and sub not in MODULES:
                out.add("?" + inner)                      # names no module: test_every_import_resolves says so
            out.add(sub if sub in MODULES else _resolve(inner))   # `from .x import y`, y a submodule: y
    out.discard(mod)
    if pkg:                                   # a package's __init__ importing its own children
        out = {t for t in out if t.startswith("!") or not (t.startswith(mod + ".") or mod == "")}
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _within(mod: str, name: str) -> bool:
    """Whether module `mod` is `name` or lies inside it ("" is graphdiag itself, and holds only itself)."""
    return mod == name or (name != "" and mod.startswith(name + "."))


def floor_of(mod: str) -> int:
    """The index in FLOORS of the floor `mod` is on (the longest matching name wins)."""
    matches = [(len(n), i) for i, (_, names) in enumerate(FLOORS) for n in names if _within(mod, n)]
    assert matches, f"graphdiag.{mod} is on no floor: add it to FLOORS"
    return max(matches)[1]


def test_every_module_is_on_a_floor():
    for m in MODULES:
        floor_of(m)


def test_every_import_resolves():
    bad = sorted(f"graphdiag.{m} imports graphdiag.{t[1:]}, which is no module" for m, ts in GRAPH.items()
                 for t in ts if t.startswith("?"))
    assert not bad, "\n".join(bad)


def _internal(ts: set[str]) -> set[str]:
    return {t for t in ts if not t.startswith(("!", "?"))}


def test_no_import_runs_up_a_floor():
    up = sorted(f"graphdiag.{m} ({FLOORS[floor_of(m)][0]}) imports graphdiag.{t} ({FLOORS[floor_of(t)][0]})"
                for m, ts in GRAPH.items() for t in _internal(ts) if floor_of(t) > floor_of(m))
    assert not up, "\n".join(up)


@pytest.mark.parametrize("room", sorted(NEVER))
def test_rooms_keep_to_their_role(room):
    assert any(_within(m, room) for m in MODULES), f"graphdiag.{room} is no module"
    bad = sorted(f"graphdiag.{m} imports {t.lstrip('!')}" for m, ts in GRAPH.items() if _within(m, room)
                 for t in ts for no in NEVER[room]
                 if (t == "!" + no) or (t in _internal({t}) and _within(t, no)))
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next((w for w in it if w in graph), None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_package_has_no_import_cycle():
    graph = {m: _internal(ts) for m, ts in GRAPH.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_function_level_imports_count():
    # graphdiag.runner imports the console sink inside a function: it must be in the graph
    assert "report.sinks.console" in GRAPH["runner"]

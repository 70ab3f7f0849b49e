"""The architectures build on public interfaces only, and no import runs back up (STYLE.md, round 4).

graphdiag/model/arch/* import, of graphdiag.model, only the graph builder's interface (graph_context), the
oracle's (reference_base), presets and each other; the registry (arch/__init__) sits above them, and build.py
and reference.py, which pick a model's builder and oracle, above the registry. Imports are read with ast,
those inside functions included and those under `if TYPE_CHECKING:` left out (annotations only).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import graphdiag

ROOT = Path(graphdiag.__file__).resolve().parent
MODEL = "graphdiag.model"
ARCH = f"{MODEL}.arch"
ARCH_MAY_IMPORT = {f"{MODEL}.graph_context", f"{MODEL}.reference_base", f"{MODEL}.presets", f"{MODEL}.kv_sizes"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports_of(path: Path) -> set[str]:
    """The graphdiag modules `path` imports at run time (any depth, not under TYPE_CHECKING)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for n in child.orelse:
                    visit(n)
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([base] if base else []))
                out.add(base)
                out.update(f"{base}.{a.name}" for a in child.names)    # `from . import qwen2` names a module
            visit(child)

    visit(ast.parse(path.read_text()))
    known = {_module_name(p) for p in ROOT.rglob("*.py")}
    return {m for m in out if m in known and m != name}


def model_graph() -> dict[str, set[str]]:
    """graphdiag.model's modules and the graphdiag.model modules each imports."""
    return {_module_name(p): {m for m in imports_of(p) if m.startswith(MODEL)}
            for p in (ROOT / "model").rglob("*.py")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def test_arch_modules_use_only_the_public_interfaces():
    g = model_graph()
    for mod, deps in g.items():
        if mod.startswith(ARCH + "."):
            outside = {d for d in deps if not d.startswith(ARCH)} - ARCH_MAY_IMPORT
            assert not outside, f"{mod} imports {sorted(outside)}"


def test_no_import_circle_through_the_architectures():
    cycles = [c for c in _cycles(model_graph()) if any(m.startswith(ARCH) for m in c)]
    assert not cycles


def test_cycle_finder_sees_a_circle():
    """The check above would see the circle this change removed (build -> arch -> build)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", ["graph_context", "reference_base", "arch.llama", "arch.qwen2", "arch.qwen3",
                                    "arch.qwen3moe", "arch.gemma3", "arch"])
def test_module_imports_alone(module):
    """Each imports first in a fresh interpreter (a circle shows as an ImportError of a partial module)."""
    r = subprocess.run([sys.executable, "-c", f"import {MODEL}.{module}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

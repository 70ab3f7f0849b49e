"""Addresses for a hand-built graph: every tensor placed by `alloc`, a view at its source's data + offset."""

from __future__ import annotations

from graphdiag.ir.graph import Graph
from graphdiag.ir.tensor import Tensor


def place_tensors(g: Graph, alloc) -> None:
    """data for every leaf and node of `g` that has none (a view: its view_src's data + view_offs);
    `alloc(nbytes)` returns an address."""
    for idx in list(g.leafs) + list(g.nodes):
        t = g.arena.rec[idx]
        if t["view_src"]:
            t["data"] = g.arena.rec[g.arena.index(int(t["view_src"]))]["data"] + t["view_offs"]
        elif not t["data"]:
            t["data"] = alloc(Tensor(g.arena, int(idx)).nbytes())

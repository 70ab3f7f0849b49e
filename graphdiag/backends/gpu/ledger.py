"""The node-property ledger (ggml_cuda_graph::node_properties), vectorised.

A graph's snapshot is one structured array with a record per node holding what llama.cpp's
`node_properties` holds: the whole node struct (336 bytes), then each source's data pointer, ne and nb
(1056 bytes per node). Building it is one gather from the arena; a changed graph is found by one vectorised
comparison of the records as 64-bit words; only then is the first differing node decoded into a field path.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from ...ir.arena import MAX_SRC, TENSOR_DTYPE, Arena
from ...ir.dtypes import GGMLType
from ...ir.graph import Graph
from ...ir.ops import Op

PROPS_DTYPE = np.dtype([
    ("node", TENSOR_DTYPE),
    ("src_data", "<u8", (MAX_SRC,)),
    ("src_ne", "<i8", (MAX_SRC, 4)),
    ("src_nb", "<u8", (MAX_SRC, 4)),
])
assert PROPS_DTYPE.itemsize == 1056
_WORDS = PROPS_DTYPE.itemsize // 8


_W = TENSOR_DTYPE.itemsize // 8             # 42 words per struct
# word offsets inside ggml_tensor and inside a node_properties record
_NE, _NB, _SRC, _DATA = 2, 6, 19, 31
_P_DATA, _P_NE, _P_NB = _W, _W + MAX_SRC, _W + MAX_SRC + 4 * MAX_SRC
_FOUR = np.arange(4, dtype=np.intp)


def snapshot(arena: Arena, nodes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """node_properties for every node of a graph: one gather of structs plus one of their sources' fields.

    Works on 64-bit words (every field of interest is word aligned): the struct rows are copied whole, which
    also copies the implicit padding bytes, as memcmp sees them."""
    n = len(nodes)
    snap = out if out is not None and len(out) == n else np.zeros(n, PROPS_DTYPE)
    words = arena.rec.view(np.uint64).reshape(len(arena.rec), _W)
    s = snap.view(np.uint64).reshape(n, _WORDS)
    s[:, :_W] = words[nodes]
    src = s[:, _SRC : _SRC + MAX_SRC]                         # (n, 10) struct addresses, 0 = null
    null = src == 0
    sidx = (src - np.uint64(arena.base)) // np.uint64(TENSOR_DTYPE.itemsize)
    sidx[null] = 0
    sidx = sidx.astype(np.intp)
    flat = words.reshape(-1)
    base = sidx * _W                                           # word index of each source struct
    s[:, _P_DATA : _P_DATA + MAX_SRC] = np.take(flat, base + _DATA)
    quad = (base[:, :, None] + _FOUR).reshape(n, 4 * MAX_SRC)
    s[:, _P_NE : _P_NE + 4 * MAX_SRC] = np.take(flat, quad + _NE)
    s[:, _P_NB : _P_NB + 4 * MAX_SRC] = np.take(flat, quad + _NB)
    if null.any():
        s[:, _P_DATA : _P_DATA + MAX_SRC][null] = 0
        null4 = np.repeat(null, 4, axis=1)
        s[:, _P_NE : _P_NE + 4 * MAX_SRC][null4] = 0
        s[:, _P_NB : _P_NB + 4 * MAX_SRC][null4] = 0
    return snap


def changed_nodes(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Indices of nodes whose 1056-byte records differ (same length required)."""
    a = old.view(np.uint64).reshape(len(old), _WORDS)
    b = new.view(np.uint64).reshape(len(new), _WORDS)
    return np.flatnonzero((a != b).any(axis=1))


def props_digest(snap: np.ndarray) -> str:
    """16 hex digits over every byte of a snapshot: two snapshots compare equal iff their digests do. SHA-256,
    which x86's SHA extensions run at twice blake2b's speed (a 1b prefill's 460 KB snapshot: 0.26 vs
    0.50 ms, before its first kernel); digests are compared only within one record (diff leaves them out,
    as they cover addresses), so the algorithm may change between versions."""
    return hashlib.sha256(memoryview(np.ascontiguousarray(snap)).cast("B")).hexdigest()[:16]


def shape_digest(snap: np.ndarray) -> str:
    """16 hex digits over each node's op, type and ne and its sources' ne: what the graph computes,
    without any address (a content hash a graph cache can key on)."""
    h = hashlib.blake2b(digest_size=8)
    node = snap["node"]
    for a in (node["op"], node["type"], node["ne"], snap["src_ne"]):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class FieldDiff:
    node: int
    node_name: str
    op: str
    field: str
    old: str
    new: str


_PTR_FIELDS = ("buffer", "data", "view_src", "extra")
_SCALAR_FIELDS = ("type", "buffer", "op", "flags", "view_src", "view_offs", "data", "name", "extra")


_PTR_PATH = re.compile(r"src\[\d\](\.data)?")


def _fmt(field: str, v) -> str:
    if field in _PTR_FIELDS or _PTR_PATH.fullmatch(field):
        return f"{int(v):#x}" if int(v) else "NULL"
    if field == "type":
        return GGMLType(int(v)).name
    if field == "op":
        return Op(int(v)).name
    if field == "name":
        return bytes(v).rstrip(b"\0").decode(errors="replace")
    return str(int(v))


# the 64-bit words of a PROPS_DTYPE record each node-struct field overlaps
_FIELD_WORDS = {f: frozenset(range(off // 8, (off + dt.itemsize + 7) // 8))
                for f, (dt, off) in TENSOR_DTYPE.fields.items()}


def _node_field_diffs(o, n, differ: frozenset | set):
    """Field paths of the node struct that differ, in struct (byte) order; a field none of whose words
    is in `differ` (the record's differing words) is equal and not compared."""
    for f in TENSOR_DTYPE.names:
        if f == "padding" or differ.isdisjoint(_FIELD_WORDS[f]):
            continue
        ov, nv = o[f], n[f]
        if f in ("ne", "nb", "op_params", "src"):
            for k in np.flatnonzero(ov != nv):
                yield f"{f}[{k}]", ov[k], nv[k]
        elif ov != nv:
            yield f, ov, nv


def is_device_address(path: str) -> bool:
    """Snapshot fields that hold device memory or buffer handles (they depend on the driver's allocator)."""
    return path in ("data", "buffer", "extra") or path.endswith("].data")


def first_field_diff(old: np.ndarray, new: np.ndarray, i: int) -> FieldDiff:
    """The field of node i that forced the update: the first differing field in snapshot order (struct
    fields, then sources' data/ne/nb), preferring one that is not a device address — an address that moved
    is the consequence of the shape change beside it, and addresses are the allocator's, not the graph's.
    Among addresses `data` goes before `buffer`: a moved buffer always moves `data`, but whether a buffer
    freed and reallocated bigger keeps its base is the allocator's choice (on the H200 it kept it, where the
    simulator's bump allocator moves it), so naming `data` decides the same on both drivers.
    Only implicit padding differing is reported as "padding" (memcmp sees it too)."""
    n = new[i]
    name = n["node"]["name"].decode(errors="replace")
    op = Op(int(n["node"]["op"])).name
    diffs = all_field_diffs(old, new, i)
    if not diffs:
        return FieldDiff(i, name, op, "padding", "", "")
    path, ov, nv = next((d for d in diffs if not is_device_address(d[0])),
                        next((d for d in diffs if d[0] != "buffer"), diffs[0]))
    return FieldDiff(i, name, op, path, ov, nv)


def all_field_diffs(old: np.ndarray, new: np.ndarray, i: int) -> list[tuple[str, str, str]]:
    """Every differing field path of node i, with old and new values (for diff reports)."""
    o, n = old[i], new[i]
    ow, nw = (np.frombuffer(r.tobytes(), np.uint64) for r in (o, n))
    differ = set(np.flatnonzero(ow != nw).tolist())
    out = [(p, _fmt(p, ov), _fmt(p, nv)) for p, ov, nv in _node_field_diffs(o["node"], n["node"], differ)]
    for j in range(MAX_SRC):
        if differ.isdisjoint((_P_DATA + j, *range(_P_NE + 4 * j, _P_NE + 4 * j + 4),
                              *range(_P_NB + 4 * j, _P_NB + 4 * j + 4))):
            continue                # this source's data, ne and nb are all equal
        if o["src_data"][j] != n["src_data"][j]:
            p = f"src[{j}].data"
            out.append((p, _fmt(p, o["src_data"][j]), _fmt(p, n["src_data"][j])))
        for fld in ("ne", "nb"):
            ov, nv = o[f"src_{fld}"][j], n[f"src_{fld}"][j]
            out += [(f"src[{j}].{fld}[{k}]", str(int(ov[k])), str(int(nv[k]))) for k in np.flatnonzero(ov != nv)]
    return out

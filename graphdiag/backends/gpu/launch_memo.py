"""Lowered launches remembered by what they are computed from, so a rebuilt graph's unchanged nodes are not
lowered again (a prefill's graph is new every time, as n_kv grows, but most of its nodes are not).

The key of a node group (a node, or a fused group) is its fusion pattern and, per node of the group, its
arena slot, its whole struct except the three device addresses (`data`, `buffer`, `extra`), and for each of
its MAX_SRC sources the source's type, ne and nb (zeros for none). The key is complete: lower_node reads
the group's op, type, ne, nb, op_params, names (the label) and source pointers, compares source pointers
with the group's own slots (which tensor is the residual), and reads its sources' type, ne and nb — kernel
choice, scalars and geometry (geometry.py reads only ne and ip) depend on nothing else, and cc is fixed
per backend (and so is each launch's PDL, remembered with it). What it leaves out, device addresses, enters a launch only as the `data` of the descriptors
of the tensors it describes: a remembered launch keeps those (descriptor slot, struct slot) pairs and a
hit writes those descriptors' `data` afresh from the current structs. A hit makes new Launch and op objects
(no mutable state is shared between graphs); they are prepared on the driver as a lowered op always is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir.arena import MAX_SRC
from ...ir.graph import Graph
from .. import abi
from ..drivers.base import Launch
from .descriptors import _DESC, _S_DATA, _S_NE, _SW, source_slots, struct_words
from .lowering import KernelOp, ScratchLaunchesOp, op_launches

_ADDRESS_WORDS = (1, 31, 40)                   # buffer, data, extra in ggml_tensor
_SRC_WORDS = np.array([0, *range(_S_NE, _S_NE + 8)], np.intp)   # type (with its padding), ne, nb
_KEY_WORDS = 1 + _SW + MAX_SRC * len(_SRC_WORDS)
KEY_BYTES = 8 * _KEY_WORDS                     # per node


def key_rows(graph: Graph, lo: int = 0, hi: int | None = None) -> bytes:
    """Each node's part of a key (KEY_BYTES each, in node order) for the graph's nodes lo..hi, by one gather
    over the arena."""
    arena, nodes = graph.arena, graph.nodes[lo:hi]
    n = len(nodes)
    words = struct_words(arena)
    k = np.zeros((n, _KEY_WORDS), np.uint64)
    k[:, 0] = nodes
    k[:, 1 : 1 + _SW] = words[nodes]
    for w in _ADDRESS_WORDS:
        k[:, 1 + w] = 0
    src, null = source_slots(arena, nodes)
    s = np.take(words.reshape(-1), (src * _SW)[:, :, None] + _SRC_WORDS)      # (n, MAX_SRC, 9)
    s[null] = 0
    k[:, 1 + _SW :] = s.reshape(n, -1)
    return k.tobytes()


@dataclass
class _Remembered:
    scratch: bool                  # a ScratchLaunchesOp (else a KernelOp)
    launches: tuple                # (kernel, params bytes, grid, block, shmem, ([data word], [struct slot]))
    slots: tuple = ()              # ScratchLaunchesOp: the scratch (descriptor, offset) pairs of each launch
    nbytes: int = 0
    last: object = None            # the op made last from this entry (its launches' handles may serve again)


class LaunchMemo:
    """A backend's remembered lowerings. Bounded: cleared when it holds CAP groups (the next graphs fill it
    again), so a run whose shapes keep changing does not grow it without end."""

    CAP = 4096                     # groups (~3 KB each with their key): about 15 distinct graphs

    def __init__(self):
        self.entries: dict[tuple, _Remembered] = {}
        self.hits = self.misses = 0

    def lookup(self, key: tuple) -> "_Remembered | None":
        """What is remembered under `key` (None: nothing); `build` makes ops of it."""
        got = self.entries.get(key)
        if got is None:
            self.misses += 1
        else:
            self.hits += 1
        return got

    @staticmethod
    def build(found: list, arena) -> list:
        """New ops for remembered groups (in order): every launch's params are the remembered bytes, one
        record each of one array, with the `data` of each descriptor it took from a struct read from that
        struct now (its type, ne and nb are in the key, hence as remembered)."""
        launches = [la for got in found for la in got.launches]
        params = np.frombuffer(bytearray(b"".join(la[1] for la in launches)), abi.KPARAMS)
        rows: list[int] = []
        words: list[int] = []
        slots: list[int] = []
        for r, la in enumerate(launches):
            at, idx = la[5]
            rows += [r] * len(at)
            words += at
            slots += idx
        if rows:
            record_words = params.view(np.uint64).reshape(len(launches), abi.KPARAMS.itemsize // 8)
            record_words[rows, words] = struct_words(arena)[slots, _S_DATA]
        ops, r = [], 0
        for got in found:
            made = []
            for kernel, _, grid, block, shmem, _, pdl in got.launches:
                made.append(Launch(kernel, grid, block, params[r, ...], shmem, pdl=pdl))
                r += 1
            op = ScratchLaunchesOp(made, list(got.slots), got.nbytes) if got.scratch else KernelOp(made[0])
            _take_prepared(op, got.last)
            got.last = op
            ops.append(op)
        return ops

    def put(self, key: tuple, op, described: list) -> None:
        """Remember `op`, just lowered (not yet run), whose launches wrote the descriptors `described`."""
        if type(op) is ScratchLaunchesOp:
            got = _Remembered(True, (), tuple(op.slots), op.nbytes)
        elif type(op) is KernelOp:
            got = _Remembered(False, ())
        else:
            return                 # the sorted MUL_MAT_ID fallback reads the ids at run time: not a pure value
        launches = op_launches(op)
        if len(launches) != len(described):
            return
        if len(self.entries) >= self.CAP:
            self.entries.clear()
        rows = tuple((la.kernel, la.params.tobytes(), la.grid, la.block, la.shmem,
                      ([slot * _DESC // 8 for slot, _ in refs], [idx for _, idx in refs]), la.pdl)
                     for la, refs in zip(launches, described))
        self.entries[key] = _Remembered(got.scratch, rows, got.slots, got.nbytes, op)


def _take_prepared(op, last) -> None:
    """Give `op` (just made from the memo, not prepared) the driver handles of `last`, the op made before it
    from the same entry, where every launch's params are byte for byte what `last`'s were when prepared:
    a prepared handle is a private snapshot of its params, so it serves any launch with the same bytes.
    An eager step rebuilds its graph at the same addresses each time, so its launches are packed once,
    not once a step (about 4 µs each in Python, as much as the launch itself). A scratch op also takes the
    buffer address its launches were packed with; the pool handing it another re-packs them, as ever."""
    if last is None or not last.ready or type(last) is not type(op):
        return
    new, old = op_launches(op), op_launches(last)
    if type(op) is ScratchLaunchesOp:
        if not last.addr:
            return
        for launch, places in zip(new, op.slots):
            for slot, off in places:
                launch.params["t"][slot]["data"] = last.addr + off
    for a, b in zip(new, old):
        if b.handle is None or a.params.tobytes() != b.params.tobytes():
            return
    for a, b in zip(new, old):
        a.handle = b.handle
    if type(op) is ScratchLaunchesOp:
        op.addr = last.addr
    op.ready = True

"""Kernel test cases: inputs, views, poisoned outputs and a comparison, runnable on any "device".

A `Case` owns host byte buffers (inputs filled from a seeded generator, the destination poisoned with 0xFF:
NaN for F32/F16, -1 for I32) and descriptors into them (offset, type, ne, nb: views and strided layouts
included). `Case.run(dev)` places the buffers on a device, launches the kernel once with the geometry of
graphdiag.backends.geometry and returns the destination buffer's bytes. Devices: `SimDevice` (simulated
memory + graphdiag.backends.sim_kernels, the reference) and the GPU device in test_kernels.py.

`compare()` checks the destination view numerically (NaN positions equal, bound relative to the largest
reference magnitude) and every byte outside the view exactly: a kernel must not write past its view.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from graphdiag.backends.abi import Q8_1, Q8_1_BYTES, new_params, set_desc
from graphdiag.backends.geometry import launch_geometry
from graphdiag.backends.sim_kernels import quantize_q8_1, run_kernel
from graphdiag.ir.build import contiguous_nb
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.ir.dtypes import NUMPY
from graphdiag.memory import AddressSpace, dequantize_q8_0, quantize_q8_0

# Bounds, as a fraction of max |reference|, set from errors measured on the H200 (2 runs, identical figures).
# The simulator dequantises the same F16 / Q8_0 bytes exactly, so weight types do not widen the bound: only
# the summation order differs (warp-shuffle trees vs numpy's pairwise / BLAS order).
F32_DOT = 2e-6     # dot products, any weight type, K <= 2048; measured <= 7.5e-7 (flash_attn, mul_mat)
F32_ELEM = 1e-6    # norms, softmax, silu: measured <= 1.4e-7; add/mul/get_rows/copies are exact (0)
ROPE = 1e-5        # positions < 100: theta's float32 rounding grows with the position; measured 2.5e-6
ROPE_SINCOS = 2e-6  # theta exact (pos * 1) up to 2^17: the kernel's sin/cos alone (~5e-7 expected)
F16_OUT = 1e-3     # F16 results: one F16 ulp (2^-10) of the largest value; measured 0 (same rounding)
FA_MMA = 1e-4     # tensor-core attention: the twin rounds q and p to F16 as the kernel does; sum order, exp ulps
TC_DOT = 1e-5      # tensor-core F32 accumulation (not IEEE round-to-nearest per add) vs numpy; K <= 256


@dataclass(frozen=True)
class Desc:
    buf: int
    off: int
    type: int
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]


@dataclass
class Case:
    kernel: str
    id: str
    bound: float = F32_ELEM
    bufs: list[np.ndarray] = field(default_factory=list)
    slots: list[Desc | None] = field(default_factory=list)
    ip: tuple = ()
    fp: tuple = ()
    out: int = 0      # the slot compared: the destination, or another buffer the kernel writes (partials)
    # ip index -> a tensor whose device address goes into ip[index] (low 32 bits) and ip[index + 1] (high):
    # the experts' gate bias of mul_mat_id_vec_glu_* (kernels.py _GATE_BIAS_IP)
    ip_addr: dict = field(default_factory=dict)

    def __post_init__(self):
        self.rng = np.random.default_rng(zlib.crc32(f"{self.kernel}/{self.id}".encode()))

    # -- building -------------------------------------------------------------------------------------
    def put(self, t: G, values: np.ndarray) -> Desc:
        """A contiguous tensor from `values` shaped (ne3, ne2, ne1, ne0) (any leading dims may be omitted)."""
        values = np.asarray(values)
        shape = (1,) * (4 - values.ndim) + values.shape
        ne = tuple(int(x) for x in shape[::-1])
        if t == G.Q8_0:
            data = quantize_q8_0(values.astype(np.float32)).tobytes()
        else:
            data = values.astype(NUMPY[t]).tobytes()
        self.bufs.append(np.frombuffer(data, np.uint8).copy())
        return Desc(len(self.bufs) - 1, 0, int(t), ne, contiguous_nb(t, ne))

    def q8_1(self, *ne, pad_blocks: int = 0) -> Desc:
        """Standard-normal x (ne, innermost first) quantised to Q8_1 blocks, as quantize_q8_1 writes them;
        `pad_blocks` spare blocks at the end of every row (a strided view)."""
        x = self.rng.standard_normal(ne[::-1]).astype(np.float32)
        q = quantize_q8_1(x)
        if pad_blocks:
            q = np.concatenate([q, np.zeros(q.shape[:-1] + (pad_blocks,), q.dtype)], axis=-1)
        self.bufs.append(np.frombuffer(q.tobytes(), np.uint8).copy())
        ne4 = tuple(ne) + (1,) * (4 - len(ne))
        row = Q8_1_BYTES * (ne4[0] // 32 + pad_blocks)
        return Desc(len(self.bufs) - 1, 0, Q8_1, ne4, (Q8_1_BYTES, row, row * ne4[1], row * ne4[1] * ne4[2]))

    def randn(self, t: G, *ne, scale: float = 1.0) -> Desc:
        """Standard-normal values of shape ne (innermost first)."""
        return self.put(t, scale * self.rng.standard_normal(ne[::-1]).astype(np.float32))

    def ints(self, values, ne=None) -> Desc:
        a = np.asarray(values, np.int32)
        return self.put(G.I32, a if ne is None else a.reshape(ne[::-1]))

    def output(self, t: G, *ne, nbytes: int | None = None) -> Desc:
        """A poisoned (0xFF) contiguous destination; `nbytes` makes the buffer larger (for views)."""
        ne4 = tuple(ne) + (1,) * (4 - len(ne))
        if t == Q8_1:
            row = Q8_1_BYTES * (ne4[0] // 32)
            nb = (Q8_1_BYTES, row, row * ne4[1], row * ne4[1] * ne4[2])
        else:
            nb = contiguous_nb(t, ne4)
        self.bufs.append(np.full(nbytes or nb[3] * ne4[3], 0xFF, np.uint8))
        return Desc(len(self.bufs) - 1, 0, int(t), ne4, nb)

    @staticmethod
    def view(d: Desc, ne, nb, off: int = 0, t: int | None = None) -> Desc:
        ne4 = tuple(ne) + (1,) * (4 - len(ne))
        nb4 = tuple(nb) + (nb[-1] * ne4[len(nb) - 1],) * (4 - len(nb))
        return Desc(d.buf, d.off + off, d.type if t is None else t, ne4, nb4)

    def set(self, *slots: Desc | None, ip=(), fp=()) -> "Case":
        self.slots, self.ip, self.fp = list(slots), tuple(ip), tuple(fp)
        return self

    # -- running --------------------------------------------------------------------------------------
    def params(self, addrs: list[int]) -> np.ndarray:
        p = new_params()
        for i, d in enumerate(self.slots):
            if d is not None:
                set_desc(p, i, addrs[d.buf] + d.off, d.type, d.ne, d.nb)
        p["ip"][: len(self.ip)] = self.ip
        p["fp"][: len(self.fp)] = self.fp
        for k, d in self.ip_addr.items():
            a = addrs[d.buf] + d.off
            p["ip"][k], p["ip"][k + 1] = (np.array([a & 0xFFFFFFFF, a >> 32], np.uint32).view(np.int32))
        return p

    def run(self, dev) -> np.ndarray:
        """Bytes of the compared buffer (the destination's, or slot `out`'s) after one launch on `dev`."""
        addrs = [dev.alloc(len(b)) for b in self.bufs]
        try:
            for a, b in zip(addrs, self.bufs):
                dev.write(a, b)
            dev.run(self.kernel, self.params(addrs))
            d = self.slots[self.out]
            return dev.read(addrs[d.buf], len(self.bufs[d.buf]))
        finally:
            for a in addrs:
                dev.free(a)


def expert_map(c: Case, ids: np.ndarray, n_expert: int) -> tuple[Desc, Desc]:
    """mm_ids_helper's output for ids (T, n_used), as inputs of mul_mat_id_q_* / mul_mat_id_f_*: the map
    I32 (2, P) of (slot, token) pairs expert by expert (tokens in order) and the bounds I32 (E + 1)."""
    flat = np.asarray(ids, np.int32).reshape(-1)
    n_used = np.asarray(ids).shape[-1]
    order = np.argsort(flat, kind="stable")
    pairs = np.stack([order % n_used, order // n_used], axis=1)
    bounds = np.searchsorted(flat[order], np.arange(n_expert + 1))
    return c.ints(pairs, (2, len(pairs))), c.ints(bounds, (n_expert + 1,))


class SimDevice:
    """Simulated device memory running graphdiag.backends.sim_kernels (the reference)."""

    def __init__(self):
        self.space = AddressSpace(0x7F00_0000_0000, name="sim-ref")

    def alloc(self, n):
        return self.space.alloc(n)

    def free(self, a):
        self.space.free(a)

    def write(self, a, b):
        self.space.bytes(a, len(b))[...] = b

    def read(self, a, n):
        return self.space.bytes(a, n).copy()

    def run(self, name, params):
        launch_geometry(name, params)   # every case must have a valid geometry
        run_kernel(self.space, name, params)


def _elements(buf: np.ndarray, d: Desc) -> tuple[np.ndarray, np.ndarray]:
    """(values of the view as float64 / int, byte mask of the bytes the view covers). Q8_1 blocks compare
    as their 9 32-bit words, exactly."""
    if d.type == Q8_1:
        d = Desc(d.buf, d.off, int(G.I32), (d.ne[0] // 32 * 9,) + d.ne[1:], (4,) + d.nb[1:])
    space = AddressSpace(0x1000)
    base = space.alloc(len(buf))
    space.bytes(base, len(buf))[...] = buf
    vals = space.ndarray(base + d.off, d.type, d.ne, d.nb)
    covered = np.zeros(len(buf), bool)
    idx = np.full(vals.shape, d.off, np.int64)
    for axis, (n, stride) in enumerate(zip(vals.shape, d.nb[::-1])):
        idx += (np.arange(n) * stride).reshape([n if a == axis else 1 for a in range(4)])
    covered[(idx.reshape(-1)[:, None] + np.arange(vals.dtype.itemsize)).reshape(-1)] = True
    if d.type == G.Q8_0:   # a Q8_0 destination (rng_fill_q8_0): compared dequantised (poison: NaN scales)
        return dequantize_q8_0(vals).astype(np.float64), covered
    if d.type == G.I32:
        return vals.astype(np.int64), covered
    return vals.astype(np.float64), covered


def compare(case: Case, ref: np.ndarray, got: np.ndarray, check_bound: bool = True) -> float:
    """Asserts `got` matches `ref` (destination buffers); returns the error as a fraction of max |ref|
    (checked against case.bound unless `check_bound` is False: then the caller records it first)."""
    d = case.slots[case.out]
    r, covered = _elements(ref, d)
    g, _ = _elements(got, d)
    outside = np.nonzero((ref != got) & ~covered)[0]
    assert outside.size == 0, f"{case.kernel}[{case.id}]: {outside.size} bytes written outside the view " \
                              f"(first at byte {outside[0]})"
    if d.type in (G.I32, Q8_1):
        bad = np.argwhere(r != g)
        assert bad.size == 0, f"{case.kernel}[{case.id}]: {len(bad)} indices differ, first at {bad[0]}: " \
                              f"{g[tuple(bad[0])]} != {r[tuple(bad[0])]}"
        return 0.0
    nan_r, nan_g = np.isnan(r), np.isnan(g)
    bad = np.argwhere(nan_r != nan_g)
    assert bad.size == 0, f"{case.kernel}[{case.id}]: NaN/poison mismatch at {bad[0]} (ref {r[tuple(bad[0])]}, " \
                          f"got {g[tuple(bad[0])]}): an element unwritten or wrongly written"
    fin = ~nan_r
    assert np.array_equal(np.isinf(r[fin]), np.isinf(g[fin])), f"{case.kernel}[{case.id}]: infinities differ"
    rf, gf = np.nan_to_num(r[fin], posinf=0, neginf=0), np.nan_to_num(g[fin], posinf=0, neginf=0)
    scale = max(float(np.abs(rf).max(initial=0.0)), 1e-30)
    err = float(np.abs(gf - rf).max(initial=0.0)) / scale
    assert not check_bound or err <= case.bound, \
        f"{case.kernel}[{case.id}]: error {err:.3g} of max|ref| {scale:.3g} exceeds the bound {case.bound:.3g}"
    return err

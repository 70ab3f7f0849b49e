"""Launch geometry of every catalogue kernel, computed from its KPARAMS record alone.

`launch_geometry(name, params) -> (grid, block, shmem)`: grid and block as (x, y, z), dynamic shared memory
in bytes. The lowering calls it for every launch, for the CUDA and the simulated driver alike, so the
numbers here must match what kernels/*.cu assume (named constants below, one per kernel family).
Pure Python on the descriptors' ne and the ip scalars: testable without a GPU.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .kernels import KERNELS

Dim3 = tuple[int, int, int]
Geometry = tuple[Dim3, Dim3, int]

MMV_WARPS = 4            # mul_mat_vec*.cu: one warp per weight row, 4 rows per block
MMV_BLOCK = 32 * MMV_WARPS
TILE = 16                # mul_mat.cu: 16x16 output tile per 256-thread block
ELEMENTWISE_BLOCK = 256  # element-wise / rope kernels: one thread per element or pair, grid-stride loop
MAX_GRID_X = 1 << 20     # cap on grid-stride grids: plenty of blocks to fill 132 SMs, no overflow
GRID_YZ_MAX = 65535      # CUDA's limit on grid.y and grid.z
FA_BLOCK = 128           # flash_attn.cu
TOPK_BLOCK = 128         # top_k.cu
TOPK_SHMEM_MAX = 49152   # top_k.cu stages the row in shmem up to this many bytes (the default limit)


def _ne(p: np.ndarray, slot: int) -> list[int]:
    return [int(x) for x in p["t"][slot]["ne"]]


def _cdiv(a: int, b: int) -> int:
    return max(1, -(-a // b))   # at least one block: empty work still launches a valid (idle) grid


def _row_block(n: int) -> int:
    """Threads for a one-block-per-row kernel striding over n elements: a warp for short rows, else
    enough warps for ~4+ elements per thread, at most 256."""
    if n <= 128:
        return 32
    return 128 if n <= 1024 else 256


def _check_yz(name: str, grid: Dim3) -> Dim3:
    if grid[1] > GRID_YZ_MAX or grid[2] > GRID_YZ_MAX:
        raise ValueError(f"{name}: grid {grid} exceeds CUDA's 65535 limit on y/z")
    return grid


def _mmv(p) -> Geometry:
    d = _ne(p, 0)
    return (_cdiv(d[0], MMV_WARPS), max(d[2] * d[3], 1), 1), (MMV_BLOCK, 1, 1), 0


def _mmv_id(p) -> Geometry:
    d = _ne(p, 0)   # (M, n_used, T)
    return (_cdiv(d[0], MMV_WARPS), max(d[1], 1), max(d[2], 1)), (MMV_BLOCK, 1, 1), 0


def _mmv_gathered(p) -> Geometry:
    d = _ne(p, 0)
    rows = int(p["ip"][1])
    return (_cdiv(d[0], MMV_WARPS), max(rows, 1), 1), (MMV_BLOCK, 1, 1), 0


def _mm(p) -> Geometry:
    d = _ne(p, 0)
    return (_cdiv(d[0], TILE), _cdiv(d[1], TILE), max(d[2] * d[3], 1)), (TILE * TILE, 1, 1), 0


def _per_row(slot: int) -> Callable[[np.ndarray], Geometry]:
    """One block per row (ne1, ne2, ne3) of the tensor in `slot`, threads over its ne0."""
    def geom(p) -> Geometry:
        n = _ne(p, slot)
        return (max(n[1], 1), max(n[2], 1), max(n[3], 1)), (_row_block(n[0]), 1, 1), 0
    return geom


def _elementwise(slot: int, per: int = 1) -> Callable[[np.ndarray], Geometry]:
    """One thread per element of `slot` (or per `per` elements of ne0), grid-stride loop."""
    def geom(p) -> Geometry:
        n = _ne(p, slot)
        total = (n[0] // per) * n[1] * n[2] * n[3]
        return (min(_cdiv(total, ELEMENTWISE_BLOCK), MAX_GRID_X), 1, 1), (ELEMENTWISE_BLOCK, 1, 1), 0
    return geom


def _flash_attn(p) -> Geometry:
    q = _ne(p, 1)   # (D, H, T, B)
    return (max(q[1], 1), max(q[2], 1), max(q[3], 1)), (FA_BLOCK, 1, 1), 4 * q[0]


def _top_k(p) -> Geometry:
    x = _ne(p, 1)
    shmem = 4 * x[0] if 4 * x[0] <= TOPK_SHMEM_MAX else 0
    return (max(x[1], 1), max(x[2], 1), max(x[3], 1)), (TOPK_BLOCK, 1, 1), shmem


def _table() -> dict[str, Callable[[np.ndarray], Geometry]]:
    t: dict[str, Callable[[np.ndarray], Geometry]] = {}
    for w in ("f32", "f16", "q8_0"):
        t[f"get_rows_{w}"] = _per_row(0)
        t[f"mul_mat_vec_{w}"] = _mmv
        t[f"mul_mat_vec_glu_{w}"] = _mmv
        t[f"mul_mat_vec_add_{w}"] = _mmv
        t[f"mul_mat_{w}"] = _mm
        t[f"mul_mat_id_vec_{w}"] = _mmv_id
        t[f"mul_mat_id_gathered_{w}"] = _mmv_gathered
    t.update({
        "rms_norm_f32": _per_row(1), "rms_norm_mul_f32": _per_row(1), "soft_max_f32": _per_row(1),
        "mul_f32": _elementwise(0), "add_f32": _elementwise(0), "glu_swiglu_f32": _elementwise(0),
        "cpy_f32_f32": _elementwise(1), "cpy_f32_f16": _elementwise(1),
        "rope_f32": _elementwise(1, per=2),
        "set_rows_f16": _elementwise(1), "set_rows_f32": _elementwise(1),
        "flash_attn_ext_f16": _flash_attn, "top_k_f32": _top_k,
        # rng.cu: one thread per element (Q8_0: a warp per 32-block, the same thread count)
        **{f"rng_fill_{w}": _elementwise(0) for w in ("f32", "f16", "q8_0")},
    })
    # rope_set_rows walks x's (D/2, Hkv, T) pairs; its ne3 is 1 by the catalogue.
    t["rope_set_rows_f16"] = _elementwise(1, per=2)
    return t


_GEOMETRY = _table()
assert set(_GEOMETRY) == set(KERNELS), sorted(set(KERNELS) ^ set(_GEOMETRY))


def launch_geometry(name: str, params: np.ndarray) -> Geometry:
    """(grid, block, shmem bytes) for launching kernel `name` with the 0-d KPARAMS record `params`."""
    try:
        geom = _GEOMETRY[name]
    except KeyError:
        raise KeyError(f"no launch geometry for kernel {name!r}") from None
    grid, block, shmem = geom(params)
    return _check_yz(name, grid), block, shmem

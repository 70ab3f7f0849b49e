"""Launch geometry of every catalogue kernel, computed from its KPARAMS record alone.

`launch_geometry(name, params) -> (grid, block, shmem)`: grid and block as (x, y, z), dynamic shared memory
in bytes. The lowering calls it for every launch, for the CUDA and the simulated driver alike, so the
numbers here must match what kernels/*.cu assume (named constants below, one per kernel family).
Pure Python on the descriptors' ne and the ip scalars: testable without a GPU.
"""

from __future__ import annotations

import struct
from typing import Callable

import numpy as np

from .abi import KPARAMS, TDESC
from .gpu.compat import CC_ADA, CC_TURING
from ..ir.dtypes import GGMLType
from .kernels import (FA_HEAD_DIMS, FAV_GROUPS, KERNELS, MMID_F_TYPES, MMID_Q_TYPES, X_TYPES, fa_direct_kernel,
                      fa_mma_kernel, fa_vec_kernel, fav_groups)

Dim3 = tuple[int, int, int]
Geometry = tuple[Dim3, Dim3, int]

MMV_WARPS = 4            # mul_mat_vec*.cu: one warp per weight row, 4 rows per block
MMV_BLOCK = 32 * MMV_WARPS
MMV_RESIDENT_WARPS = 132 * 8 * MMV_WARPS   # an H200 holds 8 mat-vec blocks per SM (launch bounds 128, 8)
MMV_STEP = 1024          # elements of a row one warp step loads (32 lanes x 8 halves x MMV_ILP 4)
TILE = 16                # mul_mat.cu mul_mat_f32: 16x16 output tile per 256-thread block
MM_BM, MM_BN = 128, 64   # mul_mat.cu tensor-core kernels (f16, q8_0): 128 x 64 output tile, 256 threads
MM_BLOCK = 256
MM_BK_P, MM_STAGES = 64, 3   # mul_mat_f16's pipelined path: W in three k tiles of 64 in flight (dynamic shmem)
QUANT_WARPS = 8          # quantize.cu: one warp per 32-block, 8 warps per block
ELEMENTWISE_BLOCK = 256  # element-wise kernels: one thread per element, grid-stride loop
MAX_GRID_X = 1 << 20     # cap on grid-stride grids: plenty of blocks to fill 132 SMs, no overflow
GRID_YZ_MAX = 65535      # CUDA's limit on grid.y and grid.z
FA_SUB = 32              # a split's chunk of positions is a multiple of this (the decode kernels' tile)
FA_MAX_ROWS = 32         # query heads per kv head the lowering takes (GQA groups beyond are refused)
FA_COMBINE_HEADS = 4     # flash_attn_combine_f32: heads per block in a batch (prefill)
FA_COMBINE_MIN_ROWS = 64 # ... from this many (token x batch) rows
FA_TARGET_BLOCKS = 264   # splits are added until about 2 blocks per SM of an H200 (132 SMs)
FAV_THREADS = 128        # flash_attn.cu flash_attn_vec_f16_d*_g*: one token per block, 128 threads, tiles of 32
FAVD_THREADS = 512       # flash_attn.cu flash_attn_vec_direct_f16_d*: one query head per block
FAV_TILE = 32
FAV_MAX_G = 8            # query heads per kv head the vec kernel takes
FAV_MAX_TOKENS = 8       # the vec kernel serves batches up to ggml's mat-vec bound (decode)
FAM_ROWS = 64            # flash_attn.cu flash_attn_mma_f16_d*: 64 query rows (token x head) per block,
FAM_KV = 64              # K/V tiles of 64 positions in shared memory, 128 threads (4 warps of 16 rows)
FAM_THREADS = 128
RMS_MAX_BLOCK = 1024     # norm.cu rms_norm*: n / 16 threads per row (RMS_V float4s each), 32 to this many
RMS_V = 4                # norm.cu RMS_V: float4s per thread in the fast path
TOPK_BLOCK = 128         # top_k.cu
TOPK_SHMEM_MAX = 49152   # top_k.cu stages the row in shmem up to this many bytes (the default limit)


# The geometry functions read a KPARAMS record's bytes (`p`: bytes, bytearray or memoryview), one unpack_from
# per field, rather than numpy field views of the record.
_NE4 = struct.Struct("<4q")
_I32 = struct.Struct("<i")
_DESC, _NE_AT, _IP_AT = TDESC.itemsize, TDESC.fields["ne"][1], KPARAMS.fields["ip"][1]
_TYPE_AT = TDESC.fields["type"][1]


def _ne(p, slot: int) -> tuple[int, int, int, int]:
    return _NE4.unpack_from(p, slot * _DESC + _NE_AT)


def _type(p, slot: int) -> int:
    return _I32.unpack_from(p, slot * _DESC + _TYPE_AT)[0]


def _ip(p, i: int) -> int:
    return _I32.unpack_from(p, _IP_AT + 4 * i)[0]


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


def mmv_warps_per_row(m: int, k: int) -> int:
    """Warps sharing one weight row of a one-column mul_mat_vec(_add) (1, 2 or 4): doubled while the warps
    of all rows stay within what the GPU holds at once and each part keeps one full step of loads in
    flight (MMV_STEP elements) — the K/V and output projections of 1b, whose 512 / 2048 rows alone leave
    most of the HBM round trip idle. The kernels derive rows per block from it (4 / warps per row)."""
    w = 1
    while w < MMV_WARPS and m * w * 2 <= MMV_RESIDENT_WARPS and k // (w * 2) >= MMV_STEP:
        w *= 2
    return w


def _mmv(p) -> Geometry:
    d = _ne(p, 0)
    rows = MMV_WARPS // max(_ip(p, 1), 1) if d[1] == 1 else MMV_WARPS
    return (_cdiv(d[0], rows), max(d[2] * d[3], 1), 1), (MMV_BLOCK, 1, 1), 0


def _mmv_id(p) -> Geometry:
    d = _ne(p, 0)   # (M, n_used, T)
    return (_cdiv(d[0], MMV_WARPS), max(d[1], 1), max(d[2], 1)), (MMV_BLOCK, 1, 1), 0


def _mmid_sorted(p) -> Geometry:
    """mul_mat_id_q_* / mul_mat_id_f_*: a warp per row m, 4 rows a block; a block row per expert of t[1]
    (E = its ne[2]); grid z the k parts of ip[0]."""
    d, w = _ne(p, 0), _ne(p, 1)
    return (_cdiv(d[0], MMV_WARPS), max(w[2], 1), max(_ip(p, 0), 1)), (MMV_BLOCK, 1, 1), 0


def _mm_ids_helper(p) -> Geometry:
    """moe.cu mm_ids_helper: one warp per expert (the bounds t[2] hold E + 1)."""
    return (max(_ne(p, 2)[0] - 1, 1), 1, 1), (32, 1, 1), 0


def _mmv_gathered(p) -> Geometry:
    d = _ne(p, 0)
    rows = _ip(p, 1)
    return (_cdiv(d[0], MMV_WARPS), max(rows, 1), 1), (MMV_BLOCK, 1, 1), 0


def _mm(p) -> Geometry:
    """The CUDA-core tiles: one 256-thread block per 16 x 16 output tile per batch per k part (ip[0])."""
    d = _ne(p, 0)
    return (_cdiv(d[0], TILE), _cdiv(d[1], TILE), max(d[2] * d[3], 1) * max(_ip(p, 0), 1)), (TILE * TILE, 1, 1), 0


def _per_row(slot: int) -> Callable[[np.ndarray], Geometry]:
    """One block per row (ne1, ne2, ne3) of the tensor in `slot`, threads over its ne0."""
    def geom(p) -> Geometry:
        n = _ne(p, slot)
        return (max(n[1], 1), max(n[2], 1), max(n[3], 1)), (_row_block(n[0]), 1, 1), 0
    return geom


def _rms_rows(p) -> Geometry:
    """rms_norm*: one block per row of x, RMS_V float4s of the row per thread (32..1024 threads, norm.cu).
    Small blocks (7b's 4096-wide row: 256 threads, not 1024) reduce with fewer warps and, under PDL, find
    room on an SM while the mat-vec ahead still drains: measured on the H200 (bench steps, replayed step's
    GPU time), 7b 4.52-4.54 -> 4.43-4.44 ms, 1b 1.154-1.168 -> 1.140-1.145 ms, tiny unchanged."""
    n = _ne(p, 1)
    quads = -(-n[0] // 4)
    threads = min(RMS_MAX_BLOCK, max(32, -(-quads // (RMS_V * 32)) * 32))
    return (max(n[1], 1), max(n[2], 1), max(n[3], 1)), (threads, 1, 1), 0


def _elementwise(slot: int, per: int = 1) -> Callable[[np.ndarray], Geometry]:
    """One thread per element of `slot` (or per `per` elements of ne0), grid-stride loop."""
    def geom(p) -> Geometry:
        n = _ne(p, slot)
        total = (n[0] // per) * n[1] * n[2] * n[3]
        return (min(_cdiv(total, ELEMENTWISE_BLOCK), MAX_GRID_X), 1, 1), (ELEMENTWISE_BLOCK, 1, 1), 0
    return geom


def _binary(p) -> Geometry:
    """add / mul / swiglu: a thread per 4 destination elements (the dense path takes a float4 each; the
    broadcast path's grid-stride loop covers any count). A thread per element left three blocks in four with
    nothing to do: a 1b prefill's swiglu (512 x 8192) launched 16384 blocks for 4096 blocks of work."""
    n = _ne(p, 0)
    total = n[0] * n[1] * n[2] * n[3]
    return (max(min(_cdiv(total, 4 * ELEMENTWISE_BLOCK), MAX_GRID_X), 1), 1, 1), (ELEMENTWISE_BLOCK, 1, 1), 0


def fa_vec(n_head: int, n_head_kv: int, n_tokens: int) -> bool:
    """Whether a FLASH_ATTN_EXT node takes a decode kernel flash_attn_vec_f16_d*_g* (one token per block)."""
    return n_tokens <= FAV_MAX_TOKENS and n_head // max(n_head_kv, 1) <= FAV_MAX_G


FATTN_KQ_STRIDE = 256      # ggml's KV padding the vec kernel and the GQA optimisation need (fattn-common.cuh)


def fa_takes_vec(head_dim: int, n_head: int, n_head_kv: int, n_kv: int, n_tokens: int, n_seq: int, cc: int) -> bool:
    """Whether a FLASH_ATTN_EXT node runs graphdiag's vec kernel: where upstream's ggml_cuda_get_best_fattn_kernel
    (0c1e57098; F16 K/V, a mask, no ALiBi) picks its vec kernel on GPUs with Turing's tensor cores — one token,
    and either cc >= 8.9 with one sequence (unless more than 4 query heads share a kv head at D >= 256 or n_kv
    >= 8192) or no GQA optimisation (fewer than 2 query heads a kv head) — and graphdiag's vec kernel takes the
    shape (fa_vec). From 2 tokens upstream runs its tensor-core kernel (flash_attn_ext_f16 and its stream-k
    fixup; recorded at 2 and 8 tokens on the H200 and H100, tests/data/llama/kernels-*.json), graphdiag its
    flash_attn_mma. Before Turing graphdiag keeps its own rule (fa_vec)."""
    if not fa_vec(n_head, n_head_kv, n_tokens):
        return False
    if cc < CC_TURING:
        return True
    if not (head_dim <= 256 and head_dim % 64 == 0 and n_kv % FATTN_KQ_STRIDE == 0) or n_tokens != 1:
        return False
    return _ada_vec(head_dim, n_head, n_head_kv, n_kv, n_tokens, n_seq, cc) or n_head // max(n_head_kv, 1) < 2


def _ada_vec(head_dim: int, n_head: int, n_head_kv: int, n_kv: int, n_tokens: int, n_seq: int, cc: int) -> bool:
    """Upstream's vec kernel on Ada and newer with F16 K/V: one token, one sequence, unless more than 4 query
    heads share a kv head at D >= 256 or n_kv >= 8192."""
    g = n_head // max(n_head_kv, 1)
    return n_tokens == 1 and n_seq == 1 and cc >= CC_ADA and not (g > 4 and (head_dim >= 256 or n_kv >= 8192))


def fa_direct(head_dim: int, n_head: int, n_head_kv: int, n_kv: int, n_tokens: int, n_seq: int, cc: int) -> bool:
    """Whether upstream's flash attention is one kernel with no combine (ggml-cuda 0c1e57098): its vec kernel
    (ggml_cuda_get_best_fattn_kernel at one token, one sequence, cc >= 8.9 with F16 K/V, unless more than 4
    query heads share a kv head at D >= 256 or n_kv >= 8192) runs with one parallel block when the KV range
    is one tile of D positions (launch_fattn: nbatch_fa = D, parallel_blocks <= ntiles_KV; more tiles always
    take more blocks while a decode's few tiles leave the GPU's SMs idle), and launch_fattn launches
    flash_attn_combine_results only for more than one. So D = 256 at n_kv 256 (Gemma 3's first 256 cells)
    is one kernel, and n_kv 512 two: a captured graph's topology changes there. The tensor-core path at
    more tokens keeps its stream-k fixup at these sizes (nbatch_fa 64 or 128 < n_kv): two kernels, as here."""
    return (_ada_vec(head_dim, n_head, n_head_kv, n_kv, n_tokens, n_seq, cc) and fa_vec(n_head, n_head_kv, n_tokens)
            and _cdiv(n_kv, head_dim) == 1)


def fa_mma_blocks(n_head: int, n_head_kv: int, n_tokens: int, n_batch: int = 1) -> int:
    """Blocks of a flash_attn_mma_f16 launch per split: kv heads x tiles of FAM_ROWS of their G * T rows."""
    return n_head_kv * _cdiv((n_head // max(n_head_kv, 1)) * n_tokens, FAM_ROWS) * n_batch


def fa_split(n_kv: int, other_blocks: int, max_split: int | None = None) -> tuple[int, int]:
    """(n_split, chunk): the KV range cut into n_split chunks of `chunk` positions (a multiple of 32), enough
    to bring other_blocks (kv heads x token tiles) to ~FA_TARGET_BLOCKS, at most max_split; none is empty."""
    want = max(1, -(-FA_TARGET_BLOCKS // max(other_blocks, 1)))
    n_split = max(1, min(_cdiv(n_kv, FA_SUB), want, max_split or want))
    chunk = _cdiv(_cdiv(n_kv, n_split), FA_SUB) * FA_SUB
    return _cdiv(n_kv, chunk), chunk


def fa_plan(head_dim: int, n_head: int, n_head_kv: int, n_kv: int, n_tokens: int, n_batch: int = 1,
            vec: bool | None = None):
    """(ip[1], n_split, chunk, scratch bytes) of one FLASH_ATTN_EXT node: ip[1] is 1 (one token per block)
    for the decode kernels, FAM_ROWS (query rows per block) for the tensor-core batch kernels.

    The pool request stays the size the attention scratch always had, 4 * n_kv * n_head * n_tokens bytes
    (what a capped pool is sized by): with more than one token the splits are capped so the partials
    (head_dim + 2 floats per split, head and token) fit in it; at one token (decode, where splits fill the
    GPU) the request grows to the partials when they are larger. `vec`: whether the vec kernel runs
    (fa_takes_vec; default: wherever it could, fa_vec)."""
    vec = fa_vec(n_head, n_head_kv, n_tokens) if vec is None else vec
    tq = 1 if vec else FAM_ROWS
    blocks = n_head_kv * n_tokens * n_batch if vec else fa_mma_blocks(n_head, n_head_kv, n_tokens, n_batch)
    rows = n_head * n_tokens * n_batch
    legacy = 4 * n_kv * rows
    cap = None if n_tokens == 1 else max(1, n_kv // (head_dim + 2))
    n_split, chunk = fa_split(n_kv, blocks, cap)
    return tq, n_split, chunk, max(legacy, 4 * (head_dim + 2) * n_split * rows)


def _flash_attn_vec(d: int, gm: int) -> Callable[[np.ndarray], Geometry]:
    """The geometry of flash_attn_vec_f16_d{d}_g{gm}; params of another head size or group are refused
    (the kernel would index its shared memory out of bounds), and so is one query head per block (ip[3]:
    flash_attn_vec_direct_f16_d{d}'s)."""
    pg = FAV_THREADS // (d // 8)
    shmem = 4 * (gm * d + gm * FAV_TILE + FAV_MAX_G + pg * gm * d)

    def geom(p) -> Geometry:
        q, k, part = _ne(p, 1), _ne(p, 2), _ne(p, 0)
        if q[0] != d or fav_groups(q[1] // max(k[1], 1)) != gm:
            raise ValueError(f"{fa_vec_kernel(d, gm)}: q head size {q[0]}, {q[1]}/{k[1]} heads do not match")
        if _ip(p, 3):
            raise ValueError(f"{fa_vec_kernel(d, gm)}: one query head per block is {fa_direct_kernel(d)}")
        splits = 1 if _ip(p, 2) else max(part[1], 1)      # ip[2]: one split written to the node (no combine)
        return (splits, max(k[1], 1), max(q[2] * q[3], 1)), (FAV_THREADS, 1, 1), shmem
    return geom


def _flash_attn_direct(d: int) -> Callable[[np.ndarray], Geometry]:
    """flash_attn_vec_direct_f16_d{d}: grid (1, H, T * B), FAVD_THREADS threads; it holds the scores of at
    most D positions (ip[0]) and needs ip[2] and ip[3] (one split, one query head per block)."""
    shmem = 4 * (d + (FAVD_THREADS // 32) * d + 32)     # scores, the warps' p . V, reductions

    def geom(p) -> Geometry:
        q, n_kv = _ne(p, 1), _ne(p, 2)[2]
        if q[0] != d:
            raise ValueError(f"{fa_direct_kernel(d)}: q head size {q[0]} does not match")
        if _type(p, 0) != GGMLType.F32 or _type(p, 1) != GGMLType.F32:
            raise ValueError(f"{fa_direct_kernel(d)}: reads Q and writes O as F32 (types {_type(p, 1)}, "
                             f"{_type(p, 0)})")
        if not (_ip(p, 2) and _ip(p, 3)) or not n_kv <= _ip(p, 0) <= d:
            raise ValueError(f"{fa_direct_kernel(d)}: takes one split of all n_kv = {n_kv} positions, at most {d}, "
                             f"and one query head per block (ip[0..3] = {_ip(p, 0)}, {_ip(p, 1)}, {_ip(p, 2)}, "
                             f"{_ip(p, 3)})")
        return (1, max(q[1], 1), max(q[2] * q[3], 1)), (FAVD_THREADS, 1, 1), shmem
    return geom


FAM_Q_SMEM_MIN_D = 256   # flash_attn.cu fa_mma's QS: from this head size Q stays in its own shared memory


def fa_mma_smem(d: int) -> int:
    """flash_attn_mma_f16_d{d}'s dynamic shared memory: two stages of K and V tiles (FAM_KV rows padded by 8
    halves), and from FAM_Q_SMEM_MIN_D the block's FAM_ROWS Q rows as F16 (its fragments are re-read per
    k-step there instead of held in registers): d = 256 takes 168960 bytes of the H200's 227 KB."""
    stages = 2 * 2 * FAM_KV * (d + 8) * 2
    return stages + (FAM_ROWS * (d + 8) * 2 if d >= FAM_Q_SMEM_MIN_D else 0)


def _flash_attn_mma(d: int) -> Callable[[np.ndarray], Geometry]:
    """flash_attn_mma_f16_d{d}: grid (n_split, Hkv, ceil(G * T / FAM_ROWS) * B); K and V tiles in shmem."""
    shmem = fa_mma_smem(d)

    def geom(p) -> Geometry:
        q, k, part = _ne(p, 1), _ne(p, 2), _ne(p, 0)
        if q[0] != d:
            raise ValueError(f"{fa_mma_kernel(d)}: q head size {q[0]} does not match")
        z = _cdiv((q[1] // max(k[1], 1)) * q[2], FAM_ROWS) * max(q[3], 1)
        return (max(part[1], 1), max(k[1], 1), z), (FAM_THREADS, 1, 1), shmem
    return geom


def _fa_combine(p) -> Geometry:
    """One block per (token, FA_COMBINE_HEADS heads) at batches of FA_COMBINE_MIN_ROWS tokens or more (a
    prefill's thousands of (head, token) blocks of one or two warps were limited by how fast blocks start),
    one per (token, head) below; threads along Dv."""
    d, part = _ne(p, 0), _ne(p, 1)   # dst (Dv, H, T, B); partials (Dv + 2, n_split, H, T * B)
    tx = min(256, max(32, -(-d[0] // 32) * 32))
    hb = max(1, min(FA_COMBINE_HEADS, 256 // tx, d[1])) if part[3] >= FA_COMBINE_MIN_ROWS else 1
    return (_cdiv(d[1], hb), max(part[3], 1), 1), (tx, hb, 1), 0


def _mm_tc(p) -> Geometry:
    """The tensor-core tiles (f16, q8_0): one block per 128 x 64 output tile per batch per k part (ip[0])."""
    d = _ne(p, 0)
    return (_cdiv(d[0], MM_BM), _cdiv(d[1], MM_BN), max(d[2] * d[3], 1) * max(_ip(p, 0), 1)), (MM_BLOCK, 1, 1), 0


def mm_f16_smem() -> int:
    """mul_mat_f16's shared memory: the pipelined path's MM_STAGES k tiles of W (F16) and two of x rounded to
    F16, rows padded by 8 halves (x goes through registers; the register path uses less)."""
    return MM_STAGES * MM_BM * (MM_BK_P + 8) * 2 + 2 * MM_BN * (MM_BK_P + 8) * 2


def _mm_f16(p) -> Geometry:
    """mul_mat_f16: the q8_0 kernel's grid, the pipelined path's shared memory."""
    grid, block, _ = _mm_tc(p)
    return grid, block, mm_f16_smem()


def _moe_reduction(p) -> Geometry:
    """kernels/moe.cu: a block per (token, 256 columns of n_embd)."""
    e = _ne(p, 1)
    return (max(e[2] * e[3], 1), _cdiv(e[0], ELEMENTWISE_BLOCK), 1), (ELEMENTWISE_BLOCK, 1, 1), 0


TOPK_MOE_ROWS = 8        # kernels/moe.cu topk_moe_f32: a warp per token, 8 a block (topk-moe.cuh's TOPK_MOE_ROWS_PER_BLOCK)


def _topk_moe(p) -> Geometry:
    logits = _ne(p, 2)
    return (max(_cdiv(logits[1] * logits[2] * logits[3], TOPK_MOE_ROWS), 1), 1, 1), (32, TOPK_MOE_ROWS, 1), 0


def _quantize(p) -> Geometry:
    x = _ne(p, 1)
    blocks = (x[0] // 32) * x[1] * x[2] * x[3]
    return (min(_cdiv(blocks, QUANT_WARPS), MAX_GRID_X), 1, 1), (32 * QUANT_WARPS, 1, 1), 0


DEQ_BLOCK = 256          # mmvq.cu dequantize_f16_*: one thread per unit of 32 weights, grid-stride


def _dequantize(p) -> Geometry:
    w = _ne(p, 1)
    units = (w[0] // 32) * w[1] * w[2] * w[3]
    return (min(_cdiv(units, DEQ_BLOCK), MAX_GRID_X), 1, 1), (DEQ_BLOCK, 1, 1), 0


def _unit_rows(p) -> Geometry:
    """mmvq.cu get_rows_*: one block per dst row, a thread per unit of 32 (a warp for rows up to 1024)."""
    n = _ne(p, 0)
    units = n[0] // 32
    return (max(n[1], 1), max(n[2], 1), max(n[3], 1)), (32 if units <= 32 else 128 if units <= 128 else 256, 1, 1), 0


def _x_types(t: dict) -> None:
    """kernels/mmvq.cu's geometry: the mat-vec kernels are mul_mat_vec.cu's (one warp per row, 4 rows a block)."""
    t["mul_mat_bf16"] = _mm
    for w in X_TYPES:
        t[f"get_rows_{w}"] = _unit_rows
        t[f"dequantize_f16_{w}"] = _dequantize
        t[f"mul_mat_vec_{w}"] = t[f"mul_mat_vec_glu_{w}"] = t[f"mul_mat_vec_add_{w}"] = _mmv
        t[f"mul_mat_id_vec_{w}"] = t[f"mul_mat_id_vec_glu_{w}"] = _mmv_id
        t[f"mul_mat_id_gathered_{w}"] = _mmv_gathered


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
        t[f"mul_mat_{w}"] = {"f32": _mm, "f16": _mm_f16, "q8_0": _mm_tc}[w]
        t[f"mul_mat_id_vec_{w}"] = _mmv_id
        t[f"mul_mat_id_vec_glu_{w}"] = _mmv_id
        t[f"mul_mat_id_gathered_{w}"] = _mmv_gathered
    t.update({
        "rms_norm_f32": _rms_rows, "rms_norm_mul_f32": _rms_rows, "rms_norm_scale_f32": _rms_rows,
        "soft_max_f32": _per_row(1),
        "mul_f32": _binary, "add_f32": _binary, "glu_swiglu_f32": _binary, "glu_swiglu_clamp_f32": _binary,
        "cpy_f32_f32": _elementwise(1), "cpy_f32_f16": _elementwise(1), "cpy_f16_f32": _elementwise(1),
        "rope_f32": _rope_rows,
        "set_rows_f16": _elementwise(1), "set_rows_f32": _elementwise(1),
        **{fa_vec_kernel(d, gm): _flash_attn_vec(d, gm) for d in FA_HEAD_DIMS for gm in FAV_GROUPS},
        **{fa_direct_kernel(d): _flash_attn_direct(d) for d in FA_HEAD_DIMS},
        **{fa_mma_kernel(d): _flash_attn_mma(d) for d in FA_HEAD_DIMS},
        "flash_attn_combine_f32": _fa_combine, "top_k_f32": _top_k, "argsort_f32_i32_desc": _top_k,
        "quantize_q8_1": _quantize, "mul_mat_fixup_f32": _elementwise(0),
        "moe_weighted_reduction_f32": _moe_reduction, "topk_moe_f32": _topk_moe,
        # rng.cu: one thread per element (Q8_0: a warp per 32-block, the same thread count)
        **{f"rng_fill_{w}": _elementwise(0) for w in ("f32", "f16", "q8_0")},
    })
    t["rope_set_rows_f16"] = _rope_rows     # x (D, Hkv, T): its ne3 is 1 by the catalogue
    _x_types(t)
    t.update(_gemma_qwen_geometry())
    t.update({"sum_rows_f32": _per_row(1), "clamp_f32": _elementwise(0), "div_f32": _binary})
    t.update({"add_id_f32": _elementwise(0), "glu_swiglu_oai_f32": _binary})
    t["mm_ids_helper"] = _mm_ids_helper
    t.update({f"mul_mat_id_q_{w}": _mmid_sorted for w in MMID_Q_TYPES})
    t.update({f"mul_mat_id_f_{w}": _mmid_sorted for w in MMID_F_TYPES})
    return t


ROPE_ROW_MAX_BLOCK = 256  # rope.cu's kernels: one block per head row, a thread per rotated pair


def _pair_threads(ne0: int) -> int:
    """Threads of a rope row block: one per rotated pair of ne0, in warps, 32..ROPE_ROW_MAX_BLOCK."""
    return min(ROPE_ROW_MAX_BLOCK, max(32, -(-(ne0 // 2) // 32) * 32))


def _rope_rows(p) -> Geometry:
    """rope_f32 / rope_set_rows_f16: one block per row (head, token, batch) of x (t[1]), a thread per pair
    of its ne0 (32..256 threads, striding beyond); tokens and batches past GRID_YZ_MAX stride."""
    n = _ne(p, 1)
    return ((max(n[1], 1), min(max(n[2], 1), GRID_YZ_MAX), min(max(n[3], 1), GRID_YZ_MAX)),
            (_pair_threads(n[0]), 1, 1), 0)


def _norm_rope_rows(p) -> Geometry:
    """rms_norm_mul_rope*: one block per row (head, token, batch) of x (t[1]), a thread per pair of its ne0
    (32..256 threads, striding beyond)."""
    n = _ne(p, 1)
    return (max(n[1], 1), max(n[2], 1), max(n[3], 1)), (_pair_threads(n[0]), 1, 1), 0


def _gemma_qwen_geometry() -> dict[str, Callable[[np.ndarray], Geometry]]:
    """kernels.py's _gemma_qwen_specs kernels."""
    return {"scale_f32": _elementwise(1), "glu_geglu_f32": _binary, "rms_norm_mul_add_f32": _rms_rows,
            "rms_norm_mul_rope_f32": _norm_rope_rows, "rms_norm_mul_rope_set_rows_f16": _norm_rope_rows}


_GEOMETRY = _table()
assert set(_GEOMETRY) == set(KERNELS), sorted(set(KERNELS) ^ set(_GEOMETRY))


def launch_geometry(name: str, params: np.ndarray) -> Geometry:
    """(grid, block, shmem bytes) for launching kernel `name` with the 0-d KPARAMS record `params`."""
    return geometry_of_bytes(name, memoryview(params).cast("B"))


def geometry_of_bytes(name: str, p) -> Geometry:
    """launch_geometry over the record's bytes (`p`: KPARAMS.itemsize bytes, e.g. the lowering's buffer)."""
    try:
        geom = _GEOMETRY[name]
    except KeyError:
        raise KeyError(f"no launch geometry for kernel {name!r}") from None
    grid, block, shmem = geom(p)
    return _check_yz(name, grid), block, shmem

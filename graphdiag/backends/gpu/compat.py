"""The compatibility gate (ggml_cuda_graph_check_compability) and MUL_MAT_ID's needs-sync rule.

Only a MUL_MAT_ID whose kernel would take the sorted fallback (ids copied to the host, stream synchronised)
makes a split ineligible — the whole split, not just the node. The same rule picks the kernel path in the
lowering, so the gate guards something real: the fallback really synchronises.

The rule is upstream ggml's `ggml_cuda_mul_mat_id_needs_sync` over its path predicates for NVIDIA devices
(the MMVQ per-type batch limits, `ggml_cuda_should_use_mmq`, `ggml_cuda_should_use_mmf` with
`mul_mat_id=true`), with kernels compiled for the device's own architecture. Each predicate returns the
reason it refuses ('' when the path applies), so a fallback names the rule that failed on every path.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.dtypes import GGMLType, is_quantized, type_size
from ...ir.graph import Graph
from ...ir.ops import Op, is_view_or_noop
from ...ir.tensor import Tensor

MMVQ_MAX_BATCH_SIZE = 8       # columns the mat-vec paths take (ggml: MMVQ_MAX_BATCH_SIZE = MMVF_MAX_BATCH_SIZE)
MMQ_DP4A_MAX_BATCH_SIZE = 64  # columns below which dp4a MMQ is used when FP16 tensor cores exist (Volta)
MMF_ROWS_PER_BLOCK = 32       # src0 rows per MMF block: the expert's row count must be a multiple
WARP_SIZE = 32
CC_PASCAL, CC_DP4A, CC_VOLTA, CC_TURING, CC_AMPERE, CC_ADA = 600, 610, 700, 750, 800, 890
MMF_MAX_COLUMNS = 16          # a MUL_MAT's columns MMF takes (past them, F16 / BF16 go to cuBLAS)

# Per-type MMVQ MUL_MAT_ID batch limits below MMVQ_MAX_BATCH_SIZE, for the types graphdiag has
# (ggml's get_mmvq_mmid_max_batch_* tables; every other type of these tables uses the default).
_MMVQ_MMID_PASCAL_OLDER = {GGMLType.Q8_0: 4, GGMLType.Q4_0: 6, GGMLType.Q5_0: 6, GGMLType.Q5_1: 6,
                           GGMLType.Q4_K: 5, GGMLType.Q5_K: 5, GGMLType.Q6_K: 4,
                           GGMLType.Q2_K: 4, GGMLType.Q3_K: 4,
                           GGMLType.Q4_1: 6, GGMLType.IQ4_NL: 6, GGMLType.IQ4_XS: 5, GGMLType.MXFP4: 4}
_MMVQ_MMID_TURING_PLUS = {GGMLType.Q2_K: 7, GGMLType.Q3_K: 5, GGMLType.MXFP4: 7}


def mmvq_mmid_max_batch(t: int, cc: int) -> int:
    """Columns the MUL_MAT_ID mat-vec fast path accepts for a quantized expert type on an NVIDIA device."""
    if cc == CC_VOLTA or cc >= CC_ADA:
        return MMVQ_MAX_BATCH_SIZE
    if cc >= CC_TURING:
        return _MMVQ_MMID_TURING_PLUS.get(t, MMVQ_MAX_BATCH_SIZE)
    return _MMVQ_MMID_PASCAL_OLDER.get(t, MMVQ_MAX_BATCH_SIZE)


def mmq_refusal(t: int, cc: int, ncols: int, n_experts: int = 0) -> str:
    """'' when ggml_cuda_should_use_mmq(t, cc, ncols, n_experts) holds on NVIDIA, else why not (n_experts:
    src0's ne[2] for a MUL_MAT_ID, 0 for a MUL_MAT)."""
    if not is_quantized(t):
        return "MMQ: not quantized"
    if cc >= CC_TURING:
        return ""                                      # turing_mma_available
    if cc < CC_DP4A:                                   # "for MoE, mmq is faster even without native dp4a"
        if cc >= CC_PASCAL and n_experts > 0:
            return ""
        return f"MMQ: cc {cc // 100}.{cc % 100 // 10} < 6.1 (no dp4a)"
    if cc >= CC_VOLTA and ncols >= MMQ_DP4A_MAX_BATCH_SIZE:   # FP16 tensor cores: dp4a MMQ only for few columns
        return f"MMQ: {ncols} columns >= {MMQ_DP4A_MAX_BATCH_SIZE} with FP16 tensor cores (Volta)"
    return ""


def mmf_refusal(t: int, cc: int, src0: Tensor, ncols: int, mul_mat_id: bool = True) -> str:
    """'' when ggml_cuda_should_use_mmf(t, cc, warp, src0 ne/nb, ncols, mul_mat_id) holds on NVIDIA."""
    if is_quantized(t):
        return "MMF: quantized"
    ts = type_size(t)
    ne, nb = src0.ne, src0.nb
    if ne[0] % (WARP_SIZE * (4 // ts)) != 0:
        return f"MMF: row of {ne[0]} not a multiple of {WARP_SIZE * (4 // ts)}"
    if nb[0] != ts or any(nb[i] % (2 * ts) for i in (1, 2, 3)):
        return "MMF: rows not contiguous or not aligned"
    if ne[1] % MMF_ROWS_PER_BLOCK != 0:
        return f"MMF: {ne[1]} rows not a multiple of {MMF_ROWS_PER_BLOCK}"
    if mul_mat_id:
        limit = 512 if ne[1] <= 1024 else 128
        if ncols > limit:
            return (f"MMF: {ncols} columns > {limit} (the limit for experts of "
                    f"{'<=' if ne[1] <= 1024 else '>'} 1024 rows)")
    elif ncols > MMF_MAX_COLUMNS:
        return f"MMF: {ncols} columns > {MMF_MAX_COLUMNS}"
    if t == GGMLType.F32 and cc < CC_AMPERE:
        return "MMF: F32 needs cc >= 8.0"
    if t == GGMLType.F16 and cc != CC_VOLTA and cc < CC_TURING:
        # volta_mma_available is the compiled arch == 7.0 exactly: Xavier/Orin-era 7.2 and 7.3 get no MMF
        return "MMF: F16 needs cc 7.0 or >= 7.5"
    if t == GGMLType.BF16 and cc < CC_AMPERE:
        return "MMF: BF16 needs cc >= 8.0"
    if t not in (GGMLType.F16, GGMLType.F32, GGMLType.BF16):
        return f"MMF: {GGMLType(t).name}"
    return ""


# ggml_cuda_should_use_mmvq's per-device batch limits for the types graphdiag has (mmvq.cu; K-quants cost
# more to decode per column, so MMQ wins sooner there); every other NVIDIA device: MMVQ_MAX_BATCH_SIZE.
CC_ORIN, CC_BLACKWELL, CC_DGX_SPARK = 870, 1200, 1210
_MMVQ_LIMITS = {
    CC_ADA: {GGMLType.Q2_K: 4, GGMLType.Q3_K: 6},                                       # tuned on an RTX 4090
    CC_BLACKWELL: {GGMLType.Q2_K: 5, GGMLType.Q3_K: 5, GGMLType.Q4_K: 5, GGMLType.Q5_K: 6, GGMLType.Q6_K: 7},
    CC_DGX_SPARK: {GGMLType.Q2_K: 6},
    CC_ORIN: {GGMLType.Q2_K: 1, GGMLType.Q3_K: 1, GGMLType.Q4_K: 1, GGMLType.Q5_K: 1, GGMLType.Q6_K: 1},
    CC_VOLTA: {GGMLType.Q2_K: 4, GGMLType.Q3_K: 6, GGMLType.Q4_K: 5, GGMLType.Q5_K: 6, GGMLType.Q6_K: 7},
}


def mmvq_ok(t: int, cc: int, ncols: int) -> bool:
    """ggml_cuda_should_use_mmvq(t, cc, ncols) on NVIDIA."""
    return is_quantized(t) and ncols <= _MMVQ_LIMITS.get(cc, {}).get(t, MMVQ_MAX_BATCH_SIZE)


def mmvf_ok(t: int, cc: int, src0: Tensor, ncols: int) -> bool:
    """ggml_cuda_should_use_mmvf(t, cc, src0 ne/nb, ncols) on NVIDIA (the float mat-vec)."""
    if t not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        return False
    ts = type_size(t)
    if src0.ne[0] % 2 or src0.nb[0] != ts or any(src0.nb[i] % (2 * ts) for i in (1, 2, 3)):
        return False
    if t == GGMLType.F32:
        return ncols <= (3 if cc >= CC_AMPERE else 4 if cc >= CC_TURING else 3)
    small = src0.ne[1] <= 512 or src0.ne[2] * src0.ne[3] == 1
    if cc >= CC_AMPERE:
        return small and ncols == 1
    if cc >= CC_ADA:
        return small and ncols <= 4
    tensor_cores = cc >= CC_VOLTA if t == GGMLType.F16 else cc >= CC_AMPERE
    return small and ncols <= 3 if tensor_cores else ncols <= 8


def mul_mat_path(node: Tensor, cc: int) -> str:
    """The kernel family ggml_cuda_mul_mat picks for a MUL_MAT on NVIDIA, in its order: 'mmvf' (float
    mat-vec), 'mmf' (float tensor-core tiles, up to 16 columns), 'mmvq' (quantized mat-vec on Q8_1 x),
    'mmq' (quantized tiles on Q8_1 x) or 'cublas'. (The transposed-vector MMVF case, F32 weights of one
    row, is left out: no graph here has one.)"""
    w, x = node.src[0], node.src[1]
    if x.type != GGMLType.F32 or node.type != GGMLType.F32:
        return "cublas"
    ncols = x.ne[1]
    if mmvf_ok(w.type, cc, w, ncols):
        return "mmvf"
    if not mmf_refusal(w.type, cc, w, ncols, mul_mat_id=False):
        return "mmf"
    if mmvq_ok(w.type, cc, ncols):
        return "mmvq"
    if not mmq_refusal(w.type, cc, ncols):
        return "mmq"
    return "cublas"


MMQ_TILE_ROWS = 128        # I of the Volta+ MMQ configs (mmq-config-ampere.cuh): weight rows per output tile
MMQ_TILE_COLS_MAX = 128    # the largest J: launch_mul_mat_q picks the smallest J of fewest column tiles
MMQ_MIN_EFFICIENCY = 90    # percent: at or above it the stream-k kernel runs one block per tile, no fixup
MMQ_K_UNIT = 64            # elements of K per split unit of graphdiag's k-split (mul_mat.cu)
MMQ_MAX_K_PARTS = 8        # graphdiag's k-split: at most this many parts (pool scratch of parts - 1 outputs)


def mmq_stream_k_parts(m_rows: int, ncols: int, batch: int, k: int, nsm: int, cc: int) -> int:
    """How many K parts graphdiag's quantised mat-mul splits into where upstream's stream-k MMQ launches
    mul_mat_q_stream_k_fixup after mul_mat_q (0: no fixup, two launches; else three).

    Upstream (launch_mul_mat_q, Volta and newer: the ampere configs have stream_k): ntiles = ceil(M / 128) x
    ceil(ncols / 128) x batch output tiles; at tile efficiency ntiles / (nsm x waves) of 90 % or more it runs
    one block per tile and needs no fixup; below, it runs nsm blocks over all tiles' k iterations, and blocks
    that end inside a tile leave partial sums the fixup kernel adds in (ntiles % nsm != 0, always so there).
    graphdiag's stand-in is a real k-split: parts enough to give every SM a block (ceil(nsm / ntiles), at
    most MMQ_MAX_K_PARTS and the K_UNITs of K, at least 2), part 0 writing dst, the others pool scratch that
    mul_mat_fixup_f32 adds in: the same three launches, on the same shapes, doing the same kind of work."""
    if cc < CC_VOLTA or nsm <= 0:
        return 0
    ntiles = -(-m_rows // MMQ_TILE_ROWS) * -(-ncols // MMQ_TILE_COLS_MAX) * batch
    waves = -(-ntiles // nsm)
    if 100 * ntiles // (nsm * waves) >= MMQ_MIN_EFFICIENCY:
        return 0
    units = -(-k // MMQ_K_UNIT)
    return max(2, min(-(-nsm // ntiles), MMQ_MAX_K_PARTS, units))


CUBLAS_TILE = 64            # the 64 x 64 output tile of the cuBLAS kernels recorded (cutlass s1688gemm_64x64,
                            # h16816gemm_64x64)
CUBLAS_SPLIT_K_MIN_K = 256  # K below which graphdiag's model of cuBLAS keeps an F32 GEMM in one kernel (no
                            # record split it)
CUBLAS_H_SPLIT_K_MIN_K = 1024   # the same for a GEMM computed in F16 (CUBLAS_COMPUTE_16F): K 512 never split in
                                # a record, 1024 and 1408 did (in between: not recorded)
CUBLAS_H_K_PER_TILE = 50   # ... and only while K is more than 50 per 64 x 64 output tile: on the H100 (2026-12-07,
                            # tests/data/llama/cublas-gemms-h100.json) K 1024 over 512 rows split at up to 128
                            # columns (16 tiles) and not from 129 (24 tiles: 1024 < 1200), K 1408 split at 192
                            # (24 tiles: 1408 > 1200); the ratio lies between 42.7 and 58.7, 50 its middle
CUBLAS_H_MAX_K_PARTS = 2    # graphdiag's F16 stand-in splits in two: its partials take ggml's pool, where
                            # cuBLAS's take its own workspace, and upstream's pool holds only the GEMM's F16
                            # copies of x and the result (a 32-token prefill of tiny under a 300 kB pool cap,
                            # scenarios/pool-flush-stale-pointer.toml, ran out of it with 8 parts)


def _split_k_parts(node: Tensor, nsm: int, min_k: int, max_parts: int, k_per_tile: int = 0) -> int:
    m, n = node.ne[0], node.ne[1]
    tiles = -(-m // CUBLAS_TILE) * -(-n // CUBLAS_TILE) * node.ne[2] * node.ne[3]
    k = node.src[0].ne[0]
    if k < min_k or 4 * tiles >= nsm or tiles * k_per_tile >= k:
        return 0
    return max(2, min(-(-nsm // tiles), max_parts, -(-k // MMQ_K_UNIT)))


def cublas_split_k_parts(node: Tensor, cc: int, nsm: int) -> int:
    """The k parts of graphdiag's stand-in for a MUL_MAT whose GEMM upstream hands to cuBLAS and cuBLAS runs
    split over K (0: one GEMM kernel), for F32 weights and for a GEMM computed in F16.

    cuBLAS chooses its kernels itself, so this is a model of its choice, held to what was recorded: a GEMM
    of fewer 64 x 64 output tiles than a quarter of the SMs over a long enough K runs as a split-K GEMM and
    cublasLt's `splitKreduce_kernel`, two kernels. F32 (Sgemm, K >= 256): the MoE router's mat-mul
    (ffn_gate_inp: 8 experts x K 512) at 4, 8 and 9 columns ran as cutlass `s1688gemm_64x64_16x6` +
    splitKreduce (H200 2026-12-04, H100 2026-12-06: tests/data/llama/kernels-moe-*.json), where at up to 3
    columns MMVF runs one. F16 compute (K >= 1024): on the H100 (2026-12-07, the differential test's
    timelines: kernels-tiny-f16-gen-716079883.json, kernels-qwen3moe-f16-moe-sequences-sweep.json) tiny's
    ffn_down (512 x K 1408) at 47 columns and qwen3moe-tiny's attention output (512 x K 1024) at 32 ran as
    cutlass `h16816gemm_64x64` + splitKreduce, while every K-512 GEMM of the same graphs (Q, K, V, the FFN's
    gate and up, the LM head) ran as one kernel, and so did tiny's ffn_down at 512 columns (llama-server's
    trace); prefills of 17 to 192 tokens (tests/data/llama/cublas-gemms-h100.json) put the end of the split
    where K per output tile falls to between 43 and 59 (CUBLAS_H_K_PER_TILE): qwen3moe-tiny's attention
    output split up to 128 columns and ran as one `h161616gemm_32x32` from 129, tiny's ffn_down split to 192.
    A GEMM cuBLAS computes in F32 or BF16 from F16 / BF16 weights: none recorded split (tiny BF16 at 17 to 158
    columns ran one nvjet kernel each), so none; nor for quantized weights, which reach cuBLAS only where MMQ
    refuses them (not on the GPUs recorded). graphdiag's parts: as its MMQ k-split takes them for F32, two
    for F16 (CUBLAS_H_MAX_K_PARTS)."""
    if node.op != Op.MUL_MAT or mul_mat_path(node, cc) != "cublas":
        return 0
    return _cublas_split_k_parts(node, cc, nsm)


def _cublas_split_k_parts(node: Tensor, cc: int, nsm: int) -> int:
    """cublas_split_k_parts for a MUL_MAT known to be on upstream's cuBLAS path."""
    w = node.src[0]
    if w.type == GGMLType.F32:
        return _split_k_parts(node, nsm, CUBLAS_SPLIT_K_MIN_K, MMQ_MAX_K_PARTS)
    if w.type == GGMLType.F16 and cublas_compute_type(node, cc) == GGMLType.F16:
        return _split_k_parts(node, nsm, CUBLAS_H_SPLIT_K_MIN_K, CUBLAS_H_MAX_K_PARTS, CUBLAS_H_K_PER_TILE)
    return 0


GGML_PREC_F32 = 10          # ggml_prec: a MUL_MAT's op_params[0] asking for F32 precision


def cublas_compute_type(node: Tensor, cc: int) -> GGMLType:
    """The type ggml_cuda_mul_mat_cublas computes an F16, BF16 or quantized MUL_MAT's GEMM in: the weights'
    (F16 on fast-FP16 hardware for quantized weights; F32 for F16 without it, for BF16 before Ampere past 8
    columns, or where the node asks GGML_PREC_F32). GGML_CUDA_CUBLAS_COMPUTE_TYPE, upstream's override, is
    not read."""
    w, x = node.src[0], node.src[1]
    t = w.type
    fp16 = cc >= CC_PASCAL and cc != CC_DP4A
    compute = t
    if is_quantized(t):
        compute = GGMLType.F16 if fp16 else GGMLType.F32
    elif t == GGMLType.F16 and not fp16:
        compute = GGMLType.F32
    elif t == GGMLType.BF16 and cc < CC_AMPERE and x.ne[1] > (8 if cc >= CC_VOLTA else 128):
        compute = GGMLType.F32
    if node.param_i32(0) == GGML_PREC_F32:
        compute = GGMLType.F32
    return compute


def cublas_launches(node: Tensor, cc: int, nsm: int) -> int:
    """The kernels upstream's ggml_cuda_mul_mat_cublas launches for a MUL_MAT on its cuBLAS path with F16,
    BF16 or quantized weights (0: another path, or F32 weights, whose stand-in is cublas_split_k_parts'
    own two launches): the GEMM (and its split-K reduce where cublas_split_k_parts says cuBLAS splits it),
    and around it the conversions to and from its compute type (cublas_compute_type): src0 and src1 are each
    converted unless already of it, and an F16 / BF16 result is converted to F32 unless cuBLAS writes F32
    itself (F16 on Volta, BF16 on NVIDIA). graphdiag launches the same for F16 weights computed in F16 with
    an F16 result (lowering._cublas_f16); its other mat-mul kernels do without the conversions. Recorded on
    the H100 (2026-12-07, llama-server on tiny F16, a 512-token ubatch): 25 mat-muls as 25
    convert_unary<float, half>, 25 cutlass / sm90 h-GEMMs and 25 convert_unary<half, float>."""
    w, x = node.src[0], node.src[1]
    t = w.type
    if node.op != Op.MUL_MAT or t == GGMLType.F32 or mul_mat_path(node, cc) != "cublas":
        return 0
    compute = cublas_compute_type(node, cc)
    f32_out = compute == GGMLType.F32 or compute == GGMLType.BF16 or cc == CC_VOLTA
    gemm = 2 if _cublas_split_k_parts(node, cc, nsm) else 1
    return gemm + (t != compute) + (x.type != compute) + (not f32_out)


def mul_mat_id_sync_reason(node: Tensor, cc: int) -> str:
    """'' when a fast path applies (no sync), else every path's refusal (the sorted fallback synchronises)."""
    src0, src1 = node.src[0], node.src[1]
    if src1.type != GGMLType.F32 or node.type != GGMLType.F32:
        return "src1 or dst not F32: the sorted fallback synchronises the stream"
    rows, ncols, t = node.ne[2], src1.ne[2], src0.type
    if rows <= MMVQ_MAX_BATCH_SIZE:
        if is_quantized(t):
            if rows <= mmvq_mmid_max_batch(t, cc):
                return ""
            mmv = f"MMVQ: {rows} tokens > {mmvq_mmid_max_batch(t, cc)} for {GGMLType(t).name} on this cc"
        else:
            mmv = "MMVQ: not quantized"
    else:
        mmv = f"MMVQ: {rows} tokens > {MMVQ_MAX_BATCH_SIZE}"
    mmq = mmq_refusal(t, cc, ncols, src0.ne[2])
    if not mmq:
        return ""
    mmf = mmf_refusal(t, cc, src0, ncols)
    if not mmf:
        return ""
    return (f"{GGMLType(t).name} experts ({src0.ne[1]} rows), {rows} tokens: {mmv}; {mmq}; {mmf}; "
            f"the sorted fallback synchronises the stream")


def mul_mat_id_needs_sync(node: Tensor, cc: int) -> bool:
    return bool(mul_mat_id_sync_reason(node, cc))


MMF_IDS_DIRECT_MAX = 16   # tokens up to which MMF reads a MUL_MAT_ID's ids itself (mmf.cu: ncols_dst > 16 first
                          # launches mm_ids_helper and runs mul_mat_f_ids over its expert-sorted map)


def mul_mat_id_path(node: Tensor, cc: int) -> str:
    """The path ggml_cuda_mul_mat_id (ggml-cuda.cu) takes for a MUL_MAT_ID on NVIDIA, in its order: 'mmvq'
    (quantized experts up to get_mmvq_mmid_max_batch tokens), 'mmq' (ggml_cuda_should_use_mmq with
    n_experts), 'mmf' (ggml_cuda_should_use_mmf with mul_mat_id), else 'sorted' (the fallback that copies
    the ids to the host and synchronises: exactly where mul_mat_id_needs_sync holds)."""
    src0, src1 = node.src[0], node.src[1]
    if src1.type != GGMLType.F32 or node.type != GGMLType.F32:
        return "sorted"
    t, rows, ncols = src0.type, node.ne[2], src1.ne[2]
    if rows <= MMVQ_MAX_BATCH_SIZE and is_quantized(t) and rows <= mmvq_mmid_max_batch(t, cc):
        return "mmvq"
    if not mmq_refusal(t, cc, ncols, src0.ne[2]):
        return "mmq"
    if not mmf_refusal(t, cc, src0, ncols):
        return "mmf"
    return "sorted"


@dataclass(frozen=True)
class Incompatibility:
    node: int
    node_name: str
    rule: str


def check_compatibility(graph: Graph, cc: int) -> Incompatibility | None:
    """None when the split can use CUDA graphs; else the first node (and rule) that forbids it."""
    rec = graph.arena.rec
    ops = rec["op"][graph.nodes]
    for i in (ops == Op.MUL_MAT_ID).nonzero()[0]:
        node = graph.node(int(i))
        if is_view_or_noop(node.op, node.ne):
            continue
        why = mul_mat_id_sync_reason(node, cc)
        if why:
            return Incompatibility(int(i), node.name, why)
    return None

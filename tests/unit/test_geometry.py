"""Launch geometry from descriptors alone (graphdiag.backends.geometry)."""

import pytest

from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.geometry import MMV_WARPS, fa_split, launch_geometry
from graphdiag.backends.kernels import KERNELS


def _p(*nes, ip=()):
    p = new_params()
    for i, ne in enumerate(nes):
        set_desc(p, i, 0x1000 * (i + 1), 0, ne, (4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]))
    p["ip"][: len(ip)] = ip
    return p


def _valid_params(name):
    """(64, 4, 2, 1) in every slot, except an attention entry point, which takes only its own head size
    (and, for decode, its own G)."""
    nes = [(64, 4, 2, 1)] * 6
    if name.startswith("flash_attn_vec_f16_d"):
        d, g = (int(x[1:]) for x in name.split("_")[-2:])
        nes[1], nes[2], nes[3] = (d, 2 * g, 1, 1), (d, 2, 256, 1), (d, 2, 256, 1)
    elif name.startswith("flash_attn_mma_f16_d"):
        d = int(name.split("_d")[-1])
        nes[1], nes[2], nes[3] = (d, 4, 40, 1), (d, 2, 256, 1), (d, 2, 256, 1)
    elif name.startswith("flash_attn_vec_direct_f16_d"):       # one split of <= D positions, a block per head
        d = int(name.split("_d")[-1])
        nes[1], nes[2], nes[3] = (d, 4, 1, 1), (d, 2, d, 1), (d, 2, d, 1)
        return _p(*nes, ip=(d, 1, 1, 1))
    return _p(*nes, ip=(4, 2, 0))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_kernel_has_a_valid_geometry(name):
    grid, block, shmem = launch_geometry(name, _valid_params(name))
    assert all(g >= 1 for g in grid) and 32 <= block[0] <= 1024 and block[0] % 32 == 0 and shmem >= 0


def test_mat_vec_is_one_warp_per_row_and_one_block_row_per_batch():
    grid, block, shmem = launch_geometry("mul_mat_vec_f16", _p((8192, 1, 3, 2), (2048, 8192, 1, 1)))
    assert grid == (8192 // MMV_WARPS, 6, 1) and block == (32 * MMV_WARPS, 1, 1) and shmem == 0


def test_tiled_mat_mul_and_moe_paths():
    assert launch_geometry("mul_mat_f32", _p((100, 40, 2, 1)))[0] == (7, 3, 2)
    assert launch_geometry("mul_mat_q8_0", _p((300, 130, 2, 1))) == ((3, 3, 2), (256, 1, 1), 0)
    assert launch_geometry("quantize_q8_1", _p((0, 0, 0, 0), (2048, 5, 1, 1))) == ((40, 1, 1), (256, 1, 1), 0)
    assert launch_geometry("mul_mat_id_vec_f16", _p((300, 2, 5, 1)))[0] == (75, 2, 5)
    assert launch_geometry("mul_mat_id_gathered_f32", _p((300, 2, 5, 1)), )[0][1] == 1   # 0 rows: idle grid
    assert launch_geometry("mul_mat_id_gathered_f32", _p((300, 2, 5, 1), ip=(1, 9, 0)))[0][1] == 9


def test_flash_attn_splits_the_kv_range_until_the_gpu_is_full():
    assert fa_split(256, 8) == (8, 32)          # tiny / 1b decode: 8 kv heads, 8 splits of 32 positions
    assert fa_split(256, 32) == (8, 32)         # capped by the 32-position sub-chunk
    assert fa_split(4096, 8) == (32, 128)
    assert fa_split(512, 512) == (1, 512)       # prefill: the token tiles fill the GPU alone
    n_split, chunk = fa_split(300, 7)
    assert (n_split - 1) * chunk < 300 <= n_split * chunk and chunk % 32 == 0


def test_flash_attn_combine_takes_a_block_per_head_and_token():
    assert launch_geometry("flash_attn_combine_f32", _p((64, 32, 3, 1), (66, 8, 32, 3))) == \
        ((32, 3, 1), (64, 1, 1), 0)


def test_flash_attn_combine_groups_heads_per_block_in_a_batch():
    # a 512-token prefill: 4 heads of 64 dims per block; 6 heads leave the last block half full
    assert launch_geometry("flash_attn_combine_f32", _p((64, 32, 512, 1), (66, 2, 32, 512))) == \
        ((8, 512, 1), (64, 4, 1), 0)
    assert launch_geometry("flash_attn_combine_f32", _p((64, 6, 70, 1), (66, 2, 6, 70)))[:2] == ((2, 70, 1), (64, 4, 1))
    assert launch_geometry("flash_attn_combine_f32", _p((128, 32, 64, 1), (130, 3, 32, 64)))[:2] == ((16, 64, 1), (128, 2, 1))


def test_row_kernels_scale_their_block_with_the_row():
    assert launch_geometry("rms_norm_f32", _p((64, 5, 1, 1), (64, 5, 1, 1)))[1] == (32, 1, 1)
    assert launch_geometry("rms_norm_f32", _p((2048, 5, 1, 1), (2048, 5, 1, 1)))[1] == (128, 1, 1)   # 4 float4s each
    assert launch_geometry("rms_norm_mul_f32", _p((4096, 1, 1, 1), (4096, 1, 1, 1)))[1] == (256, 1, 1)
    assert launch_geometry("rms_norm_f32", _p((16384, 2, 1, 1), (16384, 2, 1, 1)))[:2] == ((2, 1, 1), (1024, 1, 1))
    assert launch_geometry("rms_norm_f32", _p((32768, 1, 1, 1), (32768, 1, 1, 1)))[1] == (1024, 1, 1)  # generic loop
    assert launch_geometry("soft_max_f32", _p((2048, 5, 1, 1), (2048, 5, 1, 1)))[1] == (256, 1, 1)


def test_grid_y_over_the_cuda_limit_is_refused():
    with pytest.raises(ValueError, match="65535"):
        launch_geometry("mul_mat_id_vec_f32", _p((64, 70000, 1, 1)))


def test_unknown_kernel():
    with pytest.raises(KeyError, match="nope"):
        launch_geometry("nope", new_params())


def test_decode_attention_takes_the_vec_kernel_one_token_per_block():
    from graphdiag.backends.geometry import fa_plan, fa_vec
    assert fa_vec(32, 8, 1) and fa_vec(32, 32, 8) and not fa_vec(32, 8, 9) and not fa_vec(32, 2, 1)
    assert fa_plan(64, 32, 8, 256, 1)[:3] == (1, 8, 32)       # 1b decode: 8 kv heads x 8 splits
    assert fa_plan(64, 32, 8, 256, 4)[0] == 1                 # a small batch: still one token per block
    assert fa_plan(64, 32, 8, 512, 512)[:3] == (64, 2, 256)   # prefill: 64-row tiles, 8 x 32 blocks, 2 splits
    assert fa_plan(64, 32, 8, 1024, 16)[:2] == (64, 11)       # a short batch: 8 blocks, splits (capped) fill the GPU


def test_batch_attention_takes_the_tensor_core_kernel_per_head_size():
    from graphdiag.backends.geometry import fa_mma_blocks
    # rows (token x head sharing a kv head) in tiles of 64: 1b prefill of 512 is 8 kv heads x 32 tiles
    assert fa_mma_blocks(32, 8, 512) == 256 and fa_mma_blocks(6, 2, 33) == 2 * 2 and fa_mma_blocks(32, 32, 9, 2) == 64
    p = _p((66, 1, 32, 512), (64, 32, 512, 1), (64, 8, 1024, 1))
    assert launch_geometry("flash_attn_mma_f16_d64", p) == ((1, 8, 32), (128, 1, 1), 2 * 2 * 64 * 72 * 2)
    with pytest.raises(ValueError, match="head size 64"):
        launch_geometry("flash_attn_mma_f16_d128", p)
    # grid (n_split, Hkv, T * B); shmem: q, scores, alphas and the row-group sums of GM (G rounded to 2^k) heads
    p = _p((66, 8, 32, 1), (64, 32, 1, 1), (64, 8, 256, 1))
    assert launch_geometry("flash_attn_vec_f16_d64_g4", p) == ((8, 8, 1), (128, 1, 1),
                                                               4 * (4 * 64 + 4 * 32 + 8 + 16 * 4 * 64))
    # one entry point per (D, G rounded up): another head size or group is refused, not launched
    with pytest.raises(ValueError, match="do not match"):
        launch_geometry("flash_attn_vec_f16_d64_g8", p)
    with pytest.raises(ValueError, match="do not match"):
        launch_geometry("flash_attn_vec_f16_d128_g4", p)


def test_decode_attention_entry_points_cover_every_head_size_and_group():
    from graphdiag.backends.kernels import FAV_KERNELS, fa_vec_kernel
    assert [fa_vec_kernel(64, g) for g in (1, 2, 3, 4, 5, 8)] == [
        "flash_attn_vec_f16_d64_g1", "flash_attn_vec_f16_d64_g2", "flash_attn_vec_f16_d64_g4",
        "flash_attn_vec_f16_d64_g4", "flash_attn_vec_f16_d64_g8", "flash_attn_vec_f16_d64_g8"]
    assert len(FAV_KERNELS) == 16 and len(set(FAV_KERNELS)) == 16   # D 32, 64, 128, 256 x G 1, 2, 4, 8


@pytest.mark.parametrize("m,k,want", [(512, 2048, 2), (2048, 2048, 2), (2048, 8192, 2), (32000, 2048, 1),
                                      (512, 512, 1), (4096, 4096, 1), (64, 8192, 4)])
def test_few_long_rows_are_shared_by_warps(m, k, want):
    from graphdiag.backends.geometry import mmv_warps_per_row
    assert mmv_warps_per_row(m, k) == want
    grid, block, _ = launch_geometry("mul_mat_vec_f16", _p((m, 1, 1, 1), (k, m, 1, 1), ip=(0, want)))
    assert grid[0] == -(-m // (MMV_WARPS // want)) and block == (128, 1, 1)
    # more than one column: one warp per row whatever ip says (the kernel's 8-column path)
    grid, _, _ = launch_geometry("mul_mat_vec_f16", _p((m, 2, 1, 1), (k, m, 1, 1), ip=(0, want)))
    assert grid[0] == -(-m // MMV_WARPS)


def test_the_lowering_shares_rows_only_for_one_column():
    from types import SimpleNamespace as NS
    from graphdiag.backends.gpu.lowering import _mmv_ip
    w = NS(ne=(2048, 512, 1, 1))                     # 1b's K/V projection: K 2048, M 512
    assert _mmv_ip(NS(ne=(512, 1, 1, 1)), w) == (0, 2)
    assert _mmv_ip(NS(ne=(512, 4, 1, 1)), w) == (0, 1)


def _cu_defines(path):
    import re
    return dict(re.findall(r"^#define (MM_\w+) (\S+)", path.read_text(), re.M))


def test_mul_mat_f16_shared_memory_is_what_its_pipelined_path_takes():
    """The kernel's stages (its own #defines) are what geometry sizes: a mismatch would let the kernel write
    past its shared memory."""
    from graphdiag.backends import geometry as g
    from graphdiag.resources import kernels_dir
    d = {k: int(v) for k, v in _cu_defines(kernels_dir() / "mul_mat.cu").items() if v.isdigit()}
    assert (d["MM_STAGES"], d["MM_BK_P"], d["MM_BM"], d["MM_BN"]) == (g.MM_STAGES, g.MM_BK_P, g.MM_BM, g.MM_BN)
    want = d["MM_STAGES"] * d["MM_BM"] * (d["MM_BK_P"] + 8) * 2 + 2 * d["MM_BN"] * (d["MM_BK_P"] + 8) * 2
    grid, block, shmem = launch_geometry("mul_mat_f16", _p((2048, 512, 1, 1), (2048, 2048, 1, 1), (2048, 512, 1, 1)))
    assert grid == (16, 8, 1) and block == (256, 1, 1) and shmem == want == g.mm_f16_smem() == 73728


def test_binary_ops_take_a_thread_per_four_elements():
    assert launch_geometry("glu_swiglu_f32", _p((8192, 512, 1, 1)))[0] == (4096, 1, 1)
    assert launch_geometry("add_f32", _p((3, 1, 1, 1)))[0] == (1, 1, 1)
    assert launch_geometry("mul_f32", _p((1025, 1, 1, 1)))[0] == (2, 1, 1)

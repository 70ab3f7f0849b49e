"""How many cells llama.cpp gives the sliding-window half of its iSWA KV cache (llama_kv_cache_iswa)."""

from __future__ import annotations

SWA_PAD = 256         # the SWA cache is always padded to 256 cells (llama.cpp issue 17037), whatever n_pad
N_UBATCH = 512        # llama.cpp's default n_ubatch: the most tokens one ubatch places


def swa_cache_size(n_ctx: int, n_swa: int, n_seq_max: int, n_ubatch: int = N_UBATCH, unified: bool = True,
                   swa_full: bool = False) -> int:
    """Cells of the SWA cache (size_swa): pad256(min(n_ctx, n_swa * (n_seq_max if the cache is unified else
    1) + n_ubatch)), or n_ctx with swa_full. The pad comes after the cap, so it may exceed an n_ctx that is no
    multiple of 256, as upstream."""
    if swa_full:
        return n_ctx
    n = min(n_ctx, n_swa * (n_seq_max if unified else 1) + n_ubatch)
    return (n + SWA_PAD - 1) // SWA_PAD * SWA_PAD

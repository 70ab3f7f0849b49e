"""How many cells llama.cpp gives the sliding-window half of its iSWA KV cache (llama_kv_cache_iswa)."""

from __future__ import annotations

SWA_PAD = 256         # the SWA cache is always padded to 256 cells (llama.cpp issue 17037), whatever n_pad
CTX_PAD = 256         # llama_context pads n_ctx (and a stream's n_ctx_seq) to 256
N_UBATCH = 512        # llama.cpp's default n_ubatch: the most tokens one ubatch places
N_BATCH = 2048        # llama.cpp's default n_batch (n_ubatch is at most it)


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to               # GGML_PAD


def swa_cache_size(n_ctx: int, n_swa: int, n_seq_max: int, n_ubatch: int = N_UBATCH, unified: bool = True,
                   swa_full: bool = False, n_batch: int = N_BATCH) -> int:
    """Cells of the SWA cache (size_swa) of a context asked for `n_ctx` cells, as llama.cpp 0c1e57098 makes
    it. llama_context::llama_context: n_ctx = pad256(n_ctx); n_batch = min(n_ctx, n_batch) (causal);
    n_ubatch = min(n_batch, n_ubatch); n_ctx_seq = n_ctx when the cache is unified, else
    pad256(n_ctx / n_seq_max). llama_model::create_memory hands n_ctx_seq, n_seq_max and n_ubatch to
    llama_kv_cache_iswa::llama_kv_cache_iswa: size_base = n_ctx_seq; size_swa = pad256(min(size_base,
    n_swa * (n_seq_max if unified else 1) + n_ubatch)), or size_base with swa_full."""
    n_ctx = _pad(n_ctx, CTX_PAD)
    n_ubatch = min(min(n_ctx, n_batch), n_ubatch)
    size_base = n_ctx if unified else _pad(n_ctx // max(n_seq_max, 1), CTX_PAD)
    if swa_full:
        return size_base
    return _pad(min(size_base, n_swa * (n_seq_max if unified else 1) + n_ubatch), SWA_PAD)

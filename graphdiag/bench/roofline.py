"""The HBM roofline of a decode step: bytes it must read over the device-to-device copy bandwidth measured
in the same run (through the driver interface; on the simulated driver a host memcpy, labelled so)."""

from __future__ import annotations

import statistics

from ..model.presets import ModelConfig
from ..model.weights import Model

KV_BYTES = 2        # the KV cache is F16


def copy_bandwidth(driver, nbytes: int, reps: int = 10) -> float:
    """Bytes per second of memcpy_dtod of `nbytes`, counting bytes read plus written (median of `reps`)."""
    src, dst = driver.mem_alloc(nbytes), driver.mem_alloc(nbytes)
    stream = driver.stream_create()
    start, end = driver.event_create(timing=True), driver.event_create(timing=True)
    try:
        driver.memcpy_dtod(dst, src, nbytes, stream)   # warm-up
        times = []
        for _ in range(reps):
            driver.event_record(start, stream)
            driver.memcpy_dtod(dst, src, nbytes, stream)
            driver.event_record(end, stream)
            times.append(driver.event_elapsed_ms(start, end) / 1e3)
        return 2 * nbytes / max(statistics.median(times), 1e-12)
    finally:
        for e in (start, end):
            driver.event_destroy(e)
        driver.stream_destroy(stream)
        driver.mem_free(src)
        driver.mem_free(dst)


def weight_bytes_read(model: Model, n_tokens: int = 1) -> int:
    """Weight bytes one step of `n_tokens` reads: every weight once, except the token table (one row per
    token, plus all of it when the output is tied to it: the lm_head reads the whole table) and, for MoE,
    only the used experts' share of each expert stack."""
    cfg = model.cfg
    total = 0
    for t in model.tensors():
        if t.name.startswith("cache_"):
            continue
        n = t.nbytes()
        if t.name == "token_embd.weight":
            n = n // cfg.n_vocab * n_tokens + (n if cfg.tied_output else 0)
        elif cfg.is_moe and "_exps." in t.name:
            n = n * min(cfg.n_expert, cfg.n_expert_used * n_tokens) // cfg.n_expert
        total += n
    return total


def kv_bytes_read(cfg: ModelConfig, n_kv: int) -> int:
    """K and V bytes attention reads over n_kv cells, all layers (batch 1)."""
    return 2 * cfg.n_layer * cfg.n_embd_kv * n_kv * KV_BYTES


def roofline_ms(weight_bytes: int, kv_bytes: int, bandwidth: float) -> float:
    return (weight_bytes + kv_bytes) / bandwidth * 1e3

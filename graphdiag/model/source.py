"""Where a run's model comes from: a preset's name, or the path of a GGUF file (model/gguf_io.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import UsageError
from .kv_sizes import N_UBATCH
from .presets import ModelConfig, get_preset, weight_type


def is_file(name: str) -> bool:
    return str(name).endswith(".gguf")


def model_config(name: str) -> ModelConfig:
    """The preset called `name`, or the config of the GGUF file at `name` (every tensor checked)."""
    return _file(name).cfg if is_file(name) else get_preset(name)


def n_ctx_train(name: str) -> int:
    """The model's own context length (llama.cpp's n_ctx_train, which a context of -c 0 takes): a file's
    {arch}.context_length as written, not graphdiag's cap of its cells; a preset's n_ctx."""
    return _file(name).n_ctx_train if is_file(name) else get_preset(name).n_ctx


def _file(name: str):
    """The validated GGUF file at path `name` (model/gguf_io.GgufModel)."""
    from .gguf_io import open_gguf
    return open_gguf(str(Path(name).resolve()))


def prompt_ids(name: str, text: str) -> list[int]:
    """`text` as token ids through the vocabulary of the GGUF file at `name` (model/tokenize.py)."""
    from .tokenize import file_vocab, tokenize
    path = Path(name).resolve()
    st = path.stat()
    return tokenize(file_vocab(str(path), (st.st_size, st.st_mtime_ns)), text)


def check_wtype(name: str, wtype: str, wtype_source: str) -> None:
    """--wtype chooses a preset's weight type; a file's weights have their own types."""
    if is_file(name) and wtype_source not in ("default", ""):
        raise UsageError(f"--wtype {wtype} chooses a preset's weight type; {name} has its own types (drop --wtype)")


def check_backend(name: str, cfg: ModelConfig, backend: str) -> None:
    """A graph backend (cuda, sim, auto) runs attention with flash-attention kernels of a few head sizes: a
    model of another head_dim is refused up front (the CPU backend computes any)."""
    from ..backends.kernels import FA_HEAD_DIMS
    if backend != "cpu" and cfg.head_dim not in FA_HEAD_DIMS:
        raise UsageError(f"model {name}: head_dim {cfg.head_dim} has no flash-attention kernel on the graph "
                         f"backends (head sizes {', '.join(map(str, FA_HEAD_DIMS))}); --backend cpu runs it")


def with_n_ctx(cfg: ModelConfig, n_ctx: int | None) -> ModelConfig:
    """`cfg` with a run's own KV cells (llama.cpp's n_ctx, as a replay takes it from the trace); None: as it is."""
    return cfg if n_ctx is None else dataclasses.replace(cfg, n_ctx=n_ctx)


def build_model(name: str, wtype: str, seed: int = 0, with_data: bool = True, swa_full: bool = False,
                n_seq_max: int = 1, upstream: str = "0c1e57098", n_ubatch: int = N_UBATCH, n_ctx: int | None = None):
    """The Model of a preset (seeded weights) or of a GGUF file (its weights, memory-mapped). A model with a
    sliding window sizes its SWA cache for `n_seq_max` sequences and ubatches of `n_ubatch` tokens, or as
    the global one with `swa_full`; `n_ctx` replaces its KV cells. Its graphs are built by `upstream`'s rules
    (a run's cfg.upstream; the newest by default)."""
    from .weights import create_file_model, create_model
    if is_file(name):
        g = _file(name)
        g = dataclasses.replace(g, cfg=sized(with_n_ctx(g.cfg, n_ctx), swa_full, n_seq_max, n_ubatch))
        return create_file_model(g, with_data, upstream=upstream)
    return create_model(sized(with_n_ctx(get_preset(name), n_ctx), swa_full, n_seq_max, n_ubatch),
                        weight_type(wtype), seed=seed,
                        with_data=with_data, upstream=upstream)


def sized(cfg: ModelConfig, swa_full: bool, n_seq_max: int, n_ubatch: int = N_UBATCH) -> ModelConfig:
    """A sliding-window config with the run's SWA cache sizing (llama_context passes swa_full, n_seq_max and
    n_ubatch to the iSWA cache: kv_sizes.swa_cache_size); any other config as it is."""
    if getattr(cfg, "n_swa", 0) > 0:
        return dataclasses.replace(cfg, swa_full=swa_full, n_seq_max=n_seq_max, n_ubatch=n_ubatch)
    return cfg

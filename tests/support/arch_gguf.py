"""Tiny random-weight GGUF files of each architecture (llama, qwen2, qwen3), written with gguf's writer and
the metadata keys llama.cpp reads, with one thing changed where a test asks (a tensor dropped, a key added)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from graphdiag.ir.dtypes import Q8_0_BLOCK, GGMLType
from graphdiag.model.arch import get_arch
from graphdiag.model.presets import ModelConfig
from graphdiag.model.weights import create_model

# small enough for fast CPU runs; n_embd 128 keeps every row a multiple of 32 (Q8_0)
MINI = ModelConfig("mini", 2, 128, 4, 2, 256, 512, n_ctx=512)
# qwen3 with head_dim 64 != n_embd / n_head (32): wq (128, 256), attn_output (256, 128), as Qwen3 0.6B has
MINI_QWEN3_WIDE = dataclasses.replace(MINI, n_embd_head=64)


def arch_config(arch: str, cfg: ModelConfig = MINI, tied: bool = False) -> ModelConfig:
    """`cfg`'s shapes as architecture `arch` (its preset fields), the output tied to token_embd if `tied`."""
    return dataclasses.replace(get_arch(arch).preset(cfg), tied_output=tied)


def write_arch_gguf(path: Path, arch: str, cfg: ModelConfig = MINI, tied: bool = False, wtype=GGMLType.F16,
                    seed: int = 3, drop: tuple[str, ...] = (), extra: dict | None = None,
                    extra_tensors: dict | None = None) -> Path:
    """A GGUF of arch_config(arch, cfg, tied) with seeded weights; `drop`: tensors left out; `extra`: more
    metadata (key -> int/float/str/list); `extra_tensors`: more tensors (name -> f32 array)."""
    import gguf
    from graphdiag.model.bpe_vocab import write_bpe_vocab
    from graphdiag.model.gguf_io import _write_spm_vocab, write_shape
    c = arch_config(arch, cfg, tied)
    m = create_model(c, wtype, seed=seed)
    w = gguf.GGUFWriter(str(path), arch)
    write_shape(w, c)
    if arch == "llama":
        _write_spm_vocab(w, c.n_vocab, gguf.TokenType)
    else:
        write_bpe_vocab(w, c.n_vocab)
    for k, v in (extra or {}).items():
        add = {int: w.add_uint32, float: w.add_float32, str: w.add_string, list: w.add_array}[type(v)]
        add(k, v)
    for t in m.tensors():
        if t.name.startswith("cache_") or t.name in drop:
            continue
        a = np.ascontiguousarray(m.host[t.name])
        if a.dtype == Q8_0_BLOCK:
            w.add_tensor(t.name, a.view(np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(t.name, a)
    for n, a in (extra_tensors or {}).items():
        w.add_tensor(n, np.ascontiguousarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

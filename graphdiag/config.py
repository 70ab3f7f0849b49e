"""RunConfig, and every environment knob (llama.cpp's names included) read in one place.

Precedence: CLI flag > scenario file > environment > default. Each setting remembers where it came from,
so the run header can show it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import UsageError

DEFAULT_CHUNK_SIZE = 512

# name -> (RunConfig field, parser). Semantics follow llama.cpp exactly.
ENV_KNOBS = {
    # present at all (any value, even "0") disables graphs: getenv(...) != nullptr
    "GGML_CUDA_DISABLE_GRAPHS": ("graphs_disabled", lambda v: True),
    "GGML_CUDA_GRAPH_CHUNK_SIZE": ("chunk_size", lambda v: _atoi(v)),
    "GGML_CUDA_DISABLE_FUSION": ("fusion", lambda v: _atoi(v) == 0),
    "GGML_CUDA_GRAPH_OPT": ("concurrent_streams", lambda v: _atoi(v) == 1),
    "LLAMA_GRAPH_REUSE_DISABLE": ("reuse_disabled", lambda v: _atoi(v) != 0),
}


def _atoi(v: str) -> int:
    """C atoi: leading integer, 0 when there is none."""
    v = v.strip()
    n = ""
    for i, ch in enumerate(v):
        if ch.isdigit() or (i == 0 and ch in "+-"):
            n += ch
        else:
            break
    try:
        return int(n)
    except ValueError:
        return 0


@dataclass
class RunConfig:
    backend: str = "auto"            # "cuda" | "sim" | "cpu" | "auto" (cuda when a GPU is present, else sim)
    model: str = "tiny"
    wtype: str = "f16"               # weight type: "f16" | "q8_0"
    seed: int = 0
    prompt_tokens: int = 16
    steps: int = 32
    batch: int = 1                   # sequences decoded together (n_seqs = n_tokens per decode step)
    chunk_size: int = DEFAULT_CHUNK_SIZE
    fusion: bool = True
    concurrent_streams: bool = False
    graphs_disabled: bool = False
    reuse_disabled: bool = False
    n_cpu_moe: int = 0
    pool_cap: int | None = None      # bytes the temporary pool may hold on the device (None: unlimited)
    pool_max_buffers: int = 256      # cached buffers in the pool (ggml's MAX_BUFFERS)
    compute_capability: str = "9.0"  # simulated driver only
    verify: bool = False             # recompute each replayed step eagerly and compare
    oracle: bool = False             # compare each step's logits with the independent numpy forward
    nvtx: bool = True
    sources: dict[str, str] = field(default_factory=dict)  # field -> "default" | "env NAME" | "cli" | "scenario"

    def validate(self) -> "RunConfig":
        if self.backend not in ("auto", "cuda", "sim", "cpu"):
            raise UsageError(f"unknown backend {self.backend!r} (choose cuda, sim or cpu)")
        if self.chunk_size < 0:
            raise UsageError(f"invalid chunk size {self.chunk_size}: must be >= 0 (0 = one graph per split)")
        if self.wtype not in ("f16", "q8_0"):
            raise UsageError(f"unknown weight type {self.wtype!r} (choose f16 or q8_0)")
        for name in ("prompt_tokens", "batch"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name.replace('_', '-')} must be >= 1")
        if self.steps < 0 or self.n_cpu_moe < 0:
            raise UsageError("steps and n-cpu-moe must be >= 0")
        try:
            major, minor = (int(x) for x in self.compute_capability.split("."))
        except ValueError:
            raise UsageError(f"compute capability {self.compute_capability!r} is not MAJOR.MINOR") from None
        return self

    @property
    def cc_tuple(self) -> tuple[int, int]:
        major, minor = (int(x) for x in self.compute_capability.split("."))
        return major, minor

    def settings(self) -> dict[str, Any]:
        """Plain settings (no sources), for the run header and the diff."""
        d = dataclasses.asdict(self)
        d.pop("sources")
        return d


def resolve(cli: Mapping[str, Any], scenario: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None) -> RunConfig:
    """Build a RunConfig: CLI values (None = not given) win over the scenario, which wins over the env."""
    environ = os.environ if environ is None else environ
    cfg = RunConfig()
    fields = {f.name for f in dataclasses.fields(RunConfig)} - {"sources"}
    cfg.sources = {f: "default" for f in fields}
    for name, (fld, parse) in ENV_KNOBS.items():
        if name in environ:
            setattr(cfg, fld, parse(environ[name]))
            cfg.sources[fld] = f"env {name}"
    for layer, label in ((scenario or {}, "scenario"), (cli, "cli")):
        for k, v in layer.items():
            if v is None:
                continue
            if k not in fields:
                raise UsageError(f"unknown setting {k!r}")
            setattr(cfg, k, v)
            cfg.sources[k] = label
    return cfg.validate()


def kernel_cache_dir(environ: Mapping[str, str] | None = None) -> "Path":
    """Where compiled CUBINs are cached: $GRAPHDIAG_CACHE_DIR, else $XDG_CACHE_HOME/graphdiag/kernels,
    else ~/.cache/graphdiag/kernels."""
    from pathlib import Path
    environ = os.environ if environ is None else environ
    if environ.get("GRAPHDIAG_CACHE_DIR"):
        return Path(environ["GRAPHDIAG_CACHE_DIR"])
    xdg = environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "graphdiag" / "kernels"

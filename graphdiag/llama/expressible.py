"""What real llama.cpp can be asked to do from outside, checked before anything loads.

llama.cpp takes a batch per llama_decode, sleeps between calls and reads its environment; so a plan's batch
changes, sequences joining and leaving, n_kv growth, prefills, idle time, the graph environment variables
and graph reuse off can be expressed. What graphdiag models inside its own runtime cannot: moved graph
arenas, a draft model's own context, injected driver faults, chunked capture, a capped pool, a simulated
compute capability, MoE CPU offload, layer splits, the article's pool invalidation, another
upstream's rules. Each is refused in one line naming it.
"""

from __future__ import annotations

from pathlib import Path

from ..config import UPSTREAMS, RunConfig
from ..errors import UsageError
from ..model.arch.common import N_CTX_MAX

# timeline entry -> why llama.cpp cannot be made to do it
TIMELINE_REFUSED = {
    "new_arena_every": "llama.cpp's graph metadata buffer cannot be moved from outside",
    "separate_arena_batch": "a draft model's own context is a second llama_context, not part of this plan",
    "fault": "llama.cpp's CUDA calls cannot be made to fail from outside",
}
# setting -> (its default, why llama.cpp has no such setting)
SETTINGS_REFUSED = {
    "chunk_size": ((0,), "upstream captures each split as one graph (no chunk size)"),
    "upstream": ((UPSTREAMS[0],), f"llama.cpp through llama-cpp-python is {UPSTREAMS[0]}: its decisions cannot "
                                  f"be held against another commit's rules"),
    "n_cpu_moe": ((0,), "MoE CPU offload is not driven by graphdiag llama"),
    "devices": ((1,), "graphdiag llama runs on one GPU"),
    "tensor_split": ((None,), "graphdiag llama runs on one GPU"),
    "pool_cap": ((None,), "ggml's pool has no cap to set"),
    "pool_max_buffers": ((256,), "ggml's MAX_CUDA_BUFFERS is compiled in"),
    "pool_invalidation": ((False,), "upstream's pool never invalidates graphs (the design article's rule)"),
    "compute_capability": (("9.0",), "the GPU's own compute capability applies"),
    "sim_mode": ((None,), "llama.cpp runs on the GPU, not the simulated driver"),
    "verify": ((False,), "llama.cpp's replays cannot be recomputed eagerly from outside"),
    "oracle": ((False,), "graphdiag's numpy oracle computes graphdiag's models, not llama.cpp's logits"),
}
ENV_OF = {"graphs_disabled": "GGML_CUDA_DISABLE_GRAPHS", "fusion": "GGML_CUDA_DISABLE_FUSION",
          "concurrent_streams": "GGML_CUDA_GRAPH_OPT", "reuse_disabled": "LLAMA_GRAPH_REUSE_DISABLE",
          "pdl": "GGML_CUDA_PDL"}


def check_expressible(cfg: RunConfig, scenario=None) -> None:
    """UsageError naming the first timeline entry or setting llama.cpp cannot express."""
    for i, item in enumerate(getattr(scenario, "timeline", None) or []):
        for k in item.keys():
            if k in TIMELINE_REFUSED:
                where = f"scenario {scenario.name}: timeline entry {i + 1} (at_step {item['at_step']}, {k})"
                raise UsageError(f"{where} cannot run on real llama.cpp: {TIMELINE_REFUSED[k]}")
    for name, (defaults, why) in SETTINGS_REFUSED.items():
        value = getattr(cfg, name)
        if value not in defaults and cfg.sources.get(name, "default") != "default":
            raise UsageError(f"{name.replace('_', '-')} {value} ({cfg.sources[name]}) cannot be given to real "
                             f"llama.cpp: {why}")


def llama_env(cfg: RunConfig) -> dict[str, str]:
    """The llama.cpp/ggml environment a run's settings mean (set before llama.cpp loads: ggml reads most of
    them once per process). Values given in the environment are passed as they are."""
    env = dict(getattr(cfg, "env_values", {}))
    if cfg.graphs_disabled:
        env.setdefault("GGML_CUDA_DISABLE_GRAPHS", "1")
    if not cfg.fusion:
        env.setdefault("GGML_CUDA_DISABLE_FUSION", "1")
    if cfg.concurrent_streams:
        env.setdefault("GGML_CUDA_GRAPH_OPT", "1")
    if cfg.reuse_disabled:
        env.setdefault("LLAMA_GRAPH_REUSE_DISABLE", "1")
    if not cfg.pdl:
        env.setdefault("GGML_CUDA_PDL", "0")
    env.pop("GGML_CUDA_GRAPH_CHUNK_SIZE", None)      # graphdiag's own knob: llama.cpp has none
    return env


def check_gguf(path: str) -> Path:
    """The model argument: an existing GGUF file (its magic checked), else one UsageError line."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: no such file (graphdiag llama runs a GGUF file; graphdiag export-gguf --model "
                         f"tiny OUT.gguf writes one)")
    if not p.is_file():
        raise UsageError(f"{path}: not a file")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from None
    if magic != b"GGUF":
        raise UsageError(f"{path}: not a GGUF file (no GGUF magic)")
    return p


def context_length(path: Path) -> int:
    """KV cells for llama.cpp's context: the file's context length capped as graphdiag caps it, so both
    runs pad n_kv against the same cache size (graphdiag's own reading where it reads the file)."""
    from ..errors import GraphdiagError
    from ..model.source import model_config
    try:
        return model_config(str(path)).n_ctx
    except GraphdiagError:
        pass                                   # an architecture graphdiag does not build: llama.cpp may still run it
    import gguf
    r = gguf.GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    n = _field(r, f"{arch}.context_length") if arch else None
    return min(int(n), N_CTX_MAX) if n else N_CTX_MAX


def _field(r, key: str):
    f = r.fields.get(key)
    if f is None:
        return None
    v = f.parts[f.data[0]]
    return bytes(v).decode("utf-8") if f.types and f.types[0].name == "STRING" else v[0]

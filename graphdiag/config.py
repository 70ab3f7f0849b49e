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

DEFAULT_CHUNK_SIZE = 0      # one CUDA graph per split, as upstream; N > 0 is the design article's chunked capture
ARTICLE_CHUNK_SIZE = 512    # the chunk size the design article uses (`--chunk-size 512` shows it)
# the design article's rules graphdiag can follow on request, none of them in upstream llama.cpp
# (/work/shared/notes/serving-and-tracing.md): setting -> the words the header, the summary and the record use
ARTICLE_RULES = {
    "chunk_size": "chunked capture: the design article's rule, not in upstream llama.cpp",
    "pool_invalidation": "graph invalidation on a pool flush: the design article's rule, not in upstream llama.cpp",
}
MAX_SEED = 2**63 - 1
CC_MAJOR = (1, 15)          # compute capabilities a CUDA device could report (sm_10 .. sm_15x)
# --wtype names: model.presets.WEIGHT_TYPES's keys (it maps them to ggml types; it is on the engine floor and
# imports numpy, which checking a setting, e.g. listing the scenarios, must not)
# the upstream commits whose rules graphdiag can follow (--upstream): the newest first, the default
UPSTREAMS = ("0c1e57098", "d99724f2")
UPSTREAM_DATES = {"0c1e57098": "llama.cpp 0c1e57098 (2026-10-01, b11312)", "d99724f2": "ggml d99724f2 (2026-08-21)"}
from .plan import N_BATCH, N_UBATCH   # llama.cpp's default n_batch and n_ubatch (plan.py)
WTYPES = ("f16", "q8_0", "f32", "bf16", "q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q3_k",
          "q4_1", "iq4_nl", "iq4_xs", "q2_k", "q3_k_m", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "mxfp4_moe")

# name -> (RunConfig field, parser). Semantics follow llama.cpp exactly.
ENV_KNOBS = {
    # present at all (any value, even "0") disables graphs: getenv(...) != nullptr
    "GGML_CUDA_DISABLE_GRAPHS": ("graphs_disabled", lambda v: True),
    "GGML_CUDA_GRAPH_CHUNK_SIZE": ("chunk_size", lambda v: _atoi(v)),
    "GGML_CUDA_DISABLE_FUSION": ("fusion", lambda v: _atoi(v) == 0),
    "GGML_CUDA_GRAPH_OPT": ("concurrent_streams", lambda v: _atoi(v) == 1),
    "LLAMA_GRAPH_REUSE_DISABLE": ("reuse_disabled", lambda v: _atoi(v) != 0),
    # unset, or atoi != 0: kernels launched with programmatic dependent launch where the GPU has it (9.0+)
    "GGML_CUDA_PDL": ("pdl", lambda v: _atoi(v) != 0),
}


# knobs llama.cpp reads as on/off with atoi: name -> (what it turns on or off, True where atoi != 0 means off).
# A value other than 0 or 1 is read as atoi reads it ("yes", "off", "true" are 0; "2" is not), and said so.
ATOI_SWITCHES = {"GGML_CUDA_PDL": ("PDL", False), "GGML_CUDA_DISABLE_FUSION": ("fusion", True),
                 "GGML_CUDA_GRAPH_OPT": ("concurrent streams", False),
                 "LLAMA_GRAPH_REUSE_DISABLE": ("graph reuse", True)}
FLT_MAX, FLT_MIN = 3.4028234663852886e38, 1.1754943508222875e-38   # float32's largest, smallest normal


def _atoi(v: str) -> int:
    """C atoi (glibc, 64-bit long): leading integer, 0 when there is none, wrapped to a C int."""
    v = v.lstrip(" \t\n\v\f\r")
    n = ""
    for i, ch in enumerate(v):
        if ch in "0123456789" or (i == 0 and ch in "+-"):
            n += ch
        else:
            break
    try:
        v = int(n)
    except ValueError:
        return 0
    # glibc atoi is (int)strtol: strtol clamps to the 64-bit long range, the cast keeps the low 32 bits
    v = max(-(1 << 63), min((1 << 63) - 1, v)) & 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


@dataclass
class RunConfig:
    backend: str = "auto"            # "cuda" | "sim" | "cpu" | "auto" (cuda when a GPU is present, else sim)
    model: str = "tiny"
    wtype: str = "f16"               # weight type: a model.presets.WEIGHT_TYPES name ("f16", "q8_0", "q4_k", ...)
    seed: int = 0
    prompt_tokens: int = 16
    prompt_ids: tuple | None = None  # the prompt's token ids (--prompt-ids), each sequence's; None: seeded random
    prompt: str | None = None        # the prompt as text (--prompt), tokenized through the model file's vocabulary
    steps: int = 32
    batch: int = 1                   # sequences decoded together (n_seqs = n_tokens per decode step)
    chunk_size: int = DEFAULT_CHUNK_SIZE
    fusion: bool = True
    concurrent_streams: bool = False
    pdl: bool = True                 # programmatic dependent launch on 9.0+ (GGML_CUDA_PDL, on by default)
    graphs_disabled: bool = False
    reuse_disabled: bool = False
    swa_full: bool = False           # a full-size SWA cache (llama.cpp's swa_full; off as llama-server, on in its C API)
    n_cpu_moe: int = 0
    devices: int = 1                 # GPUs the layers are split across (llama.cpp --split-mode layer)
    tensor_split: tuple | None = None  # share of the layers per device (--tensor-split); None: by free memory
    pool_cap: int | None = None      # bytes the temporary pool may hold on the device (None: unlimited)
    pool_max_buffers: int = 256      # cached buffers in the pool (ggml's MAX_BUFFERS)
    pool_invalidation: bool = False  # the article's rule: a pool flush invalidates every graph (upstream: none)
    compute_capability: str = "9.0"  # simulated driver only
    verify: bool = False             # recompute each replayed step eagerly and compare
    oracle: bool = False             # compare each step's logits with the independent numpy forward
    sim_mode: str | None = None      # simulated driver: "compute" | "decisions" (None: sim_mode.sim_mode decides)
    nvtx: bool = True
    upstream: str = UPSTREAMS[0]     # the upstream commit whose rules the run follows (UPSTREAMS)
    ubatch_size: int = N_UBATCH      # llama.cpp's n_ubatch: a longer prompt is decoded in ubatches of this many tokens
    n_ctx: int | None = None         # KV cells (llama.cpp's n_ctx; a replay's: the traced context's); None: the model's
    sources: dict[str, str] = field(default_factory=dict)  # field -> "default" | "env NAME" | "cli" | "scenario"

    def validate(self) -> "RunConfig":
        """Each setting on its own (combinations and the plan: `validate_run`). A bad value's message names
        where it came from when that was not the command line (an environment variable, a scenario)."""
        if self.backend not in ("auto", "cuda", "sim", "cpu"):
            self._fail("backend", f"unknown backend {self.backend!r} (choose cuda, sim or cpu)")
        if self.chunk_size < 0 and not self.sources.get("chunk_size", "").startswith("env "):
            # GGML_CUDA_GRAPH_CHUNK_SIZE is atoi'd and only tested `> 0` (a negative value: one graph per
            # split, as 0); only an explicit --chunk-size / scenario value is refused
            self._fail("chunk_size", f"invalid chunk size {self.chunk_size}: must be >= 0 (0 = one graph per split)")
        if self.sim_mode not in (None, "compute", "decisions"):
            self._fail("sim_mode", f"unknown sim mode {self.sim_mode!r} (choose compute or decisions)")
        if self.upstream not in UPSTREAMS:
            self._fail("upstream", f"unknown upstream {self.upstream!r} (choose {', '.join(UPSTREAMS)})")
        if not isinstance(self.ubatch_size, int) or isinstance(self.ubatch_size, bool) \
                or not 1 <= self.ubatch_size <= N_BATCH:
            self._fail("ubatch_size", f"ubatch-size must be between 1 and n_batch ({N_BATCH}), not {self.ubatch_size!r}")
        if self.n_ctx is not None and (not isinstance(self.n_ctx, int) or isinstance(self.n_ctx, bool)
                                       or self.n_ctx < 1):
            self._fail("n_ctx", f"n_ctx must be a positive number of KV cells, not {self.n_ctx!r}")
        if self.wtype.lower() not in WTYPES:
            self._fail("wtype", f"unknown weight type {self.wtype!r} (choose {', '.join(WTYPES)})")
        self._check_prompt_ids()
        if self.prompt is not None:
            self._check_prompt()
        for name in ("prompt_tokens", "batch"):
            if getattr(self, name) < 1:
                self._fail(name, f"{name.replace('_', '-')} must be >= 1, not {getattr(self, name)}")
        for name in ("steps", "n_cpu_moe", "pool_max_buffers"):
            if getattr(self, name) < 0:
                self._fail(name, f"{name.replace('_', '-')} must be >= 0, not {getattr(self, name)}")
        self._check_devices()
        if not 0 <= self.seed <= MAX_SEED:
            self._fail("seed", f"seed must be between 0 and {MAX_SEED}, not {self.seed}")
        if self.pool_cap is not None and self.pool_cap < 0:
            self._fail("pool_cap", f"pool-cap must be >= 0 bytes, not {self.pool_cap}")
        try:
            major, minor = (int(x) for x in self.compute_capability.split("."))
        except ValueError:
            self._fail("compute_capability",
                       f"compute capability {self.compute_capability!r} is not MAJOR.MINOR")
        if not (CC_MAJOR[0] <= major <= CC_MAJOR[1] and 0 <= minor <= 9):
            self._fail("compute_capability", f"compute capability {self.compute_capability} is not a plausible "
                       f"CUDA device (major {CC_MAJOR[0]}–{CC_MAJOR[1]}, minor 0–9, e.g. 6.1 or 9.0)")
        return self

    def _check_prompt_ids(self) -> None:
        """--prompt-ids "2,651,..." (or a scenario's list): non-negative token ids, as many as --prompt-tokens
        if that is given too; they set prompt_tokens. That they are in the vocabulary is validate_run's."""
        ids = self.prompt_ids
        if ids is None:
            return
        items = ids.split(",") if isinstance(ids, str) else list(ids)
        try:
            parsed = tuple(int(x) for x in items if not isinstance(x, bool))
        except (TypeError, ValueError):
            parsed = ()
        if not parsed or len(parsed) != len(items) or min(parsed) < 0:
            self._fail("prompt_ids", f"prompt-ids {ids!r} is not a list of token ids (e.g. 2,651,1030)")
        if self.sources.get("prompt_tokens", "default") != "default" and self.prompt_tokens != len(parsed):
            self._fail("prompt_tokens", f"prompt-tokens {self.prompt_tokens} and prompt-ids ({len(parsed)} ids) "
                       f"disagree: give one")
        self.prompt_ids, self.prompt_tokens = parsed, len(parsed)

    def _check_prompt(self) -> None:
        """--prompt TEXT: not empty, not with --prompt-ids (two prompts); its ids come in validate_run."""
        if self.prompt_ids is not None:
            self._fail("prompt", "prompt and prompt-ids both give the prompt: give one")
        if not self.prompt:
            self._fail("prompt", "prompt is empty (give some text, or --prompt-ids)")

    def _check_devices(self) -> None:
        """--devices N >= 1; --tensor-split only with N > 1: N shares, none negative (all 0: by free memory)."""
        if self.devices < 1:
            self._fail("devices", f"devices must be >= 1, not {self.devices}")
        if self.tensor_split is None:
            return
        shares = parse_tensor_split(self.tensor_split)
        if shares is None:
            self._fail("tensor_split", f"tensor-split {self.tensor_split!r} is not a list of numbers (e.g. 3,1)")
        self.tensor_split = shares
        given = ",".join(f"{x:g}" for x in shares)
        if self.devices < 2:
            self._fail("tensor_split", f"tensor-split {given} needs devices 2 or more (it shares the layers "
                       f"between devices)")
        if len(shares) != self.devices:
            self._fail("tensor_split", f"tensor-split {given} has {len(shares)} values for devices "
                       f"{self.devices} (one share per device)")
        if any(x < 0 for x in shares):
            self._fail("tensor_split", f"tensor-split {given}: shares must not be negative")
        if any(x and not FLT_MIN <= x <= FLT_MAX for x in shares) or sum(shares) > FLT_MAX:
            # llama.cpp reads each share with std::stof and sums them as floats: these would overflow (or
            # round to 0) there, and the split points come out as NaN
            self._fail("tensor_split", f"tensor-split {given}: the shares must fit llama.cpp's 32-bit floats "
                       f"(each 0 or {FLT_MIN:.2g} to {FLT_MAX:.2g}, and so must their sum): use numbers like 3,1")

    def _fail(self, name: str, msg: str):
        src = self.sources.get(name, "default")
        if src.startswith("env "):
            origin = getattr(self, "env_origins", {}).get(src[4:])
            raise UsageError(f"{msg} (from {src}{', set in ' + origin if origin else ''})")
        raise UsageError(msg)

    def article_rules(self, gpu: bool = True) -> list[str]:
        """The design article's rules this run follows (ARTICLE_RULES' words), in order; none by default, and
        none without a GPU backend (`gpu` False: nothing is captured, no pool)."""
        return [ARTICLE_RULES[name] for name in ARTICLE_RULES if gpu and self._article_on(name)]

    def rules(self, gpu: bool = True) -> str:
        """What ran, for the header: "upstream 0c1e57098" alone, or with the article's rules named after it
        ("upstream 0c1e57098 + article: chunked capture (512), graph invalidation on a pool flush")."""
        parts = [f"chunked capture ({self.chunk_size})" if name == "chunk_size" else "graph invalidation on a pool flush"
                 for name in ARTICLE_RULES if gpu and self._article_on(name)]
        return f"upstream {self.upstream}" + (f" + article: {', '.join(parts)}" if parts else "")

    def _article_on(self, name: str) -> bool:
        # a chunk size <= 0 (GGML_CUDA_GRAPH_CHUNK_SIZE is atoi'd, only `> 0` chunks) captures one graph per split
        return self.chunk_size > 0 if name == "chunk_size" else bool(self.pool_invalidation)

    @property
    def cc_tuple(self) -> tuple[int, int]:
        major, minor = (int(x) for x in self.compute_capability.split("."))
        return major, minor

    @property
    def cc(self) -> int:
        """The compute capability as ggml encodes it (9.0 -> 900), as Driver.cc."""
        major, minor = self.cc_tuple
        return major * 100 + minor * 10

    def settings(self) -> dict[str, Any]:
        """Plain settings (no sources), for the run header and the diff."""
        d = dataclasses.asdict(self)
        d.pop("sources")
        if self.tensor_split is not None:       # as given: "3,1"
            d["tensor_split"] = ",".join(f"{x:g}" for x in self.tensor_split)
        if self.prompt_ids is None:
            d.pop("prompt_ids")                 # the seeded random prompt (records before it had no such key)
        if self.prompt is None:
            d.pop("prompt")                     # records before --prompt had no such key
        if self.n_ctx is None:
            d.pop("n_ctx")                      # the model's (records before n_ctx had no such key)
        return d


def parse_tensor_split(value) -> tuple[float, ...] | None:
    """"3,1" (the CLI, llama.cpp's comma list) or [3, 1] (a scenario) -> (3.0, 1.0); None if not numbers."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        shares = tuple(float(x) for x in items if not isinstance(x, bool))
    except (TypeError, ValueError):
        return None
    if not shares or len(shares) != len(items) or any(x != x or x in (float("inf"), float("-inf")) for x in shares):
        return None
    return shares


def resolve(cli: Mapping[str, Any], scenario: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None, env_origins: Mapping[str, str] | None = None) -> RunConfig:
    """Build a RunConfig: CLI values (None = not given) win over the scenario, which wins over the env.
    `env_origins` says where an environment variable was set when not by the user (a scenario's [env]
    line), so a bad value's message can name it."""
    environ = os.environ if environ is None else environ
    cfg = RunConfig()
    cfg.env_origins = dict(env_origins or {})
    cfg.env_values = {name: environ[name] for name in ENV_KNOBS if name in environ}   # as given, for messages
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


# The BLAS thread knobs numpy's BLAS reads when it loads, in the order OpenBLAS honours them (MKL: its own, then OMP)
BLAS_ENV = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
MAX_BLAS_THREADS = 8
_blas_applied: "BlasThreads | None" = None


@dataclass(frozen=True)
class BlasThreads:
    """What numpy's BLAS was told: `threads` (None: not told, its own default of one per core), the usable
    `cores`, and `source`: "default" (graphdiag's), "env NAME" (the user's), or "not set"."""

    threads: int | None
    cores: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """e.g. "1 (2 cores; graphdiag's default for <= 2 cores)"."""
        if self.source == "default":
            rule = "<= 2 cores" if self.cores <= 2 else f"half the cores, at most {MAX_BLAS_THREADS}"
            return f"{self.threads} ({self.cores} cores; graphdiag's default: {rule})"
        if self.source.startswith("env "):
            return f"{self.threads} ({self.cores} cores; {self.source})"
        return f"BLAS default, one per core ({self.cores} cores; not set before numpy loaded)"


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask: a container's share), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_blas_threads(cores: int) -> int:
    """One BLAS thread on <= 2 cores, else half the cores, at most MAX_BLAS_THREADS. Why: the simulator's and
    the oracle's products are mostly mat-vecs (memory-bound: more threads add little), OpenBLAS threads spin
    while they wait, and they compete with the run's own host thread and anything else on the machine — a
    CPU-oracle run on a busy 2-core machine ran 3x faster with one BLAS thread than with two."""
    return 1 if cores <= 2 else min(cores // 2, MAX_BLAS_THREADS)


def _user_blas(environ: Mapping[str, str], cores: int) -> "BlasThreads | None":
    for name in BLAS_ENV:
        if environ.get(name, "").strip():
            return BlasThreads(_atoi(environ[name]) or None, cores, f"env {name}")
    return None


def apply_blas_threads(environ=None, cores: int | None = None) -> BlasThreads:
    """Tell numpy's BLAS how many threads to use, before numpy loads (the CLI entry calls this first): a
    thread count the user set in BLAS_ENV wins and is left alone; else default_blas_threads goes into every
    BLAS_ENV name. Returns (and remembers, for the run header) what applies."""
    import sys
    global _blas_applied
    environ = os.environ if environ is None else environ
    cores = usable_cores() if cores is None else cores
    got = _user_blas(environ, cores)
    if got is None and "numpy" not in sys.modules:
        n = default_blas_threads(cores)
        for name in BLAS_ENV:
            environ[name] = str(n)
        got = BlasThreads(n, cores, "default")
    _blas_applied = got if got is not None else BlasThreads(None, cores, "not set")
    return _blas_applied


def blas_threads(environ: Mapping[str, str] | None = None) -> BlasThreads:
    """What numpy's BLAS was told (the header says it): apply_blas_threads's result, else the environment's."""
    if _blas_applied is not None:
        return _blas_applied
    cores = usable_cores()
    return _user_blas(os.environ if environ is None else environ, cores) or BlasThreads(None, cores, "not set")


def debug_requested(environ: Mapping[str, str] | None = None) -> bool:
    """GRAPHDIAG_DEBUG set to anything but "", "0": internal errors show their traceback."""
    environ = os.environ if environ is None else environ
    return environ.get("GRAPHDIAG_DEBUG", "") not in ("", "0")


# options that only act on the CUDA-graph runtime: on --backend cpu they would do nothing
GPU_ONLY = {"verify": "--verify", "chunk_size": "--chunk-size", "pool_invalidation": "--pool-invalidation", "compute_capability": "--cc",
            "concurrent_streams": "--concurrent-streams", "fusion": "--no-fusion", "graphs_disabled": "--no-graphs",
            "pool_cap": "--pool-cap", "pool_max_buffers": "--pool-max-buffers", "devices": "--devices",
            "tensor_split": "--tensor-split"}


def validate_run(cfg: RunConfig, scenario=None, as_json: bool = False, verbosity: int = 0) -> list[str]:
    """Every check a run needs before anything is built: the model preset, options that cannot act on the
    chosen backend, the scenario's timeline against the resolved steps, the KV cells the plan needs, the
    smallest pool cap that can work. Raises UsageError; returns warnings (one line each)."""
    from .model.source import check_backend, check_wtype, model_config, with_n_ctx
    from .plan import kv_demand, plan_steps

    warnings: list[str] = []
    if verbosity and as_json:
        raise UsageError("-v prints the event log, which --json does not print: drop one "
                         "(--events FILE keeps every event)")
    model = with_n_ctx(model_config(cfg.model), cfg.n_ctx)
    check_wtype(cfg.model, cfg.wtype, cfg.sources.get("wtype", "default"))
    check_backend(cfg.model, model, cfg.backend)
    if cfg.prompt is not None:
        tokenize_prompt(cfg, scenario)
    if cfg.prompt_ids and max(cfg.prompt_ids) >= model.n_vocab:
        raise UsageError(f"prompt-ids: token {max(cfg.prompt_ids)} is outside model {cfg.model}'s vocabulary of "
                         f"{model.n_vocab} tokens")
    if cfg.n_cpu_moe and not model.is_moe:
        raise UsageError(f"{_named(cfg, scenario, 'n_cpu_moe', '--n-cpu-moe')} {cfg.n_cpu_moe}: model {cfg.model} "
                         f"has no experts (a MoE preset: moe-tiny)")
    if cfg.n_cpu_moe > model.n_layer:
        raise UsageError(f"{_named(cfg, scenario, 'n_cpu_moe', '--n-cpu-moe')} {cfg.n_cpu_moe}: model "
                         f"{cfg.model} has {model.n_layer} layers")
    warnings += _backend_options(cfg, scenario)
    warnings += _check_sim_mode(cfg, scenario, model)
    warnings += _one_device_options(cfg, scenario) + _env_readings(cfg) + _scenario_overrides(cfg, scenario)
    _check_timeline(cfg, scenario)
    _check_faults(cfg, scenario)
    if cfg.prompt_tokens * cfg.batch > model.n_ctx:    # before the plan is built: it lists every prompt ubatch
        raise UsageError(f"the run needs more KV cells than model {cfg.model} has (n_ctx {model.n_ctx}): the "
                         f"prompts alone need {cfg.prompt_tokens * cfg.batch} (prompt-tokens {cfg.prompt_tokens} "
                         f"× batch {cfg.batch}); lower --batch or --prompt-tokens")
    demand = kv_demand(plan_steps(cfg, scenario), model.n_ctx)
    _check_decode_ubatches(cfg, scenario, demand)
    if demand.overflow_step is not None:
        raise UsageError(f"the run needs more KV cells than model {cfg.model} has (n_ctx {model.n_ctx}): step "
                         f"{demand.overflow_step} would need {demand.cells} (prompt-tokens {cfg.prompt_tokens} × "
                         f"batch {cfg.batch} prefilled, then one cell per sequence per decode step); lower "
                         f"--steps, --batch or --prompt-tokens")
    if getattr(model, "n_swa", 0) > 0:
        _check_swa_cells(cfg, model, demand)
    if cfg.backend != "cpu" and cfg.pool_cap is not None:
        need, step = min_pool_cap(demand, model, cfg.wtype, cfg.cc)
        if cfg.pool_cap < need:
            raise UsageError(f"{_named(cfg, scenario, 'pool_cap', '--pool-cap')} {cfg.pool_cap} is below the "
                             f"smallest cap that can work for this run: {need} bytes (the largest scratch "
                             f"request, at step {step}, with the pool's 5 % look-ahead)")
    if cfg.verify and cfg.graphs_disabled:
        warnings.append(f"{_named(cfg, scenario, 'verify', '--verify')} checks replayed steps, and graphs are "
                        f"disabled ({_named(cfg, scenario, 'graphs_disabled', '--no-graphs')}): nothing to verify")
    return warnings


def _check_decode_ubatches(cfg: RunConfig, scenario, demand) -> None:
    """A decode step of more sequences than n_ubatch would be split into several ubatches by llama.cpp;
    graphdiag splits only prompts, so such a run is refused up front."""
    for step, p, _ in demand.steps:
        if p.kind == "decode" and p.batch > cfg.ubatch_size:
            raise UsageError(f"step {step} decodes {p.batch} sequences, more than "
                             f"{_named(cfg, scenario, 'ubatch_size', '--ubatch-size')} {cfg.ubatch_size}: llama.cpp "
                             f"would split it into ubatches, which graphdiag does not model for decode steps")


def _check_swa_cells(cfg: RunConfig, model, demand) -> None:
    """A sliding-window model: every step's tokens find cells in the SWA cache, walked with the cells'
    own rules (sched/swa_cells.py), so a prefill longer than the cache can take is refused up front
    (each prompt ubatch is a step of its own, as llama.cpp splits a prompt into n_ubatch ones)."""
    import numpy as np

    from .model.source import sized
    from .plan import max_sequences
    from .sched.swa_cells import SwaKvCells
    size = sized(model, cfg.swa_full, max_sequences(p for _, p, _ in demand.steps), cfg.ubatch_size).swa_size
    cells, nxt = SwaKvCells(size, model.n_swa), {}
    for step, p, _ in demand.steps:
        seqs = [p.seq] * p.n_tokens if p.kind == "prefill" else list(range(p.batch))
        pos = [nxt.get(q, 0) + i for i, q in enumerate(seqs)] if p.kind == "prefill" else [nxt.get(q, 0) for q in seqs]
        try:
            cells.place(np.array(seqs, np.int32), np.array(pos, np.int32))
        except UsageError:
            raise UsageError(f"step {step} ({p.tokens} tokens) does not fit model {cfg.model}'s SWA KV cache "
                             f"({size} cells, window {model.n_swa}); lower --prompt-tokens or --batch, or "
                             f"use --swa-full") from None
        for q, ps in zip(seqs, pos):
            nxt[q] = ps + 1


def tokenize_prompt(cfg: RunConfig, scenario) -> None:
    """--prompt TEXT -> cfg.prompt_ids through the model file's vocabulary (model/tokenize.py), as llama.cpp's
    llama_tokenize(add_special, parse_special) would; a preset has no real vocabulary: refused."""
    from .model.source import is_file, prompt_ids
    flag = _named(cfg, scenario, "prompt", "--prompt")
    if not is_file(cfg.model):
        raise UsageError(f"{flag} needs a model file's vocabulary, and preset {cfg.model}'s pieces are "
                         f"placeholders: give --prompt-ids, or --model FILE.gguf")
    ids = prompt_ids(cfg.model, cfg.prompt)
    if cfg.sources.get("prompt_tokens", "default") != "default" and cfg.prompt_tokens != len(ids):
        raise UsageError(f"{_named(cfg, scenario, 'prompt_tokens', '--prompt-tokens')} {cfg.prompt_tokens} and "
                         f"{flag} ({len(ids)} tokens) disagree: give one")
    cfg.prompt_ids, cfg.prompt_tokens = tuple(ids), len(ids)
    cfg.sources["prompt_ids"] = cfg.sources.get("prompt", "cli")


def min_pool_cap(demand, model, wtype: str = "f16", cc: int = 900) -> tuple[int, int]:
    """(bytes, step): the largest pool buffer one step asks for. The pool frees every cached buffer and
    retries when a request does not fit, so the run works iff the cap holds its largest single request,
    over-allocated by LOOK_AHEAD: the flash-attention scratch (geometry.fa_plan: the split-KV partials) or,
    with Q8_0 (or another block type's) weights, the Q8_1 copy of a mat-mul's activations (36 bytes per 32 values).
    `cc`: the device's compute capability (which flash-attention kernel runs: geometry.fa_takes_vec; the
    simulated driver's setting, a GPU's own on CUDA)."""
    from .backends.geometry import fa_plan, fa_takes_vec
    from .backends.gpu.pool import LOOK_AHEAD
    from .model.build import padded_n_kv
    from .model.presets import base_type, weight_type
    from .quants import q8_1_activations

    best, at = 0, -1
    widest = max(model.n_embd, model.n_ff, model.n_ff_exp)
    for step, p, cells in demand.steps:
        n_kv = padded_n_kv(cells, model.n_ctx)
        vec = fa_takes_vec(model.head_dim, model.n_head, model.n_head_kv, n_kv, p.tokens, 1, cc)
        size = fa_plan(model.head_dim, model.n_head, model.n_head_kv, n_kv, p.tokens, 1, vec)[3]
        if q8_1_activations(base_type(weight_type(wtype))):      # Q8_0 and every other block type (MMVQ/MMQ)
            size = max(size, 36 * (widest // 32) * p.tokens)
        want = max(int(size * LOOK_AHEAD + 255) // 256 * 256, 256)
        if want > best:
            best, at = want, step
    return best, at


def _named(cfg: RunConfig, scenario, name: str, flag: str) -> str:
    """How a message names a setting: the flag, or the scenario line or env variable that set it."""
    src = cfg.sources.get(name, "default")
    if src == "scenario" and scenario is not None:
        return f"{name} ({scenario.where('run.' + name)})"
    if src.startswith("env "):
        origin = getattr(cfg, "env_origins", {}).get(src[4:])
        return f"{name} ({src}{', set in ' + origin if origin else ''})"
    return flag


def _backend_options(cfg: RunConfig, scenario) -> list[str]:
    """On --backend cpu, a GPU-only option given on the command line is an error; set by a scenario, a
    warning (the environment's knobs apply to every backend, as in llama.cpp, and pass silently)."""
    warnings = []
    if cfg.backend == "cuda" and cfg.sources.get("compute_capability") == "cli":
        raise UsageError("--cc sets the SIMULATED GPU's compute capability; --backend cuda uses the real "
                         "device's (use --backend sim)")
    if cfg.backend != "cpu":
        return warnings
    for name, flag in GPU_ONLY.items():
        src = cfg.sources.get(name, "default")
        if src == "cli":
            raise UsageError(f"{flag} does nothing on --backend cpu (no CUDA graphs there): drop it or choose "
                             f"--backend sim or cuda")
        if src == "scenario":
            warnings.append(f"{_named(cfg, scenario, name, flag)} does nothing on --backend cpu (ignored)")
    return warnings


def _check_faults(cfg: RunConfig, scenario) -> None:
    """A fault fails a GPU driver call: the CPU backend has none to fail."""
    for change in getattr(scenario, "timeline", ()) or ():
        if change.get("fault") and cfg.backend == "cpu":
            raise UsageError(f"{scenario.path}:{change.line or 1}: fault {change['fault']!r} at step "
                             f"{change.at_step} fails a GPU driver call, and the cpu backend has no driver "
                             f"(use --backend sim or cuda)")


def _check_sim_mode(cfg: RunConfig, scenario, model) -> list[str]:
    """--sim-mode acts on the simulated driver only; decisions-only computes nothing, so it cannot go with
    --verify/--oracle (they compare computed results) nor with a MoE model (the expert routing the sorted
    MUL_MAT_ID fallback reads back decides its launches). A scenario's value on cuda/cpu is ignored."""
    if cfg.sim_mode is None:
        return []
    flag = _named(cfg, scenario, "sim_mode", "--sim-mode")
    if cfg.backend in ("cuda", "cpu"):
        if cfg.sources.get("sim_mode") == "scenario":
            return [f"{flag} acts on the simulated driver only: ignored on --backend {cfg.backend}"]
        raise UsageError(f"{flag} {cfg.sim_mode} acts on the simulated driver only: --backend {cfg.backend} has "
                         f"none (use --backend sim, or drop it)")
    if cfg.sim_mode != "decisions":
        return []
    for name, on in (("verify", cfg.verify), ("oracle", cfg.oracle)):
        if on:
            raise UsageError(f"{flag} decisions computes no results, and {_named(cfg, scenario, name, '--' + name)} "
                             f"compares them: drop one (--sim-mode compute computes every kernel)")
    if model.is_moe:
        raise UsageError(f"{flag} decisions: model {cfg.model} routes tokens to experts by computed values, which "
                         f"decide the MoE fallback's launches (use --sim-mode compute)")
    return []


def _check_timeline(cfg: RunConfig, scenario) -> None:
    """A timeline entry must fall on a decode step of the resolved run (CLI options can move them)."""
    first, last = cfg.batch, cfg.batch + cfg.steps - 1
    for i, change in enumerate(getattr(scenario, "timeline", ()) or (), start=1):
        if not first <= change.at_step <= last:
            given = ", ".join(f"--{k.replace('_', '-')} {getattr(cfg, k)}" for k in ("steps", "batch")
                              if cfg.sources.get(k) == "cli")
            raise UsageError(f"{scenario.path}:{change.line or 1}: timeline entry {i} (at_step {change.at_step}) "
                             f"is outside this run's decode steps {first}–{last}"
                             + (f" (set by {given})" if given else ""))


# the run command's flag for a setting where it is not --NAME (bool settings: the flag that sets them)
FLAGS = {"compute_capability": "--cc", "fusion": "--no-fusion", "graphs_disabled": "--no-graphs",
         "reuse_disabled": "--no-reuse", "nvtx": "--no-nvtx",
         "pool_invalidation": "--pool-invalidation"}


def _flag(cfg: RunConfig, name: str) -> str:
    """The command line that set `name`: "--steps 3", "--no-fusion", "--tensor-split 3,1"."""
    flag, value = FLAGS.get(name, "--" + name.replace("_", "-")), getattr(cfg, name)
    if isinstance(value, bool):
        return flag
    return f"{flag} {','.join(f'{x:g}' for x in value) if isinstance(value, tuple) else value}"


def _scenario_overrides(cfg: RunConfig, scenario) -> list[str]:
    """A flag wins over the scenario's [run] or [env] (CLI > scenario), said in one warning naming the
    scenario's line; --batch is refused where the timeline sets batches (it would replace what the
    scenario shows)."""
    if scenario is None:
        return []
    cli = [n for n, src in cfg.sources.items() if src == "cli"]
    sets_batch = [c for c in scenario.timeline if "batch" in c or "alternate_batches" in c]
    if "batch" in cli and sets_batch:
        c = sets_batch[0]
        what = f"batch = {c['batch']}" if "batch" in c else f"alternate_batches = {list(c['alternate_batches'])}"
        raise UsageError(f"{_flag(cfg, 'batch')} would replace the batch sizes scenario {scenario.name}'s timeline "
                         f"sets ({scenario.path}:{c.line}: {what} at step {c.at_step}): drop --batch")
    warnings = []
    run, env = getattr(scenario, "run", {}), getattr(scenario, "env", {})   # a bench plan has a timeline only
    for name in cli:
        if name in run:
            was, where = f"{name} = {run[name]!r}", scenario.where("run." + name)
        else:
            knob = next((k for k in env if ENV_KNOBS[k][0] == name), None)
            if knob is None:
                continue
            was, where = f"{knob}={env[knob]!r}", scenario.where("env." + knob)
        warnings.append(f"{_flag(cfg, name)} overrides scenario {scenario.name}'s {was} ({where}); its "
                        f"expectations were written for that value")
    return warnings


def _one_device_options(cfg: RunConfig, scenario) -> list[str]:
    """At d99724f2 concurrent streams act on one device only: with --devices N > 1, asked for on the command
    line it is an error; from a scenario or GGML_CUDA_GRAPH_OPT, a warning (llama.cpp runs on). At 0c1e57098
    (#28198) each device optimises its own splits: nothing to say."""
    if cfg.devices < 2 or not cfg.concurrent_streams or cfg.upstream != "d99724f2":
        return []
    streams = _named(cfg, scenario, "concurrent_streams", "--concurrent-streams")
    devices = f"{_named(cfg, scenario, 'devices', '--devices')} {cfg.devices}"
    why = f"does nothing with {devices}: llama.cpp d99724f2's concurrent streams (GGML_CUDA_GRAPH_OPT) need exactly one device"
    if cfg.sources.get("concurrent_streams") == "cli":
        raise UsageError(f"{streams} {why}; drop one")
    return [f"{streams} {why} (ignored)"]


def _env_readings(cfg: RunConfig) -> list[str]:
    """An on/off knob whose value is not 0 or 1, read as llama.cpp reads it (atoi), said in one line."""
    warnings = []
    for name, (what, inverted) in ATOI_SWITCHES.items():
        raw = getattr(cfg, "env_values", {}).get(name)
        if raw is None or raw.strip() in ("0", "1") or cfg.sources.get(ENV_KNOBS[name][0]) != f"env {name}":
            continue
        on = (_atoi(raw) != 0) != inverted
        origin = getattr(cfg, "env_origins", {}).get(name)
        warnings.append(f"{name}={raw!r}{' (set in ' + origin + ')' if origin else ''} is read as llama.cpp "
                        f"reads it, with atoi ({_atoi(raw)}): {what} {'on' if on else 'off'} (write 0 or 1)")
    return warnings

"""The model's persistent tensors: weight and KV-cache structs in the arena, their values, loading.

Weights come from a counter-based generator (graphdiag.backends.rng): element i of the tensor at arena index
j under the run's seed is a pure function of (seed, j, i), drawn where the tensor lives — by the rng_fill
kernel on a GPU (kernels/rng.cu; the simulated driver runs its numpy twin) — and reproduced on the host only
when something there reads it (`Model.host`: the CPU backend, the oracle), to the bit. Scales follow fan-in:
standard deviation 1/sqrt(ne0) for mat-mul weights, 1 for the token embedding, 1 + 0.1 noise for norm
weights (a pure 1 would hide a missing MUL), so activations stay O(1) and greedy tokens depend on the input.
Host arrays are in ggml layout, numpy axes outermost first: a ggml weight of ne = (K, M) is a numpy (M, K)
array, an expert stack ne = (K, M, E) is (E, M, K). Stored types: the run's weight type (presets.WEIGHT_TYPES)
for mat-mul weights and the token embedding table — or, where a row (ne0) is no multiple of a K-quant's 256,
the type llama.cpp's quantizer falls back to (presets.preset_type; `Model.fallbacks` names them) — F32 for
norm weights and the MoE router. The KV cache is F16, ne = (head_dim * n_head_kv, n_ctx) per layer, K and V
alike (flash attention), zeroed on load.

F32, F16 and Q8_0 weights are drawn on a device by rng_fill; the other types have no device generator: their
F32 values are drawn on the host with the same generator, quantised there (graphdiag.quants, ggml's reference
quantisers) and uploaded, so the device holds the bytes the host's copy holds.
"""

from __future__ import annotations

import contextvars
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ..backends import rng
from ..backends.abi import new_params, set_desc
from ..backends.base import Backend
from ..backends.drivers.base import Launch
from ..backends.geometry import launch_geometry
from ..errors import UsageError
from ..ir.arena import Arena
from ..ir.build import Ctx, contiguous_nb
from ..ir.dtypes import GGMLType
from ..ir.tensor import Tensor
from ..memory import aligned, quantize_q8_0
from ..quants import dequantize, quantize
from .mixes import Mix
from .presets import ModelConfig, base_type, preset_type

# Types the rng_fill kernel draws on a device (kernels/rng.cu); the others are drawn and quantised on the host.
DEVICE_FILL = (GGMLType.F32, GGMLType.F16, GGMLType.Q8_0)

# Tensor-name suffixes of the expert stacks: the ops using them run where they live (--n-cpu-moe).
EXPERT_SUFFIXES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


@dataclass
class Layer:
    """One layer's structs; a field the architecture (or the file) does not have stays None."""

    attn_norm: Tensor = None
    wq: Tensor = None
    wk: Tensor = None
    wv: Tensor = None
    wo: Tensor = None
    ffn_norm: Tensor = None
    k_cache: Tensor = None
    v_cache: Tensor = None
    ffn_gate: Tensor | None = None
    ffn_up: Tensor | None = None
    ffn_down: Tensor | None = None
    ffn_gate_inp: Tensor | None = None
    ffn_gate_exps: Tensor | None = None
    ffn_up_exps: Tensor | None = None
    ffn_down_exps: Tensor | None = None
    bq: Tensor | None = None            # Q/K/V biases (qwen2; any file with attn_q/k/v.bias)
    bk: Tensor | None = None
    bv: Tensor | None = None
    attn_q_norm: Tensor | None = None   # QK-norm weights, (head_dim,) (qwen3, gemma3)
    attn_k_norm: Tensor | None = None
    attn_post_norm: Tensor | None = None   # post-attention and post-FFN norms, (n_embd,) (gemma3)
    ffn_post_norm: Tensor | None = None
    bo: Tensor | None = None            # attn_output's bias (gpt-oss)
    attn_sinks: Tensor | None = None    # one learned sink logit per head, (n_head,) (gpt-oss)
    ffn_gate_inp_b: Tensor | None = None   # the router's bias, (n_expert,) (gpt-oss)
    ffn_gate_exps_b: Tensor | None = None  # per-expert biases, (n_ff_exp or n_embd, n_expert) (gpt-oss)
    ffn_up_exps_b: Tensor | None = None
    ffn_down_exps_b: Tensor | None = None


@dataclass
class Model:
    """Persistent tensor structs plus (optionally) their host data. `host[name]` is the stored array."""

    cfg: ModelConfig
    wtype: GGMLType
    arena: Arena
    tok_embd: Tensor
    output_norm: Tensor
    output: Tensor
    layers: list[Layer]
    host: Mapping[str, np.ndarray] = field(default_factory=dict)   # HostWeights when the model has values
    seed: int | None = None   # None: a structure-only model (weights load as zeros), or a file's
    file: object = None       # the GgufModel the weights come from (model/gguf_io.py), else None
    fallbacks: dict[str, GGMLType] = field(default_factory=dict)   # preset weights not in wtype: name -> type
    mix: Mix | None = None    # the llama.cpp ftype mix a preset's weights follow (model/mixes.py), else None
    upstream: str = "0c1e57098"   # the upstream commit whose rules its graphs are built by (config.UPSTREAMS)
    _dense: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def tensors(self) -> list[Tensor]:
        """Every persistent tensor (weights, then KV caches), in creation order."""
        return [Tensor(self.arena, i) for i in range(self.arena.mark)]

    def dense(self, name: str) -> np.ndarray:
        """The stored weight `name` dequantised to float32 (numpy axes outermost first); cached."""
        if name not in self._dense:
            a = self.host[name]
            self._dense[name] = dequantize(a) if a.dtype.names else a.astype(np.float32)
        return self._dense[name]


def _weight(ctx: Ctx, t: GGMLType, ne, name: str, types: Mapping[str, GGMLType] | None = None,
            fallbacks: dict[str, GGMLType] | None = None) -> Tensor:
    """A weight struct of type `t`, or of its own type in `types` (a file's). A preset's weight whose rows do
    not fit `t`'s blocks takes llama.cpp's fallback type, recorded in `fallbacks`."""
    if types:
        return ctx.new_tensor(types.get(name, t), ne, name)
    got = preset_type(t, ne[0])
    if got != t and fallbacks is not None:
        fallbacks[name] = got
    return ctx.new_tensor(got, ne, name)


def _specs(cfg: ModelConfig):
    """The arch's persistent weights of `cfg`, in creation order (model/arch/)."""
    from .arch import get_arch
    return get_arch(cfg.arch).tensors(cfg)


def _kv_layers(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(layer, cells) of each K/V cache in creation order: the arch's (gemma3's iSWA cache: two sizes), else
    every layer in order with n_ctx cells."""
    from .arch import get_arch
    own = getattr(get_arch(cfg.arch), "kv_layers", None)
    return own(cfg) if own is not None else [(il, cfg.n_ctx) for il in range(cfg.n_layer)]


def create_model(cfg: ModelConfig, wtype: GGMLType | Mix = GGMLType.F16, seed: int = 0, arena: Arena | None = None,
                 with_data: bool = True, types: Mapping[str, GGMLType] | None = None,
                 upstream: str = "0c1e57098") -> Model:
    """Build the persistent structs in `arena` (then freeze it): the architecture's weights in its order
    (model/arch/), then the KV caches. `with_data`: the weights have values (drawn from `seed` where they
    are loaded, and on the host on first read); else they load as zeros. `types`: each weight's own type
    where it has one (a file's), else `wtype` (norms, biases and the router: F32) — or, for a Mix, the type
    its ftype gives the weight (model/mixes.py; Model.wtype is then its default type). `upstream`: the commit
    whose rules the model's graphs follow (model/build.py: the KQ mask differs)."""
    arena = arena if arena is not None else Arena()
    if arena.top != 0:
        raise ValueError("create_model needs an empty arena: the model is its persistent region")
    ctx = Ctx(arena)
    mix = wtype if isinstance(wtype, Mix) else None
    wt = base_type(wtype)
    fb: dict[str, GGMLType] = {}
    layers = [Layer() for _ in range(cfg.n_layer)]
    top: dict[str, Tensor] = {}
    for spec in _specs(cfg):
        want = wt if mix is None or types else mix.tensor_type(cfg, spec.name, spec.ne[0])
        t = _weight(ctx, GGMLType.F32 if spec.f32_only else want, spec.ne, spec.name, types, fb)
        if spec.layer is None:
            top[spec.field] = t
        else:
            setattr(layers[spec.layer], spec.field, t)
    for il, cells in _kv_layers(cfg):
        lay = layers[il]
        lay.k_cache = ctx.new_tensor(GGMLType.F16, (cfg.n_embd_kv, cells), f"cache_k_l{il}")
        lay.v_cache = ctx.new_tensor(GGMLType.F16, (cfg.n_embd_kv, cells), f"cache_v_l{il}")
    arena.freeze()
    # a tied output is the embedding itself (llama.cpp's TENSOR_DUPLICATED: one tensor, read twice)
    output = top["tok_embd"] if cfg.tied_output else top["output"]
    model = Model(cfg, wt, arena, top["tok_embd"], top["output_norm"], output, layers, fallbacks=fb,
                  mix=None if types else mix, upstream=upstream)
    if with_data:
        model.seed = seed
        model.host = HostWeights(model, seed)   # nothing drawn until the host reads a weight
    return model


def _store(x: np.ndarray, t: GGMLType) -> np.ndarray:
    """float32 values -> the stored array of type `t`. Q8_0 rounds halves to even as rng_fill_q8_0 does
    (memory.quantize_q8_0; ggml's reference rounds them away from zero: equal but at exact halves); every
    other type is ggml's reference quantiser."""
    if t == GGMLType.Q8_0:
        return quantize_q8_0(x)
    return quantize(x, t)


def value_spec(t: Tensor) -> tuple[np.float32, np.float32]:
    """(mul, add) of the generator for weight `t`: the scale and centre of its values."""
    if t.type == GGMLType.F32 and t.name.endswith("norm.weight"):
        return rng.multiplier(0.1), np.float32(1.0)
    if t.name == "token_embd.weight":
        return rng.multiplier(1.0), np.float32(0.0)
    return rng.multiplier(1.0 / np.sqrt(t.ne[0])), np.float32(0.0)


def host_shape(t: Tensor) -> tuple[int, ...]:
    """numpy shape (outermost first) of weight `t`, trailing ggml dims of 1 dropped."""
    ne = list(t.ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(reversed(ne))


def draw_host(t: Tensor, seed: int) -> np.ndarray:
    """The stored host array of weight `t`, bit-identical to what rng_fill writes on a device. A type with no
    device generator (quantised on the host) comes from HOST_QUANTISED when drawn before in this process:
    read-only, shared by every model of the same preset, weight type and seed."""
    if t.type in DEVICE_FILL:
        return _draw_stored(t, seed)
    key = (seed, t.idx, t.name, t.type, tuple(t.ne))
    got = HOST_QUANTISED.get(key)
    if got is None:
        got = _draw_stored(t, seed)
        HOST_QUANTISED.put(key, got)
    return got


def _draw_stored(t: Tensor, seed: int) -> np.ndarray:
    mul, add = value_spec(t)
    return _store(rng.draw_f32(seed, t.idx, int(np.prod(t.ne)), mul, add).reshape(host_shape(t)), t.type)


class QuantisedCache:
    """Host-quantised weights kept for the process, least recently used first out, within `budget` bytes
    and a quarter of the host's available memory at each insertion. The same preset's weights are built
    again within a process — `bench steps` builds a row's model for graphs on, graphs off, the
    instrumentation share and the llama.cpp peer's export, once per round — and ggml's reference
    K-quant quantisers run at about 5 M weights a second a core in numpy (a 1b Q4_K model, 0.76 GB,
    took some 40 s a build on the lent GPU host), while the values are a pure function of (seed, tensor,
    type). Kept arrays are made read-only: every holder shares them."""

    def __init__(self, budget: int):
        self.budget, self.nbytes, self.hits = budget, 0, 0
        self._kept: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def get(self, key: tuple) -> np.ndarray | None:
        got = self._kept.get(key)
        if got is not None:
            self._kept.move_to_end(key)
            self.hits += 1
        return got

    def put(self, key: tuple, a: np.ndarray) -> None:
        cap = min(self.budget, available_host_bytes() // 4)
        if a.nbytes > cap:
            return
        a.flags.writeable = False
        old = self._kept.pop(key, None)
        self.nbytes += a.nbytes - (old.nbytes if old is not None else 0)
        self._kept[key] = a
        while self.nbytes > cap:
            _, out = self._kept.popitem(last=False)
            self.nbytes -= out.nbytes

    def clear(self) -> None:
        self._kept.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._kept)


HOST_QUANTISED = QuantisedCache(8 << 30)


class HostWeights(Mapping):
    """name -> stored host array of every weight (not the caches), drawn on first read and cached."""

    def __init__(self, model: "Model", seed: int):
        self._seed = seed
        self._tensors = {t.name: t for t in model.tensors() if not t.name.startswith("cache_")}
        self._cache: dict[str, np.ndarray] = {}
        self.n_drawn = 0   # host draws so far (a GPU load makes none)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = self.draw(name)
        return self._cache[name]

    def draw(self, name: str) -> np.ndarray:
        """The array without caching it (a cached one if already drawn): loading needs it only once."""
        got = self._cache.get(name)
        if got is None:
            self.n_drawn += 1
            got = draw_host(self._tensors[name], self._seed)
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __contains__(self, name) -> bool:
        return name in self._tensors

def is_expert_tensor(name: str) -> bool:
    return name.endswith(EXPERT_SUFFIXES)


def on_cpu(name: str, n_cpu_moe: int) -> bool:
    """Whether `name` lives on the CPU backend with --n-cpu-moe N: the expert stacks of layers < N."""
    if not is_expert_tensor(name):
        return False
    return int(name.split(".")[1]) < n_cpu_moe


@dataclass(frozen=True)
class WeightBuffer:
    """One backend buffer holding persistent tensors (ggml's model/KV buffers). Sizes in bytes."""

    backend: Backend
    addr: int
    nbytes: int
    names: tuple[str, ...]


# A callback (bytes done, bytes in all) that shows loading progress; set by a caller that draws its own
# progress (the benchmark), else load_model shows a rich bar on stderr for models of LOUD_BYTES or more.
Progress = Callable[[int, int], None]
LOAD_PROGRESS: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("load_progress", default=None)
LOUD_BYTES = 1 << 30
LOUD_HOST_BYTES = 16 << 20       # host-quantised weights show progress from here (K-quants: ~5 M weights/s/core)
HOST_MARGIN = 512 << 20          # host bytes kept free beyond the model (activations, temporaries)
SIM_HEADROOM = 1 << 30           # simulated device bytes beyond the model (compute buffers, the pool)


def available_host_bytes() -> int:
    """MemAvailable from /proc/meminfo, else free physical pages (os.sysconf)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _device(backend: Backend):
    """(driver, stream) of a GPU backend (weights are drawn there), None for a host backend."""
    driver = getattr(backend, "driver", None)
    return (driver, backend.stream0) if backend.is_gpu and driver is not None else None


def _gb(n: int) -> str:
    return f"{n:,} bytes ({n / 1e9:.1f} GB)"


def check_fits(model: Model, groups: dict[int, list[Tensor]], gpu: Backend | list[Backend]) -> None:
    """Refuse, in one line and before any allocation, a model this machine cannot hold; size each simulated
    device for it. Host memory holds the CPU backend's tensors and, for a simulated device that computes,
    the device's.
    `groups[i]` are the tensors of `gpu[i]` (one backend or a list, one per device), the last the CPU's."""
    gpus = gpu if isinstance(gpu, list) else [gpu]
    need = {gi: sum(aligned(t.nbytes()) for t in ts) for gi, ts in groups.items()}
    what = f"model {model.cfg.name} ({model.wtype.name})"
    host, devs = need[len(gpus)], [_device(g) for g in gpus]
    for gi, dev in enumerate(devs):
        if dev is not None and not dev[0].simulated:
            total = dev[0].info.total_memory
            if total and need[gi] > total:
                raise UsageError(f"{what} needs {_gb(need[gi])} of GPU memory; {dev[0].info.name} has {_gb(total)}")
        elif dev is None or dev[0].computes:
            host += need[gi]      # a decisions-only simulated device reserves its memory, holding no bytes
    avail = available_host_bytes()
    if host + HOST_MARGIN > avail:
        where = "host memory (the simulated device lives there)" if devs[0] is not None else "host memory"
        raise UsageError(f"{what} needs {_gb(host)} of {where}; this machine has {_gb(avail)} available "
                         f"(use a GPU, a smaller --model or --wtype q8_0)")
    for gi, dev in enumerate(devs):
        if dev is not None and dev[0].simulated:
            dev[0].reserve(need[gi] + SIM_HEADROOM)


def load_model(model: Model, gpu: Backend | list[Backend], cpu: Backend | None = None, n_cpu_moe: int = 0,
               progress: Progress | None = None, device_of: Callable[[str], int] | None = None) -> list[WeightBuffer]:
    """Allocate each persistent tensor in one buffer of its backend and fill it: weights drawn where they live
    (the rng_fill kernel on a GPU backend, the host twin for a CPU one), KV caches zeroed.

    `gpu` is one backend, or one per device with `device_of(name)` choosing the device of each tensor (a
    layer split: sched/devices.py). Sets each struct's `data` (address) and `buffer` (the buffer's base
    address). Returns the buffers, GPU first; the scheduler learns from them which backend owns which
    memory. A model that cannot fit is refused up front (UsageError naming the bytes); progress goes to
    `progress`, LOAD_PROGRESS, or stderr."""
    if n_cpu_moe and cpu is None:
        raise ValueError("n_cpu_moe needs a CPU backend")
    gpus = gpu if isinstance(gpu, list) else [gpu]
    groups: dict[int, list[Tensor]] = {gi: [] for gi in range(len(gpus) + 1)}
    for t in model.tensors():
        dev = device_of(t.name) if device_of is not None else 0
        groups[len(gpus) if on_cpu(t.name, n_cpu_moe) else dev].append(t)
    check_fits(model, groups, gpu)
    total = sum(t.nbytes() for t in model.tensors())
    if progress is None and not all(d is None or d[0].computes for d in map(_device, gpus)):
        progress = _no_progress   # decisions-only: the memory is reserved and the fills modelled, at once
    if model.file is not None and progress is None and LOAD_PROGRESS.get() is None:
        from .upload import FileUpload             # a file's weights: named, with their bytes
        shown = FileUpload(model, total)
    else:
        label = f"{model.cfg.name} {model.wtype.name} weights"
        hosted = sum(t.nbytes() for t in model.tensors() if _host_quantised(model, t))
        if hosted:
            label += f" ({hosted:,} bytes drawn and quantised on the host)"
        shown = _progress(progress, total, label, loud=total >= LOUD_BYTES or hosted >= LOUD_HOST_BYTES)
    with shown as tick:
        buffers = []
        for gi, backend in enumerate([*gpus, cpu]):
            if groups[gi]:
                buffers.append(_upload_group(model, backend, groups[gi], tick))
    return buffers


def _host_quantised(model: Model, t: Tensor) -> bool:
    """Whether loading draws and quantises weight `t` on the host although a device holds it."""
    return model.file is None and model.seed is not None and t.type not in DEVICE_FILL and t.name in model.host


def _no_progress(done: int, total: int) -> None:
    pass


class _progress:
    """Context manager yielding tick(nbytes): the caller's callback, or a rich bar on stderr (big models)."""

    def __init__(self, fn: Progress | None, total: int, label: str, loud: bool = False):
        self.fn, self.total, self.label, self.done, self.bar = fn or LOAD_PROGRESS.get(), total, label, 0, None
        self.loud = loud

    def __enter__(self) -> Callable[[int], None]:
        if self.fn is None and self.loud:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress as Bar, TextColumn, TimeElapsedColumn
            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                           console=Console(stderr=True), transient=False)
            self.bar.start()
            self.task = self.bar.add_task(f"loading {self.label}", total=self.total)
        return self.tick

    def tick(self, n: int) -> None:
        self.done += n
        if self.fn is not None:
            self.fn(self.done, self.total)
        elif self.bar is not None:
            self.bar.update(self.task, completed=self.done)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _fill_on_device(driver, stream, t: Tensor, seed: int) -> None:
    """Launch rng_fill for weight `t` (already placed at t.data) on `stream`."""
    p = new_params()
    set_desc(p, 0, t.data, int(t.type), t.ne, contiguous_nb(int(t.type), t.ne))
    lo, hi = rng.seed_words(seed)
    p["ip"][:3] = (lo, hi, t.idx)
    p["fp"][:2] = value_spec(t)
    name = f"rng_fill_{t.type.name.lower()}"
    grid, block, shmem = launch_geometry(name, p)
    driver.launch(stream, driver.prepare(Launch(name, grid, block, p, shmem)))


def _upload_group(model: Model, backend: Backend, tensors: list[Tensor], tick) -> WeightBuffer:
    total = sum(aligned(t.nbytes()) for t in tensors)
    base = backend.buffer_alloc(total)
    dev = _device(backend)
    off = 0
    for t in tensors:
        t.data, t.buffer = base + off, base
        weight = (model.seed is not None or model.file is not None) and t.name in model.host
        if dev is not None and weight and model.file is None and t.type in DEVICE_FILL:
            _fill_on_device(*dev, t, model.seed)
        elif dev is not None and weight and model.file is None and not getattr(dev[0], "computes", True):
            dev[0].memset_d8(t.data, 0, t.nbytes(), dev[1])   # decisions only: no bytes are kept, none drawn
        elif dev is not None and weight and model.file is None:
            backend.tensor_set(t.data, model.host.draw(t.name))     # drawn and quantised on the host
        elif weight and model.file is not None:
            backend.tensor_set(t.data, model.host.draw(t.name))     # the file's bytes, uploaded as they are
        elif dev is not None:
            # ggml clears the KV buffers: unwritten cells are masked, but 0 * NaN garbage would still poison
            dev[0].memset_d8(t.data, 0, t.nbytes(), dev[1])
        elif weight:
            backend.tensor_set(t.data, model.host.draw(t.name))
        else:
            backend.tensor_set(t.data, np.zeros(t.nbytes(), np.uint8))
        off += aligned(t.nbytes())
        tick(t.nbytes())
    backend.synchronize()   # loaded means on the device: a fill error surfaces here, not in step 0
    return WeightBuffer(backend, base, total, tuple(t.name for t in tensors))


def create_file_model(g, with_data: bool = True, upstream: str = "0c1e57098") -> Model:
    """The model of a validated GGUF file (model/gguf_io.GgufModel): its config, each weight in the file's
    type, the values the file's (memory-mapped) unless `with_data` is False (structure only); its graphs
    follow `upstream`'s rules."""
    from .gguf_io import FileWeights
    model = create_model(g.cfg, g.main_type, with_data=False, types=g.types, upstream=upstream)
    if with_data:
        model.file, model.host = g, FileWeights(g)
    return model

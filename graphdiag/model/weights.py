"""The model's persistent tensors: weight and KV-cache structs in the arena, random host data, loading.

Weights are random (numpy Generator from a seed) with scale 1/sqrt(fan_in), so activations stay O(1) and greedy
tokens depend on the input. Host arrays are in ggml layout, numpy axes outermost first: a ggml weight of
ne = (K, M) is a numpy (M, K) array, an expert stack ne = (K, M, E) is (E, M, K). Stored types: the run's weight
type (F16 or Q8_0; F32 for tests) for mat-mul weights and the token embedding table, F32 for norm weights and the
MoE router. The KV cache is F16, ne = (head_dim * n_head_kv, n_ctx) per layer, K and V alike (flash attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Backend
from ..ir.arena import Arena
from ..ir.build import Ctx
from ..ir.dtypes import GGMLType
from ..ir.tensor import Tensor
from ..memory import ALIGN, dequantize_q8_0, quantize_q8_0
from .presets import ModelConfig

# Tensor-name suffixes of the expert stacks: the ops using them run where they live (--n-cpu-moe).
EXPERT_SUFFIXES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


@dataclass
class Layer:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: Tensor
    k_cache: Tensor = None
    v_cache: Tensor = None
    ffn_gate: Tensor | None = None
    ffn_up: Tensor | None = None
    ffn_down: Tensor | None = None
    ffn_gate_inp: Tensor | None = None
    ffn_gate_exps: Tensor | None = None
    ffn_up_exps: Tensor | None = None
    ffn_down_exps: Tensor | None = None


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
    host: dict[str, np.ndarray] = field(default_factory=dict)
    _dense: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def tensors(self) -> list[Tensor]:
        """Every persistent tensor (weights, then KV caches), in creation order."""
        return [Tensor(self.arena, i) for i in range(self.arena.mark)]

    def dense(self, name: str) -> np.ndarray:
        """The stored weight `name` dequantised to float32 (numpy axes outermost first); cached."""
        if name not in self._dense:
            a = self.host[name]
            self._dense[name] = dequantize_q8_0(a) if a.dtype.names else a.astype(np.float32)
        return self._dense[name]


def _weight(ctx: Ctx, t: GGMLType, ne, name: str) -> Tensor:
    return ctx.new_tensor(t, ne, name)


def _layer_structs(ctx: Ctx, cfg: ModelConfig, wt: GGMLType, il: int) -> Layer:
    p, d, dkv = f"blk.{il}.", cfg.n_embd, cfg.n_embd_kv
    lay = Layer(
        attn_norm=_weight(ctx, GGMLType.F32, (d,), p + "attn_norm.weight"),
        wq=_weight(ctx, wt, (d, d), p + "attn_q.weight"),
        wk=_weight(ctx, wt, (d, dkv), p + "attn_k.weight"),
        wv=_weight(ctx, wt, (d, dkv), p + "attn_v.weight"),
        wo=_weight(ctx, wt, (d, d), p + "attn_output.weight"),
        ffn_norm=_weight(ctx, GGMLType.F32, (d,), p + "ffn_norm.weight"),
    )
    if cfg.is_moe:
        e, f = cfg.n_expert, cfg.n_ff_exp
        lay.ffn_gate_inp = _weight(ctx, GGMLType.F32, (d, e), p + "ffn_gate_inp.weight")
        lay.ffn_gate_exps = _weight(ctx, wt, (d, f, e), p + "ffn_gate_exps.weight")
        lay.ffn_up_exps = _weight(ctx, wt, (d, f, e), p + "ffn_up_exps.weight")
        lay.ffn_down_exps = _weight(ctx, wt, (f, d, e), p + "ffn_down_exps.weight")
    else:
        lay.ffn_gate = _weight(ctx, wt, (d, cfg.n_ff), p + "ffn_gate.weight")
        lay.ffn_up = _weight(ctx, wt, (d, cfg.n_ff), p + "ffn_up.weight")
        lay.ffn_down = _weight(ctx, wt, (cfg.n_ff, d), p + "ffn_down.weight")
    return lay


def create_model(cfg: ModelConfig, wtype: GGMLType = GGMLType.F16, seed: int = 0, arena: Arena | None = None,
                 with_data: bool = True) -> Model:
    """Build the persistent structs in `arena` (then freeze it) and, if `with_data`, random host weights."""
    arena = arena if arena is not None else Arena()
    if arena.top != 0:
        raise ValueError("create_model needs an empty arena: the model is its persistent region")
    ctx = Ctx(arena)
    wt = GGMLType(wtype)
    tok_embd = _weight(ctx, wt, (cfg.n_embd, cfg.n_vocab), "token_embd.weight")
    layers = [_layer_structs(ctx, cfg, wt, il) for il in range(cfg.n_layer)]
    output_norm = _weight(ctx, GGMLType.F32, (cfg.n_embd,), "output_norm.weight")
    output = _weight(ctx, wt, (cfg.n_embd, cfg.n_vocab), "output.weight")
    for il, lay in enumerate(layers):
        lay.k_cache = ctx.new_tensor(GGMLType.F16, (cfg.n_embd_kv, cfg.n_ctx), f"cache_k_l{il}")
        lay.v_cache = ctx.new_tensor(GGMLType.F16, (cfg.n_embd_kv, cfg.n_ctx), f"cache_v_l{il}")
    arena.freeze()
    model = Model(cfg, wt, arena, tok_embd, output_norm, output, layers)
    if with_data:
        model.host = random_weights(model, seed)
    return model


def _store(x: np.ndarray, t: GGMLType) -> np.ndarray:
    if t == GGMLType.Q8_0:
        return quantize_q8_0(x)
    return x.astype(np.float16) if t == GGMLType.F16 else x.astype(np.float32)


def random_weights(model: Model, seed: int) -> dict[str, np.ndarray]:
    """Stored host arrays for every weight (not the caches), drawn in struct order from one Generator."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for t in model.tensors():
        name = t.name
        if name.startswith("cache_"):
            continue
        ne = list(t.ne)
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        shape = tuple(reversed(ne))  # numpy order, outermost first
        if t.type == GGMLType.F32 and name.endswith("norm.weight"):
            # near 1 (a pure 1 would hide a missing MUL)
            x = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        elif name == "token_embd.weight":
            x = rng.standard_normal(shape, dtype=np.float32)
        else:
            x = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(t.ne[0]))
        out[name] = _store(x, t.type)
    return out


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


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def load_model(model: Model, gpu: Backend, cpu: Backend | None = None, n_cpu_moe: int = 0) -> list[WeightBuffer]:
    """Allocate each persistent tensor in one buffer of its backend and upload it (KV caches are zeroed).

    Sets each struct's `data` (address) and `buffer` (the buffer's base address). Returns the buffers,
    GPU first; the scheduler learns from them which backend owns which memory."""
    if n_cpu_moe and cpu is None:
        raise ValueError("n_cpu_moe needs a CPU backend")
    groups: dict[int, list[Tensor]] = {0: [], 1: []}
    for t in model.tensors():
        groups[1 if on_cpu(t.name, n_cpu_moe) else 0].append(t)
    buffers = []
    for gi, backend in ((0, gpu), (1, cpu)):
        if groups[gi]:
            buffers.append(_upload_group(model, backend, groups[gi]))
    return buffers


def _upload_group(model: Model, backend: Backend, tensors: list[Tensor]) -> WeightBuffer:
    total = sum(_aligned(t.nbytes()) for t in tensors)
    base = backend.buffer_alloc(total)
    off = 0
    for t in tensors:
        t.data, t.buffer = base + off, base
        if t.name in model.host:
            backend.tensor_set(t.data, model.host[t.name])
        else:
            # ggml clears the KV buffers: unwritten cells are masked, but 0 * NaN garbage would still poison
            backend.tensor_set(t.data, np.zeros(t.nbytes(), np.uint8))
        off += _aligned(t.nbytes())
    return WeightBuffer(backend, base, total, tuple(t.name for t in tensors))

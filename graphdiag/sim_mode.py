"""Which mode the simulated driver runs in, and what computing costs for a big model.

compute: every kernel runs in numpy and every device byte is held in host memory (results are real:
--verify and --oracle need them). decisions: kernels are modelled, not computed, device memory is reserved,
not materialised, and weights are never drawn; every decision is the same as in compute mode, but logits,
and so generated tokens, are not computed. Decisions-only is the default for the presets above `small` and
for model files of more than BIG_FILE_ELEMENTS weights, unless --verify or --oracle needs results;
--sim-mode (or a scenario's [run] sim_mode) chooses.

What computing a big model costs (compute_cost) is said before it starts. Host memory is modelled from what
the run holds, each part measured against peak RSS (/usr/bin/time -v, 2-core 23 GB machine, December 2026):

    tiny/small/1b computed, f16 preset:   0.15 / 0.39-0.40 / 2.67-2.73 GB   (model: 0.21 / 0.40 / 2.71 GB)
    tiny/small --oracle, f16 preset:      0.34 / 1.48-1.51 GB                (model: 0.38 / 1.47 GB)
    small --oracle, q8_0 preset:          1.25 GB                            (model: 1.26 GB)
    small.gguf computed / --oracle:       0.57 / 1.43 GB                     (model: 0.62 / 1.47 GB)

the simulated device's bytes (weights and KV cache, as check_fits counts them) plus a tenth for compute
buffers and kernel temporaries, a fixed base (interpreter, numpy, graphdiag, activations), the host copy
of the weights where one is held (a file's pages, mapped as they are uploaded; a host-quantised preset's
cache), and for --oracle its float64 weights (8 bytes a weight) and the host copy it draws of weights
that were filled on the device. 1b --oracle is 2.3 + 2.2 + 8.8 + 0.4 = 13.7 GB (13.5 GB was seen; the old
line said 2.3 GB, the device's bytes alone). Times scale with the weights too, at rates measured on this
machine just before the line is written (measured_rates: a 1 M-weight sample drawn, stored, multiplied).
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("compute", "decisions")
DECISIONS_BY_DEFAULT = ("1b", "7b")     # the presets above small: hours of numpy, and more host memory than most have
# a model file computes by default up to this many weights (small's preset has 0.11 G, 1b's 1.1 G; Gemma 3
# 270M, 0.27 G, computes): above it, decisions-only, as for the big presets
BIG_FILE_ELEMENTS = 500_000_000

BASE_BYTES = 130_000_000        # interpreter, numpy and graphdiag (51 MB decisions-only), activations
RUN_OVERHEAD = 1.1              # the device's bytes, plus compute buffers and kernel temporaries
ORACLE_BYTES_PER_WEIGHT = 8     # the oracle's float64 copy of every weight
PREFILL_STEPS = 1.5             # the first step (a 16-token prefill) against a decode step (measured 1.1-1.8)
SAMPLE = 1 << 20                # weights drawn for the rate sample (a K-quant's: about 0.4 s)
TILES = 8                       # the sample's copies the products are timed on (16 MB of F16)
SIM_STEP_WORK = 1.0             # a simulated decode step's time over its weights' mat-vecs alone, measured
ORACLE_STEP_WORK = 2.0          # the oracle's forward over its float64 mat-vecs alone (small: 0.09 s, 0.9 ns a weight)


def file_elements(cfg) -> int | None:
    """Weights in the model file `cfg.model` names; None for a preset."""
    from .model.source import is_file
    if not is_file(cfg.model):
        return None
    from .model.gguf_io import open_gguf
    return open_gguf(cfg.model).n_elements


def big_model(cfg) -> bool:
    """A model that decides only on the simulator unless results are needed: the presets above small, and
    model files of more than BIG_FILE_ELEMENTS weights."""
    n = file_elements(cfg)
    return n > BIG_FILE_ELEMENTS if n is not None else cfg.model in DECISIONS_BY_DEFAULT


def sim_mode(cfg) -> str:
    """The mode a simulated driver runs `cfg` in: the one asked for, else decisions for a big model
    (big_model) when neither --verify nor --oracle needs computed results, else compute."""
    if cfg.sim_mode is not None:
        return cfg.sim_mode
    return "decisions" if big_model(cfg) and not (cfg.verify or cfg.oracle) else "compute"


def mode_reason(cfg) -> str:
    """Why sim_mode(cfg) is what it is, in a few words (the run header says it)."""
    src = cfg.sources.get("sim_mode", "default")
    if cfg.sim_mode is not None:
        return "--sim-mode" if src == "cli" else src
    needs = [flag for flag, on in (("--verify", cfg.verify), ("--oracle", cfg.oracle)) if on]
    if big_model(cfg) and needs:
        return f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} computed results"
    n = file_elements(cfg)
    if n is not None:
        side = "above" if n > BIG_FILE_ELEMENTS else "not above"
        return f"default for a model file of {n / 1e9:.2f} G weights ({side} {BIG_FILE_ELEMENTS / 1e9:.1f} G)"
    return f"default for model {cfg.model}"


def model_bytes(cfg) -> tuple[int, int]:
    """(device bytes, weight elements) of cfg's model: every weight and KV-cache tensor, aligned as loaded."""
    from .memory import aligned
    from .model.source import build_model

    model = build_model(cfg.model, cfg.wtype, with_data=False)
    tensors = model.tensors()
    elements = sum(t.nelements() for t in tensors if not t.name.startswith("cache_"))
    return sum(aligned(t.nbytes()) for t in tensors), elements


@dataclass(frozen=True)
class ComputeCost:
    """What computing a model on the simulated driver costs: peak host bytes, and seconds."""

    device_bytes: int       # the simulated device's weights and KV cache (check_fits' count)
    host_copy_bytes: int    # weights held on the host besides the device's (a file's pages, a quantised cache)
    oracle_bytes: int       # --oracle's float64 weights and the host copy it draws
    first_step_s: float     # weights drawn or read, the prompt prefilled (and the oracle's weights made)
    step_s: float           # a decode step (with the oracle's forward)

    @property
    def resident_bytes(self) -> int:
        return BASE_BYTES + int(self.device_bytes * RUN_OVERHEAD) + self.host_copy_bytes + self.oracle_bytes


@dataclass(frozen=True)
class Rates:
    """ns a weight of one weight type on this machine: load (drawn and stored, or read from a file), a
    decode step's mat-vec, the oracle's float64 conversion and its mat-vec."""

    load: float
    step: float
    oracle_first: float
    oracle_step: float


def compute_cost(cfg, rates: "Rates | None" = None) -> ComputeCost:
    """The cost of computing cfg's model (measured_rates for its main weight type unless `rates` given)."""
    from .memory import aligned
    from .model.source import build_model
    from .model.weights import DEVICE_FILL

    model = build_model(cfg.model, cfg.wtype, with_data=False)
    weights = [t for t in model.tensors() if not t.name.startswith("cache_")]
    elements = sum(t.nelements() for t in weights)
    device = sum(aligned(t.nbytes()) for t in model.tensors())
    n_file = file_elements(cfg)
    from_file = n_file is not None
    drawn_on_device = sum(t.nbytes() for t in weights if t.type in DEVICE_FILL)
    if from_file:
        host_copy, oracle_draws = sum(t.nbytes() for t in weights), 0      # the file's pages, mapped
    else:
        host_copy, oracle_draws = sum(t.nbytes() for t in weights) - drawn_on_device, drawn_on_device
    oracle = ORACLE_BYTES_PER_WEIGHT * elements + oracle_draws if cfg.oracle else 0
    main = max({t.type for t in weights}, key=lambda ty: sum(t.nelements() for t in weights if t.type == ty))
    r = rates or measured_rates(main, from_file)
    oracle_first, oracle_step = (r.oracle_first, r.oracle_step) if cfg.oracle else (0.0, 0.0)
    first = elements * (r.load + PREFILL_STEPS * r.step + oracle_first + oracle_step) / 1e9
    return ComputeCost(device, host_copy, oracle, first, elements * (r.step + oracle_step) / 1e9)


def measured_rates(wtype, from_file: bool) -> Rates:
    """Rates (ns a weight) of the simulator's own work on this machine now, timed on SAMPLE weights of
    `wtype`: the seeded draw and its storing (a preset's load; a file's is a copy of its bytes), the
    dequantised mat-vec of a decode step, and the oracle's float64 weights and mat-vec (plus, for a preset
    weight filled on the device, the host draw the oracle makes)."""
    import time

    import numpy as np

    from .backends import rng
    from .backends.cpu_ops import mul_mat
    from .model.weights import DEVICE_FILL, _store
    from .quants import dequantize

    def best(f, n: int = 3) -> int:          # ns of the fastest of n calls: a busy machine's gaps left out
        times = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            f()
            times.append(time.perf_counter_ns() - t0)
        return min(times)

    rows = SAMPLE // 1024
    got = {}
    draw = best(lambda: got.update(stored=_store(rng.draw_f32(0, 0, SAMPLE, np.float32(0.03), np.float32(0))
                                                 .reshape(rows, 1024), wtype)), 1 if wtype not in DEVICE_FILL else 3)
    stored = got["stored"]
    load = best(lambda: np.array(stored, copy=True)) if from_file else draw
    # the products on TILES copies of the sample: weights streamed from memory, as a model's are, not cached
    big = np.concatenate([stored] * TILES).reshape(1, 1, rows * TILES, -1)
    x = np.ones((1, 1, 1, 1024), np.float32)
    w64 = dequantize(big[0, 0]).astype(np.float64)
    w64[:8] @ x[0, 0, 0].astype(np.float64)     # numpy's BLAS set up before it is timed
    step = best(lambda: mul_mat(big, x)) * SIM_STEP_WORK
    oracle_first = best(lambda: dequantize(big[0, 0]).astype(np.float64), 1)
    oracle_step = best(lambda: w64 @ x[0, 0, 0].astype(np.float64)) * ORACLE_STEP_WORK
    n = SAMPLE * TILES
    oracle_first = oracle_first / n + (draw / SAMPLE if wtype in DEVICE_FILL and not from_file else 0)
    return Rates(load / SAMPLE, step / n, oracle_first, oracle_step / n)



def compute_cost_line(cfg) -> str | None:
    """One line saying what computing cfg's model on the simulated driver costs (peak host memory, time),
    for a big model (big_model); None for smaller ones, and for one that cannot load here (loading refuses
    it in one line, naming the bytes). UsageError when only --oracle's float64 weights make it too big."""
    from .errors import UsageError
    from .model.weights import HOST_MARGIN, available_host_bytes

    if not big_model(cfg):
        return None
    avail = available_host_bytes()
    cost = compute_cost(cfg, Rates(0, 0, 0, 0))          # bytes first: no rates needed to refuse
    if cost.device_bytes + HOST_MARGIN > avail:
        return None
    if cfg.oracle and cost.resident_bytes > avail:
        raise UsageError(f"model {cfg.model} with --oracle needs about {cost.resident_bytes / 1e9:.1f} GB of "
                         f"host memory on the simulated driver ({cost.oracle_bytes / 1e9:.1f} GB of it the "
                         f"oracle's float64 weights); this machine has {avail / 1e9:.1f} GB available (use a "
                         f"GPU, a smaller model, or --verify, which holds no second copy)")
    cost = compute_cost(cfg)
    why = mode_reason(cfg)
    oracle = f", {cost.oracle_bytes / 1e9:.1f} GB of it the oracle's float64 weights" if cost.oracle_bytes else ""
    return (f"model {cfg.model} computed on the SIMULATED driver ({why}): every kernel in numpy, about "
            f"{cost.resident_bytes / 1e9:.1f} GB of host memory at its peak{oracle}; roughly "
            f"{_duration(cost.first_step_s)} to the first step and {_duration(cost.step_s)} a step (rates "
            f"measured on this machine just now); a GPU (--backend cuda), or no --verify/--oracle "
            f"(decisions-only), is far faster")


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"

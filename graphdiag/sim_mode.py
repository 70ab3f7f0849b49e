"""Which mode the simulated driver runs in, and what computing costs for a big model.

compute: every kernel runs in numpy and every device byte is held in host memory (results are real:
--verify and --oracle need them). decisions: kernels are modelled, not computed, device memory is reserved,
not materialised, and weights are never drawn; every decision is the same as in compute mode, but logits,
and so generated tokens, are not computed. Decisions-only is the default for the presets above `small`
unless --verify or --oracle needs results; --sim-mode (or a scenario's [run] sim_mode) chooses.
"""

from __future__ import annotations

MODES = ("compute", "decisions")
DECISIONS_BY_DEFAULT = ("1b", "7b")     # the presets above small: hours of numpy, and more host memory than most have

# Rates of the computing simulator, measured on the 2-core, 24 GiB machine of graphdiag issue 25 with model
# 7b f16 (6.74e9 weight elements): 17 min to the first step (weights drawn, the prompt prefilled), 1.5 min
# a decode step. Used only to say roughly what a run will cost before it starts.
FIRST_STEP_NS_PER_ELEMENT = 150
STEP_NS_PER_ELEMENT = 13


def sim_mode(cfg) -> str:
    """The mode a simulated driver runs `cfg` in: the one asked for, else decisions for the presets above
    small when neither --verify nor --oracle needs computed results, else compute."""
    if cfg.sim_mode is not None:
        return cfg.sim_mode
    big = cfg.model in DECISIONS_BY_DEFAULT
    return "decisions" if big and not (cfg.verify or cfg.oracle) else "compute"


def mode_reason(cfg) -> str:
    """Why sim_mode(cfg) is what it is, in a few words (the run header says it)."""
    src = cfg.sources.get("sim_mode", "default")
    if cfg.sim_mode is not None:
        return "--sim-mode" if src == "cli" else src
    needs = [flag for flag, on in (("--verify", cfg.verify), ("--oracle", cfg.oracle)) if on]
    if cfg.model in DECISIONS_BY_DEFAULT and needs:
        return f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} computed results"
    return f"default for model {cfg.model}"


def model_bytes(cfg) -> tuple[int, int]:
    """(device bytes, weight elements) of cfg's model: every weight and KV-cache tensor, aligned as loaded."""
    from .memory import aligned
    from .model.source import build_model

    model = build_model(cfg.model, cfg.wtype, with_data=False)
    tensors = model.tensors()
    elements = sum(t.nelements() for t in tensors if not t.name.startswith("cache_"))
    return sum(aligned(t.nbytes()) for t in tensors), elements


def compute_cost_line(cfg) -> str | None:
    """One line saying what computing cfg's model on the simulated driver costs (resident bytes, rough time),
    for the presets above small; None for smaller ones. Derived from the preset's sizes, not measured."""
    from .model.weights import HOST_MARGIN, available_host_bytes

    if cfg.model not in DECISIONS_BY_DEFAULT:
        return None
    nbytes, elements = model_bytes(cfg)
    if nbytes + HOST_MARGIN > available_host_bytes():
        return None           # it cannot run here: loading refuses it in one line, naming the bytes
    first = elements * FIRST_STEP_NS_PER_ELEMENT / 60e9
    step = elements * STEP_NS_PER_ELEMENT / 1e9
    why = mode_reason(cfg)
    return (f"model {cfg.model} computed on the SIMULATED driver ({why}): every kernel in numpy, about "
            f"{nbytes / 1e9:.1f} GB resident in host memory, roughly {first:.0f} min to the first step and "
            f"{step:.0f} s a step (rates of a 2-core machine); a GPU (--backend cuda), or no --verify/--oracle "
            f"(decisions-only), is far faster")

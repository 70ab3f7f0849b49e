"""The oracle's expert choices at a near-tie: where the run's router chose other experts than the oracle's for
a token, and the Q8_1 noise could have moved the router's logits that far, the oracle takes the run's choice.

The rule (near_tie). In a MoE layer the oracle's router logits z (float64, one row per token) choose the top
k (softmax is increasing, so the top k of the probabilities is the top k of z). A run on Q8_1 activations
reaches the router with its input moved by the model's own rounding noise, which moves z. The noise twins
(events/checks.ORACLE_JITTERS) measure how far: for layer il of the step, delta = the largest |z_twin - z|
over the twins, the step's tokens and the experts. Two correct runs part by up to ORACLE_NOISE_FACTOR
twins' distances (the logits bound's own calibration), and a gap z_f - z_e between two experts moves by at most
the sum of their two moves, so the tolerance is tol = 2 * ORACLE_NOISE_FACTOR * delta. Where the run's set R
and the oracle's set O differ for a token, the margin is max z over O \\ R minus min z over R \\ O (how far
the oracle's logits are from choosing R: every expert it dropped must rise, or every expert it kept fall, by
that much between them); the run's choice is followed where margin <= tol, refused otherwise (a router or
top-k kernel off, not noise: the step fails). A followed token's MoE layer is computed with R, weighted by
the oracle's own probabilities of R; its twins then take the same experts for that token and layer.

Only runs with twins (block-quantised weights on a GPU backend) and a run whose choices are read
(backends/sim_router_tap.py: the simulated driver) follow anything; F16/BF16, the CPU backend and dense
models are judged as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .events.checks import ORACLE_NOISE_FACTOR


@dataclass(frozen=True)
class Departure:
    """A token whose run chose other experts than the oracle: layer, token row, both choices (sorted expert
    ids), the oracle's margin between them and the noise's tolerance (router logits, natural-log units)."""
    layer: int
    token: int
    oracle: tuple[int, ...]
    run: tuple[int, ...]
    margin: float
    tol: float

    @property
    def followed(self) -> bool:
        return self.margin <= self.tol


def tolerance(z: np.ndarray, twins: list[np.ndarray]) -> float:
    """tol = 2 * ORACLE_NOISE_FACTOR * max|z_twin - z| over the twins' router logits of the same layer and
    step ((T, n_expert) each); 0.0 without twins (nothing is a near-tie)."""
    delta = max((float(np.max(np.abs(t - z))) for t in twins if t.shape == z.shape), default=0.0)
    return 2.0 * ORACLE_NOISE_FACTOR * delta


def margin(z: np.ndarray, oracle: np.ndarray, run: np.ndarray) -> float:
    """The oracle's logits z (n_expert,) apart from choosing `run` over `oracle` (k ids each): max z over the
    experts only the oracle chose minus min z over those only the run chose; 0.0 where the sets agree.
    A run id outside the experts is infinitely far (never a near-tie)."""
    own, theirs = set(oracle.tolist()), set(run.tolist())
    if len(theirs) != len(run) or not all(0 <= e < z.size for e in theirs):
        return float("inf")
    only_own, only_run = own - theirs, theirs - own
    if not only_run:
        return 0.0
    return float(max(z[e] for e in only_own) - min(z[e] for e in only_run))


class RouterFollow:
    """One step's expert choices between the run, the oracle and its twins (the references' router hook).

    The runner starts a step with the run's choices (start); the twins run first and record their router
    logits (record); the oracle compares its choices with the run's (decide) and keeps each Departure; where
    one was followed the twins run again taking the same experts (force)."""

    def __init__(self) -> None:
        self.start({})

    def start(self, run: dict[int, np.ndarray]) -> None:
        """run: the run's chosen ids by layer, (T, k) each (a layer not read is judged as before)."""
        self.run, self.twin_z, self.taken, self.departures = run, {}, {}, []

    @property
    def followed(self) -> list[Departure]:
        return [d for d in self.departures if d.followed]

    @property
    def refused(self) -> list[Departure]:
        return [d for d in self.departures if not d.followed]

    def record(self, il: int, z: np.ndarray, top: np.ndarray) -> np.ndarray:
        self.twin_z.setdefault(il, []).append(np.array(z))
        return top

    def decide(self, il: int, z: np.ndarray, top: np.ndarray) -> np.ndarray:
        run = self.run.get(il)
        if run is None or run.shape != top.shape:
            return top
        tol, out = tolerance(z, self.twin_z.get(il, [])), top.copy()
        for t in np.nonzero((np.sort(run, axis=1) != np.sort(top, axis=1)).any(axis=1))[0]:
            d = Departure(il, int(t), tuple(sorted(top[t].tolist())), tuple(sorted(run[t].tolist())),
                          margin(z[t], top[t], run[t]), tol)
            self.departures.append(d)
            if d.followed:
                out[t] = run[t]
                self.taken[(il, int(t))] = run[t]
        return out

    def force(self, il: int, z: np.ndarray, top: np.ndarray) -> np.ndarray:
        out = top.copy()
        for (layer, t), ids in self.taken.items():
            if layer == il:
                out[t] = ids
        return out


def refusal_line(step: int, d: Departure) -> str:
    """The failure line of a choice beyond the noise."""
    return (f"step {step}: layer {d.layer} token {d.token} chose experts {list(d.run)} where the oracle's "
            f"{list(d.oracle)} lead by {d.margin:.3g} in router logits (the noise moves them {d.tol:.3g})")

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

Only runs with twins follow anything: block-quantised weights on a GPU backend (Q8_1 twins), and float MoE
runs on one (F16 / BF16 weights: twins jittered before every product, events/checks.ORACLE_FLOAT_JITTERS,
which then run again on the oracle's experts, RouterFollow.force_all, so that their logits measure rounding
alone); the CPU backend and dense float models are judged as before. The simulated driver's choices are
read as its kernels compute them (backends/sim_router_tap.py). A CUDA run's are not readable (the
allocator reuses the top-k ids' memory within the step): there a step over its bound is judged again with
the run's choice guessed, one or two of the oracle's own near-ties at a time (near_ties, guesses): the
oracle's k-th expert of a token swapped for its best left out, where their gap is within tol. The first guess
whose step lands within the bound is followed as a read choice would be; where none does, the step fails as
it was.
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
        """run: the run's chosen ids by layer, (T, k) each (a layer not read is judged as before; a row of -1,
        one the run did not compute, too)."""
        self.run, self.twin_z, self.taken, self.departures, self.chosen = run, {}, {}, [], {}

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
            self.chosen[il] = top          # a layer no run choice names (a guess's others): the oracle's own
            return top
        tol, out = tolerance(z, self.twin_z.get(il, [])), top.copy()
        read = (run >= 0).all(axis=1)          # -1: a row whose choice was not read (not an output row)
        for t in np.nonzero(read & (np.sort(run, axis=1) != np.sort(top, axis=1)).any(axis=1))[0]:
            d = Departure(il, int(t), tuple(sorted(top[t].tolist())), tuple(sorted(run[t].tolist())),
                          margin(z[t], top[t], run[t]), tol)
            self.departures.append(d)
            if d.followed:
                out[t] = run[t]
                self.taken[(il, int(t))] = run[t]
        self.chosen[il] = out
        return out

    def force(self, il: int, z: np.ndarray, top: np.ndarray) -> np.ndarray:
        out = top.copy()
        for (layer, t), ids in self.taken.items():
            if layer == il:
                out[t] = ids
        return out

    def force_all(self, il: int, z: np.ndarray, top: np.ndarray) -> np.ndarray:
        """Every expert the oracle took in this layer (its own and those it followed): a float run's twins
        then part from the oracle by rounding noise alone, not by a near-tie of their own gone the other way.
        (Q8_1 twins keep their own choices, as their bound was calibrated; on the oracle's experts their bounds
        tighten several-fold on the simulator, not yet measured on CUDA.)"""
        ids = self.chosen.get(il)
        return ids if ids is not None and ids.shape == top.shape else top


class Probe(RouterFollow):
    """A RouterFollow that takes the oracle's own choices and keeps its router logits and top k per layer
    (the near-tie search's first pass)."""

    def __init__(self) -> None:
        super().__init__()
        self.oracle: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def decide(self, il: int, z: np.ndarray, top: np.ndarray) -> np.ndarray:
        self.oracle[il] = (np.array(z), np.array(top))
        self.chosen[il] = top
        return top


def near_ties(probe: Probe) -> list[tuple[int, int, np.ndarray]]:
    """(layer, token, the token's ids with its weakest expert swapped for the strongest left out) where the
    oracle's gap between the two is within the layer's tolerance, nearest first."""
    found = []
    for il, (z, top) in sorted(probe.oracle.items()):
        tol = tolerance(z, probe.twin_z.get(il, []))
        for t in range(top.shape[0]):
            inside = top[t]
            rest = np.setdiff1d(np.arange(z.shape[1]), inside)
            if not rest.size:
                continue
            weak, strong = inside[np.argmin(z[t, inside])], rest[np.argmax(z[t, rest])]
            gap = float(z[t, weak] - z[t, strong])
            if gap <= tol:
                found.append((gap, il, t, np.where(inside == weak, strong, inside)))
    return [(il, t, ids) for _, il, t, ids in sorted(found, key=lambda x: x[0])]


MAX_NEAR_TIES = 6          # a step with more near-ties than this is judged as it is (no search)


def guesses(probe: Probe, ties: list[tuple[int, int, np.ndarray]]) -> list[dict[int, np.ndarray]]:
    """The run's choices to try, as RouterFollow.start takes them: each near-tie alone, then each pair (a pair
    in two layers swaps the later layer's ids as the first pass chose them)."""
    ties = ties[:MAX_NEAR_TIES]
    sets = [[x] for x in ties] + [[a, b] for i, a in enumerate(ties) for b in ties[i + 1:]]
    out = []
    for chosen in sets:
        run: dict[int, np.ndarray] = {}
        for il, t, ids in chosen:
            run.setdefault(il, probe.oracle[il][1].copy())[t] = ids
        out.append(run)
    return out


def refusal_line(step: int, d: Departure) -> str:
    """The failure line of a choice beyond the noise."""
    return (f"step {step}: layer {d.layer} token {d.token} chose experts {list(d.run)} where the oracle's "
            f"{list(d.oracle)} lead by {d.margin:.3g} in router logits (the noise moves them {d.tol:.3g})")

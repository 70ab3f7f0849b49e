"""Simulated runs are deterministic: nothing in them depends on the host's speed or load (issue 8.7)."""

import time

from graphdiag import events as E
from graphdiag.cli.main import main
from support.decisions import decision_stream, first_difference
from support.simrun import of, run_sim


def test_a_slow_host_does_not_evict_on_the_simulated_driver(monkeypatch):
    """Each host clock read jumps 20 s: the eviction clock is the driver's modelled time, so nothing is
    evicted (on a wall clock every lookup would find the entry 10 s idle)."""
    real = time.monotonic_ns
    jumps = iter(range(1, 10**9))
    monkeypatch.setattr(time, "monotonic_ns", lambda: real() + next(jumps) * 20 * 10**9)
    r = run_sim(prompt_tokens=64, steps=8)
    assert not of(r, E.Evicted)
    assert r.counters.replays >= 6


def test_scenario_idle_time_still_evicts_on_the_simulated_clock():
    r = run_sim(steps=8, timeline=[{"at_step": 5, "idle_s": 11.0}])
    ev = of(r, E.Evicted)
    assert len(ev) == 1 and ev[0].step == 5 and 11e9 <= ev[0].idle_ns < 11.1e9


def test_two_identical_runs_take_identical_decisions():
    a = decision_stream(run_sim(prompt_tokens=40, steps=10, timeline=[{"at_step": 6, "batch": 2}]).events)
    b = decision_stream(run_sim(prompt_tokens=40, steps=10, timeline=[{"at_step": 6, "batch": 2}]).events)
    assert a == b, first_difference(a, b)


def test_graphdiag_diff_of_two_identical_sim_runs_exits_0(tmp_path, capsys):
    for name in ("a", "b"):
        assert main(["run", "--backend", "sim", "--steps", "6", "--prompt-tokens", "32", "--json",
                     "--events", str(tmp_path / f"{name}.jsonl")]) == 0
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0, capsys.readouterr().out

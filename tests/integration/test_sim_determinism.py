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


def test_two_identical_runs_over_two_devices_model_identical_device_time(monkeypatch):
    """The devices of a layer split start each step's modelled timeline at one host instant: how their
    kernels overlap (the step's device busy and span) is the model's, not the host's. Each host clock read
    here moves a random amount, as on a loaded host; before, two devices' timelines were placed at two
    reads and their overlap moved with the host."""
    import random
    real = time.perf_counter_ns
    rnd = random.Random(1)
    monkeypatch.setattr(time, "perf_counter_ns", lambda: real() + rnd.randrange(10**6))

    def device(r):
        return [(e.step, e.device, e.busy_ns, e.span_ns, e.idle_ns, e.n_kernels)
                for e in r.events if isinstance(e, E.DeviceTime)]
    a = run_sim(devices=2, prompt_tokens=4, steps=6)
    b = run_sim(devices=2, prompt_tokens=4, steps=6)
    assert device(a) and device(a) == device(b)


"""The simulated driver's decisions-only mode (graphdiag issue 25, point 4): kernels modelled, memory reserved,
weights never drawn, and every decision exactly as in compute mode."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.report.analysis.summary import summarize
from graphdiag.runner import Session, run
from graphdiag.scenario import load_scenario
from support.decisions import decision_stream, first_difference

ROOT = Path(__file__).resolve().parents[2]
# shipped scenarios covering batch changes, n_kv growth, chunking, fusion limits, concurrency, pool pressure and
# flushes, idle eviction, key thrash and update refusals (the MoE ones are refused in decisions-only mode)
SCENARIOS = ("batch-change", "nkv-growth", "chunk-size-64", "fusion-boundary", "concurrent-qkv", "pool-pressure",
             "pool-flush-stale-pointer", "idle-eviction", "speculative-decoding", "update-refusal-flood",
             "graph-growth-changing-pointers", "prefill-then-decode", "speculative-draft-arena")


def _run(mode: str, sc=None, **settings):
    cfg = resolve({"backend": "sim", "sim_mode": mode, **settings}, sc.run if sc else None,
                  environ=sc.environ({}) if sc else {})
    return run(cfg, sc)


def _facts(r) -> dict:
    """What must not differ between the modes: decisions, counters, memory figures, the modelled device."""
    s = summarize(r.header, r.events)
    device = [(e.step, e.n_kernels, e.busy_ns, e.span_ns, e.memcpy_ns, e.top)
              for e in r.events if isinstance(e, E.DeviceTime)]
    ended = [e.to_dict() for e in r.events if isinstance(e, E.RunEnded)]
    return {"decisions": decision_stream(r.events), "counters": r.counters.snapshot(),
            "graph_memory": dataclasses.asdict(s.graph_memory), "keys": [dataclasses.asdict(k) for k in s.keys],
            "diagnoses": s.diagnoses, "device": device, "ended": [{**d, "t_ns": 0} for d in ended],
            "mem_bytes": [(e.step, e.key, e.chunk, e.mem_bytes) for e in r.events
                          if isinstance(e, E.ChunkInstantiated)]}


def _assert_same(a: dict, b: dict) -> None:
    assert a["decisions"], "the run decided nothing: the comparison would prove nothing"
    assert a["decisions"] == b["decisions"], first_difference(a["decisions"], b["decisions"])
    for k in a:
        assert a[k] == b[k], k


@pytest.mark.parametrize("name", SCENARIOS)
def test_decisions_only_decides_exactly_as_compute_mode_on_shipped_scenarios(name):
    sc = load_scenario(name)
    compute, decisions = _run("compute", sc), _run("decisions", sc)
    assert compute.header["sim_mode"] == "compute" and decisions.header["sim_mode"] == "decisions"
    _assert_same(_facts(compute), _facts(decisions))


@pytest.mark.parametrize("settings", [
    {"model": "small", "steps": 10, "batch": 2, "prompt_tokens": 40},
    {"model": "small", "steps": 8, "wtype": "q8_0", "chunk_size": 0},
    {"model": "tiny", "steps": 8, "devices": 2, "prompt_tokens": 12},
    {"model": "tiny", "steps": 8, "pool_cap": 1 << 20},
])
def test_decisions_only_decides_exactly_as_compute_mode(settings):
    _assert_same(_facts(_run("compute", **settings)), _facts(_run("decisions", **settings)))


def test_decisions_only_draws_no_weight_holds_no_byte_and_computes_no_token():
    cfg = resolve({"backend": "sim", "model": "small", "sim_mode": "decisions"}, environ={})
    s = Session(cfg, E.EventBus())
    try:
        space = s.driver.space
        assert s.driver.counters.kernels_run > 0          # the rng_fill launches were modelled ...
        assert s.model.host.n_drawn == 0 and not space._bufs   # ... and nothing was drawn or stored
        assert space.used > 200 << 20                      # yet the weights' memory is reserved, as in compute
        free, total = s.driver.mem_get_info()
        assert free == total - space.used
    finally:
        s.close()
    r = _run("decisions", steps=3)
    assert all(e.tokens == () for e in r.events if isinstance(e, E.StepFinished))
    assert [e.steps_done for e in r.events if isinstance(e, E.RunEnded)] == [4]


def test_reserved_memory_addresses_match_compute_mode():
    """The same allocations at the same addresses: ledger rows and pool decisions see the same pointers."""
    def addrs(mode):
        cfg = resolve({"backend": "sim", "model": "tiny", "sim_mode": mode}, environ={})
        s = Session(cfg, E.EventBus())
        try:
            return [(t.name, t.data) for t in s.model.tensors()], s.driver.mem_get_info()
        finally:
            s.close()
    assert addrs("compute") == addrs("decisions")


def test_mode_defaults_to_decisions_above_small_unless_results_are_needed():
    from graphdiag.sim_mode import mode_reason, sim_mode
    cases = {("7b", False, False): "decisions", ("1b", False, False): "decisions", ("small", False, False): "compute",
             ("1b", True, False): "compute", ("7b", False, True): "compute", ("tiny", False, False): "compute"}
    for (model, verify, oracle), want in cases.items():
        cfg = resolve({"backend": "sim", "model": model, "verify": verify or None, "oracle": oracle or None},
                      environ={})
        assert sim_mode(cfg) == want, (model, verify, oracle)
    cfg = resolve({"backend": "sim", "model": "1b", "verify": True}, environ={})
    assert mode_reason(cfg) == "--verify needs computed results"


@pytest.mark.parametrize("argv, said", [
    (["--sim-mode", "decisions", "--verify"], "--verify compares them"),
    (["--sim-mode", "decisions", "--oracle"], "--oracle compares them"),
    (["--sim-mode", "decisions", "--model", "moe-tiny"], "routes tokens to experts"),
    (["--sim-mode", "compute", "--backend", "cpu"], "acts on the simulated driver only"),
    (["--sim-mode", "decisions", "--backend", "cuda"], "acts on the simulated driver only"),
])
def test_sim_mode_refusals_are_one_line_and_exit_2(argv, said, capsys):
    args = ["run", "--steps", "2", *argv]
    if "--backend" not in argv:
        args += ["--backend", "sim"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_scenario_run_key_sim_mode(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\ndescription = "d"\n[run]\nmodel = "tiny"\nsteps = 2\nsim_mode = "decisions"\n')
    sc = load_scenario(str(path))
    r = _run(None, sc)
    assert r.header["sim_mode"] == "decisions" and r.header["sim_mode_reason"] == "scenario"


def test_header_and_summary_say_which_mode_ran(tmp_path, capsys):
    rec = tmp_path / "d.jsonl"
    assert main(["run", "--backend", "sim", "--steps", "3", "--sim-mode", "decisions", "--events", str(rec)]) == 0
    out = capsys.readouterr().out
    assert "simulator: DECISIONS ONLY (--sim-mode)" in out
    assert "simulator decisions-only (tokens not computed)" in out      # the summary's overview line
    assert "generated tokens: not computed" in out and "generated (seq" not in out
    header = json.loads(rec.read_text().splitlines()[0])
    assert header["sim_mode"] == "decisions" and header["settings"]["sim_mode"] == "decisions"
    assert main(["run", "--backend", "sim", "--steps", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["header"]["sim_mode"] == "compute" and d["header"]["sim_mode_reason"] == "default for model tiny"


def test_diff_says_tokens_were_not_computed(tmp_path, capsys):
    for name, mode in (("a", "compute"), ("b", "decisions")):
        assert main(["run", "--backend", "sim", "--steps", "4", "--sim-mode", mode, "--json",
                     "--events", str(tmp_path / f"{name}.jsonl")]) == 0
    capsys.readouterr()
    main(["diff", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])
    out = capsys.readouterr().out
    assert f"Tokens: not computed in {tmp_path / 'b.jsonl'} (decisions-only simulator)" in out
    assert "decisions diverge" not in out, out


def test_verify_on_a_big_model_says_up_front_what_it_will_cost(monkeypatch):
    """The cost line comes before the model is built (here: the build is stopped right after it)."""
    import graphdiag.runner as runner
    heard = []

    def stop(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(runner, "build_model", stop)
    monkeypatch.setattr("graphdiag.model.weights.available_host_bytes", lambda: 64 << 30)   # it would fit
    from graphdiag import sim_mode
    monkeypatch.setattr(sim_mode, "measured_rates", lambda *a: sim_mode.Rates(30.0, 5.0, 60.0, 0.5))
    cfg = resolve({"backend": "sim", "model": "7b", "verify": True}, environ={})
    with pytest.raises(KeyboardInterrupt):
        Session(cfg, E.EventBus(), warn=heard.append)
    assert len(heard) == 1
    line = heard[0]
    assert "model 7b computed on the SIMULATED driver (--verify needs computed results)" in line
    # the device's 15.6 GB, a tenth more for compute buffers and temporaries, the process itself
    assert "about 17.3 GB of host memory at its peak" in line and "4 min to the first step and 34 s a step" in line


def test_7b_decisions_only_reaches_its_steps_fast_and_stays_small():
    """`run --backend sim --model 7b --steps 32`, measured in a subprocess: generous bounds (targets: 60 s,
    2 GiB; measured about 1 s and 60 MB on the 2-core machine)."""
    code = ("import resource, sys, time\n"
            "t0 = time.monotonic()\n"
            "from graphdiag.cli.main import main\n"
            "rc = main(['run', '--backend', 'sim', '--model', '7b', '--steps', '32', '--json'])\n"
            # VmHWM, not ru_maxrss: Linux carries ru_maxrss over an exec from the forked parent (pytest's size)
            "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
            "print('MEASURE', rc, time.monotonic() - t0, hwm,"
            " file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("MEASURE"))
    _, rc, wall, maxrss_kib = line.split()
    d = json.loads(p.stdout)
    assert rc == "0" and d["header"]["sim_mode"] == "decisions" and d["steps"] == 33
    assert float(wall) < 120, wall
    assert int(maxrss_kib) * 1024 < 2 << 30, maxrss_kib     # the target: under 2 GiB

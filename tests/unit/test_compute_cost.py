"""Issue 49, point 4: honest figures for computing a model on the simulator. The up-front estimate of peak
host memory holds against a measured run (the old one counted the device's bytes alone: 1b --oracle said
2.3 GB and peaked at 13.5 GB); model files above a size decide only by default, as the big presets do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag import sim_mode as sm

ROOT = Path(__file__).resolve().parents[2]
FIXED = sm.Rates(load=30.0, step=5.0, oracle_first=60.0, oracle_step=0.5)    # ns a weight


def _peak_rss(*args: str) -> int:
    """Peak RSS (bytes) of `graphdiag run ARGS`, as the run's own process reports it. Started through sh (which
    forks it): a process forked straight from this one starts its peak at this process's resident size (Linux
    keeps the forked copy's high-water mark across exec), which under pytest -n is a worker's gigabytes."""
    code = ("import atexit, resource, runpy, sys\n"
            "atexit.register(lambda: print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "file=sys.stderr))\n"
            "sys.argv = ['graphdiag', 'run', *sys.argv[1:]]\n"
            "runpy.run_module('graphdiag', run_name='__main__')\n")
    done = subprocess.run(["sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-c", code, *args],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    return int(done.stderr.strip().splitlines()[-1].split()[1]) * 1024


@pytest.mark.parametrize("settings", [{"model": "tiny", "oracle": True}])
def test_the_estimate_holds_the_measured_peak_of_an_oracle_run(settings):
    cost = sm.compute_cost(resolve({"backend": "sim", **settings}, environ={}), FIXED)
    peak = _peak_rss("--backend", "sim", "--model", settings["model"], "--oracle", "--steps", "2")
    # the oracle's float64 weights are most of it: without them the estimate was a third of the peak
    assert 0.8 * peak <= cost.resident_bytes <= 1.3 * peak, (cost, peak)
    assert cost.oracle_bytes > cost.device_bytes


def test_1b_with_the_oracle_is_estimated_at_what_it_holds(monkeypatch):
    monkeypatch.setattr(sm, "measured_rates", lambda *a: FIXED)
    from graphdiag.model import weights
    monkeypatch.setattr(weights, "available_host_bytes", lambda: 64 << 30)
    cfg = resolve({"backend": "sim", "model": "1b", "oracle": True}, environ={})
    line = sm.compute_cost_line(cfg)
    assert "about 13.7 GB of host memory at its peak, 11.0 GB of it the oracle's float64 weights" in line, line
    cost = sm.compute_cost(cfg, FIXED)
    n = 1_104_218_112                                    # 1b's weights
    assert cost.step_s == pytest.approx(n * 5.5e-9) and cost.first_step_s == pytest.approx(n * (30 + 7.5 + 60.5) * 1e-9)


def test_an_oracle_run_that_cannot_fit_is_refused_in_one_line(monkeypatch, capsys):
    from graphdiag.model import weights
    monkeypatch.setattr(weights, "available_host_bytes", lambda: 8 << 30)
    monkeypatch.setattr(sm, "measured_rates", lambda *a: pytest.fail("rates measured for a refused run"))
    assert main(["run", "--backend", "sim", "--model", "1b", "--oracle", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "13.7 GB" in err[0] and "float64" in err[0], err


def test_measured_rates_are_positive_for_each_kind_of_weight():
    from graphdiag.ir.dtypes import GGMLType
    for t in (GGMLType.F16, GGMLType.Q8_0):
        r = sm.measured_rates(t, False)
        assert min(r.load, r.step, r.oracle_first, r.oracle_step) > 0, r


def test_a_model_file_above_the_size_decides_only_by_default_and_says_so(tmp_path, capsys, monkeypatch):
    f = tmp_path / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(f)]) == 0
    cfg = resolve({"backend": "sim", "model": str(f)}, environ={})
    assert sm.sim_mode(cfg) == "compute" and "not above 0.5 G" in sm.mode_reason(cfg)
    monkeypatch.setattr(sm, "BIG_FILE_ELEMENTS", 1_000_000)
    assert sm.sim_mode(cfg) == "decisions"
    capsys.readouterr()
    assert main(["run", "--backend", "sim", "--model", str(f), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "DECISIONS ONLY (default for a model file of 0.02 G weights (above 0.0 G))" in out, out
    oracle = resolve({"backend": "sim", "model": str(f), "oracle": True}, environ={})
    assert sm.sim_mode(oracle) == "compute" and sm.mode_reason(oracle) == "--oracle needs computed results"


def test_the_generated_line_shows_every_generated_token_the_prompts_first(tmp_path, capsys):
    """Each prompt's last ubatch gives its sequence's first token (the one the first decode feeds); the
    line showed the decodes' alone. Two sequences, prompts split in three ubatches."""
    import json
    rec = tmp_path / "r.jsonl"
    assert main(["run", "--backend", "sim", "--batch", "2", "--prompt-tokens", "40", "--ubatch-size", "16",
                 "--steps", "3", "--events", str(rec)]) == 0
    out = capsys.readouterr().out
    kinds = {}
    finished = []
    for line in rec.read_text().splitlines()[1:]:
        d = json.loads(line)
        if d["kind"] == "step_started":
            kinds[d["step"]] = d["phase"]
        elif d["kind"] == "step_finished":
            finished.append((kinds[d["step"]], d["tokens"]))
    firsts = [t[0] for k, t in finished if k == "prefill" and t]
    decodes = [t for k, t in finished if k == "decode"]
    assert len(firsts) == 2 and len(decodes) == 3
    for seq in (0, 1):
        want = " ".join(map(str, [firsts[seq], *(d[seq] for d in decodes)]))
        assert f"generated (seq {seq}): {want}\n" in out, out


def test_bench_steps_gives_no_timings_for_a_decisions_only_row():
    """1b on the simulator decides only by default: its host times measure bookkeeping, not kernels, and were
    shown as a 737 µs replay (replay ÷ roofline 0.01×) beside tiny's computed 75 ms."""
    import io

    from graphdiag.bench.display import render
    from graphdiag.bench.steps import StepsOptions, bench_steps
    rows = bench_steps(StepsOptions(backend="sim", models=("1b",), steps=8, torch=False))
    (row,) = rows
    assert row["decisions_only"] and row["kernels_per_step"] > 0
    assert row["replay_ms"] is None and row["eager_ms"] is None and row["replay_over_roofline"] is None
    assert "instr_share_pct" not in row
    out = io.StringIO()
    render(rows, file=out)
    text = out.getvalue()
    assert "1b f16 (sim: decisions only)" in text and "so no timings" in text, text

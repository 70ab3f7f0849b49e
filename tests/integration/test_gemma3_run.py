"""Gemma 3 end to end: a tiny generated gemma3 GGUF (tests/support/gemma3_gguf.py) and the gemma3-tiny preset
run on the CPU backend and the simulator against the numpy oracle; the iSWA cache's reuse over a long run;
its scenario's expectation fails when the SWA cache is full-size."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag import runner
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.model.gguf_io import open_gguf
from graphdiag.report.analysis.summary import summarize
from graphdiag.report.record import RunHeader
from graphdiag.scenario import check_expectations, load_scenario
from tests.support.gemma3_gguf import TinyGemma, write_tiny_gemma3


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    return write_tiny_gemma3(tmp_path_factory.mktemp("gemma") / "gemma-small.gguf")


def _summary(settings: dict, scenario=None):
    cfg = resolve(settings, scenario=scenario.run if scenario else None, environ={})
    result = runner.run(cfg, scenario=scenario)
    return summarize(RunHeader.from_dict(result.header), result.events), result


def test_the_generated_file_reads_as_gemma3_with_llama_cpp_defaults(tiny_gemma):
    cfg = open_gguf(str(tiny_gemma)).cfg
    assert (cfg.arch, cfg.head_dim, cfg.n_embd_q, cfg.tied_output, cfg.rope_type) == ("gemma3", 32, 128, True, 2)
    assert cfg.n_swa == 16 and cfg.rope_base_swa == 10000.0 and cfg.rope_base == 1e6
    assert [il for il in range(cfg.n_layer) if not cfg.is_swa(il)] == [5]


def test_cli_run_on_the_cpu_backend_against_the_oracle(tiny_gemma, capsys):
    rc = main(["run", "--backend", "cpu", "--model", str(tiny_gemma), "--oracle", "--steps", "24",
               "--prompt-tokens", "8"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "oracle: 25 checks" in out and "0 over the bound" in out


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_sim_run_verifies_and_matches_the_oracle(tmp_path, wtype):
    path = write_tiny_gemma3(tmp_path / f"g-{wtype}.gguf", TinyGemma(wtype=wtype))
    s, result = _summary({"backend": "sim", "model": str(path), "oracle": True, "verify": True, "steps": 12,
                          "prompt_tokens": 30})        # 30 + 12 positions: past the 16-position window
    assert s.oracle_checks == 13 and s.oracle_failures == 0
    assert s.verify_checks > 0 and s.verify_mismatches == 0
    assert s.counters["replays"] >= 8


def test_the_preset_runs_on_the_sim_with_verify_and_oracle():
    s, result = _summary({"backend": "sim", "model": "gemma3-tiny", "oracle": True, "verify": True, "steps": 10,
                          "prompt_tokens": 140})       # past the preset's 128-position window
    assert s.oracle_checks == 11 and s.oracle_failures == 0 and s.verify_mismatches == 0


@pytest.mark.slow
def test_a_run_past_the_swa_cache_reuses_its_cells_and_matches_the_oracle(tiny_gemma):
    """500 + 300 positions: the SWA cache (768 cells, window 16) wraps and evicts; the logits still match
    the oracle's windowed attention over the full history, and the SWA n_kv stops at 768 while the global
    one reaches 1024."""
    s, result = _summary({"backend": "cpu", "model": str(tiny_gemma), "oracle": True, "steps": 300,
                          "prompt_tokens": 500})
    assert s.oracle_checks == 301 and s.oracle_failures == 0
    rebuilt = [e.reason for e in result.events if isinstance(e, E.ContextDecision) and not e.reused]
    assert "n_kv 512→768, n_kv (SWA) 512→768" in rebuilt and "n_kv 768→1024" in rebuilt


def test_the_swa_scenario_holds_and_would_fail_with_a_full_swa_cache():
    sc = load_scenario("swa-mask-stops-growing")
    s, _ = _summary({"backend": "sim"}, sc)
    assert check_expectations(sc, s) == []
    full = dataclasses.replace(sc, run={**sc.run, "swa_full": True})
    s, _ = _summary({"backend": "sim"}, full)
    failures = check_expectations(full, s)
    assert len(failures) == 1 and "property_diff_nodes" in failures[0] and "cache_k_l5 (view)" in failures[0]


def test_decisions_only_decides_as_compute_mode_for_gemma3():
    def facts(mode):
        _, r = _summary({"backend": "sim", "model": "gemma3-tiny", "sim_mode": mode, "steps": 30,
                         "prompt_tokens": 250})
        return [(type(e).__name__, e.step) for e in r.events
                if isinstance(e, (E.PropertyDiff, E.WarmupTransition, E.ContextDecision))]
    assert facts("compute") == facts("decisions")


def test_the_swa_n_kv_stays_as_upstream_s_with_a_small_ubatch():
    """--ubatch-size 64 on gemma3-tiny: upstream's SWA cache is pad256(128 + 64) = 256 cells
    (llama_kv_cache_iswa's size_swa with the run's n_ubatch), so its n_kv stays 256 past position 256 while
    the global one grows; sized for n_ubatch 512 (768 cells) the SWA n_kv grew 256 -> 512 (issue 46 review)."""
    s, result = _summary({"backend": "sim", "model": "gemma3-tiny", "sim_mode": "decisions", "ubatch_size": 64,
                          "prompt_tokens": 200, "steps": 80})
    rebuilt = [e.reason for e in result.events if isinstance(e, E.ContextDecision) and not e.reused]
    assert "n_kv 256→512" in rebuilt                     # the global cache's mask grows at position 256
    assert not any("n_kv (SWA)" in r for r in rebuilt), rebuilt
    assert s.counters["replays"] >= 60

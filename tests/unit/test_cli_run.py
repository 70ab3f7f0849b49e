"""`graphdiag run` and the entry point: real runs on the simulated driver, and one-line errors."""

import json

import pytest

from graphdiag import __version__
from graphdiag.cli.main import main


def _one_line_error(capsys, argv, code=2):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == code, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("graphdiag: error:") and "Traceback" not in err
    return lines[0]


def test_version_and_help(capsys):
    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("run", "report", "diff", "scenarios", "bench"):
        assert cmd in out
    assert main(["run", "--help"]) == 0
    assert "--chunk-size" in capsys.readouterr().out


def test_run_without_gpu_falls_back_to_the_announced_simulated_driver(capsys, monkeypatch):
    monkeypatch.delenv("GGML_CUDA_DISABLE_GRAPHS", raising=False)
    assert main(["run", "--steps", "4", "--prompt-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "replay" in out and "graphs reused" in out
    assert "gpu (numpy)" in out                     # per-step table: the GPU time is numpy's on the host
    gen = [l for l in out.splitlines() if l.startswith("generated (seq 0): ")]
    assert gen and len(gen[0].split(": ")[1].split()) == 5     # the prompt's token, then one a decode step


def test_run_json_summary_and_events_file(capsys, tmp_path):
    path = tmp_path / "run.jsonl"
    assert main(["run", "--backend", "sim", "--steps", "4", "--prompt-tokens", "4", "--json",
                 "--events", str(path), "--verify", "--oracle"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["failures"] == [] and d["counters"]["replays"] == 2
    header = json.loads(path.read_text().splitlines()[0])
    assert header["schema"] == "graphdiag-events" and header["simulated"] is True


def test_env_knobs_apply_and_cli_wins(capsys, monkeypatch):
    monkeypatch.setenv("GGML_CUDA_GRAPH_CHUNK_SIZE", "64")
    monkeypatch.setenv("GGML_CUDA_DISABLE_GRAPHS", "0")
    assert main(["run", "--backend", "sim", "--steps", "2", "--prompt-tokens", "4", "--chunk-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "chunk_size=32 [cli]" in out and "graphs_disabled=on [env GGML_CUDA_DISABLE_GRAPHS]" in out


@pytest.mark.parametrize("argv,needle", [
    (["run", "--backend", "sim", "--chunk-size", "-1"], "invalid chunk size -1"),
    (["run", "--backend", "sim", "--chunk-size", "lots"], "lots"),
    (["run", "--scenario", "no-such-scenario"], "unknown scenario"),
    (["run", "--backend", "sim", "--model", "13b"], "unknown model preset"),
    (["run", "--backend", "sim", "--cc", "nine"], "compute capability"),
    (["run", "--bogus"], "--bogus"),
])
def test_bad_input_is_one_line_and_nonzero(capsys, argv, needle):
    assert needle in _one_line_error(capsys, argv)


def test_cuda_backend_without_gpu_is_one_clear_line(capsys):
    from graphdiag.backends.drivers.cuda import CudaDriver
    from graphdiag.errors import NoDeviceError
    try:
        CudaDriver.open().close()
        pytest.skip("a GPU is present")
    except NoDeviceError:
        pass
    line = _one_line_error(capsys, ["run", "--backend", "cuda", "--steps", "1"])
    assert "GPU" in line or "CUDA" in line


def test_malformed_scenario_names_file_and_line(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\ndescription = "x"\n[run]\nsteps = = 3\n')
    line = _one_line_error(capsys, ["run", "--scenario", str(bad)])
    assert "bad.toml:4" in line


def test_scenario_expectation_failure_exits_1(capsys, tmp_path):
    sc = tmp_path / "strict.toml"
    sc.write_text('name = "strict"\ndescription = "expects the impossible"\n[run]\nsteps = 3\nprompt_tokens = 4\n'
                  '[expect]\nreplays_min = 50\n')
    rc = main(["run", "--scenario", str(sc)])
    out = capsys.readouterr().out
    assert rc == 1 and "FAILED: scenario strict" in out and "replays" in out


def test_a_session_that_fails_to_build_releases_its_driver(monkeypatch):
    """A bad preset (or weights that do not fit) after the driver is open: the driver and backends are closed."""
    from graphdiag import events as E
    from graphdiag.backends.drivers.sim import SimDriver
    from graphdiag.config import resolve
    from graphdiag.errors import UsageError
    from graphdiag.runner import Session

    closed = []
    real_close = SimDriver.close
    monkeypatch.setattr(SimDriver, "close", lambda self: (closed.append(self), real_close(self))[1])
    cfg = resolve({"backend": "sim", "model": "nope"}, environ={})
    with pytest.raises(UsageError, match="unknown model preset"):
        Session(cfg, E.EventBus())
    assert len(closed) == 1

"""numpy's BLAS threads: graphdiag's default is applied before numpy loads and reported; the user's wins."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphdiag.config import BLAS_ENV, BlasThreads, apply_blas_threads, default_blas_threads, usable_cores

ROOT = Path(__file__).resolve().parents[2]

# What OpenBLAS actually runs with, asked of the loaded library (numpy's wheels bundle scipy-openblas, whose
# symbols carry a prefix and suffix); None when numpy's BLAS is not an OpenBLAS.
PROBE = """
import ctypes, json, sys
from graphdiag.cli.main import main
rc = main(sys.argv[1:])
import numpy
libs = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'openblas' in l.lower()})
got = None
for path in libs:
    lib = ctypes.CDLL(path)
    for name in ('openblas_get_num_threads', 'scipy_openblas_get_num_threads64_', 'openblas_get_num_threads64_'):
        if hasattr(lib, name):
            got = getattr(lib, name)()
print(json.dumps({'rc': rc, 'openblas_threads': got}), file=sys.stderr)
"""


def _probe(tmp_path, env_extra: dict) -> tuple[dict, dict]:
    rec = tmp_path / "r.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV} | {"PYTHONPATH": str(ROOT)} | env_extra
    p = subprocess.run([sys.executable, "-c", PROBE, "run", "--backend", "sim", "--steps", "1", "--json",
                        "--events", str(rec)], capture_output=True, text=True, env=env, timeout=120)
    probe = json.loads(p.stderr.strip().splitlines()[-1])
    assert probe["rc"] == 0, p.stderr
    return json.loads(rec.read_text().splitlines()[0])["blas"], probe


def test_default_is_applied_before_numpy_loads_and_reported(tmp_path):
    blas, probe = _probe(tmp_path, {})
    cores = usable_cores()
    assert blas == {"threads": default_blas_threads(cores), "cores": cores, "source": "default"}
    if probe["openblas_threads"] is None:
        pytest.skip("numpy's BLAS is not OpenBLAS: the thread count in effect cannot be read back")
    assert probe["openblas_threads"] == default_blas_threads(cores)


def test_the_users_thread_count_wins(tmp_path):
    blas, probe = _probe(tmp_path, {"OMP_NUM_THREADS": "2"})
    assert blas["threads"] == 2 and blas["source"] == "env OMP_NUM_THREADS"
    if probe["openblas_threads"] is not None:
        assert probe["openblas_threads"] == min(2, os.cpu_count())


def test_default_rule():
    assert [default_blas_threads(n) for n in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 8, 8]


def test_apply_leaves_a_user_setting_alone_and_never_acts_once_numpy_is_loaded(monkeypatch):
    import graphdiag.config as config
    monkeypatch.setattr(config, "_blas_applied", None)     # restored afterwards: other tests' headers stay
    env = {"OPENBLAS_NUM_THREADS": "3"}
    assert apply_blas_threads(env, cores=2) == BlasThreads(3, 2, "env OPENBLAS_NUM_THREADS")
    assert env == {"OPENBLAS_NUM_THREADS": "3"}
    env = {}
    import numpy  # noqa: F401  (loaded: too late to tell its BLAS anything)
    assert apply_blas_threads(env, cores=2) == BlasThreads(None, 2, "not set") and env == {}


def test_header_line_says_the_thread_count_and_why():
    from graphdiag.report.views.console import run_mode_lines
    from graphdiag.report.record import RunHeader
    lines = run_mode_lines(RunHeader(blas=BlasThreads(1, 2, "default").to_dict()))
    assert lines == ["numpy BLAS threads: 1 (2 cores; graphdiag's default: <= 2 cores)"]
    lines = run_mode_lines(RunHeader(blas=BlasThreads(4, 16, "env MKL_NUM_THREADS").to_dict()))
    assert lines == ["numpy BLAS threads: 4 (16 cores; env MKL_NUM_THREADS)"]

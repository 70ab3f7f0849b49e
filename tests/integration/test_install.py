"""kernels/ and scenarios/ are found after a non-editable install, run from another directory."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent

PROBE = """
import graphdiag, graphdiag.resources as r
from graphdiag.scenario import list_scenarios
k, s = r.kernels_dir(), r.scenarios_dir()
assert "site-packages" in str(k) and "site-packages" in str(s), (k, s)
assert (k / "common.cuh").is_file() and len(list(k.glob("*.cu"))) >= 8
names = [x.name for x in list_scenarios()]
assert "steady-decode" in names, names
print("ok", graphdiag.__file__, len(names))
"""


@pytest.mark.slow
def test_non_editable_install_finds_kernels_and_scenarios(tmp_path):
    pytest.importorskip("hatchling")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(REPO)], cwd=tmp_path, check=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    *map(str, wheels.glob("*.whl"))], cwd=tmp_path, check=True)
    p = subprocess.run([str(py), "-c", PROBE], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert str(venv) in p.stdout and str(REPO) not in p.stdout

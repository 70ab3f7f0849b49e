"""The kernel cache folder on the real driver: read from the environment in config.py and handed down by the
runner through CudaDriver.open to NVRTC (issue 26: nvrtc.py no longer looks it up)."""

import pytest

from graphdiag.config import resolve
from graphdiag.runner import run

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_run_caches_its_cubins_in_graphdiag_cache_dir_and_reads_them_back(monkeypatch, tmp_path, devices):
    from graphdiag.backends.drivers import cuda
    if devices > cuda.device_count():
        pytest.skip(f"{devices} devices: this machine has {cuda.device_count()}")
    monkeypatch.setenv("GRAPHDIAG_CACHE_DIR", str(tmp_path / "k"))
    cfg = resolve({"backend": "cuda", "model": "tiny", "steps": 4, "devices": devices})
    r = run(cfg)
    assert r.header["backend"] == "cuda"
    cubins = sorted(p.name for p in (tmp_path / "k").glob("*.cubin"))
    assert cubins, "no CUBIN written to $GRAPHDIAG_CACHE_DIR"
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "k").glob("*.cubin")}
    run(cfg)                                 # the second run reads them: nothing rewritten
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "k").glob("*.cubin")} == before


def test_a_driver_opened_without_a_cache_dir_writes_no_cubin(monkeypatch, tmp_path):
    from graphdiag.backends.drivers.cuda import CudaDriver
    monkeypatch.setenv("GRAPHDIAG_CACHE_DIR", str(tmp_path / "k"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with CudaDriver.open() as d:
        assert d.compiler.cache_dir is None
        stem = sorted(d.compiler.kdir.glob("*.cu"))[0].stem
        assert d.compiler.cubin(stem) and d.compiler.compiled == 1     # compiled, kept nowhere on disk
    assert not (tmp_path / "k").exists() and not (tmp_path / "xdg").exists()

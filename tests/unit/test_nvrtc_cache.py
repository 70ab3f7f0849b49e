"""NVRTC compilation and its cache, without a GPU: cache key composition, the kernels folder, compile-error
formatting, and (where libnvrtc is installed) every kernel file compiled to an sm_90 CUBIN."""

from __future__ import annotations

import pytest

from graphdiag import events as E
from graphdiag import resources
from graphdiag.backends import nvrtc
from graphdiag.backends.kernels import KERNELS
from graphdiag.config import RunConfig, kernel_cache_dir
from graphdiag.errors import KernelCompileError, NoDeviceError

KEY_ARGS = dict(source=b"src", headers={"common.cuh": b"h"}, options=("-std=c++17",), arch="sm_90",
                nvrtc_version=(13, 0))


def _nvrtc_or_skip():
    try:
        return nvrtc.nvrtc_version()
    except KernelCompileError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("field, value", [("source", b"src2"), ("headers", {"common.cuh": b"h2"}),
                                          ("headers", {"other.cuh": b"h"}), ("options", ("-std=c++20",)),
                                          ("arch", "sm_100"), ("nvrtc_version", (13, 1))])
def test_cache_key_changes_with_every_input(field, value):
    assert nvrtc.cache_key(**{**KEY_ARGS, field: value}) != nvrtc.cache_key(**KEY_ARGS)


def test_cache_key_is_stable_and_ignores_header_order():
    a = nvrtc.cache_key(**{**KEY_ARGS, "headers": {"a.cuh": b"1", "b.cuh": b"2"}})
    b = nvrtc.cache_key(**{**KEY_ARGS, "headers": {"b.cuh": b"2", "a.cuh": b"1"}})
    assert a == b and len(a) == 64


def test_cache_key_is_length_prefixed():
    assert nvrtc.cache_key(**{**KEY_ARGS, "source": b"ab", "arch": "c"}) != \
        nvrtc.cache_key(**{**KEY_ARGS, "source": b"a", "arch": "bc"})


def test_the_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHDIAG_CACHE_DIR", str(tmp_path / "k"))
    assert kernel_cache_dir() == tmp_path / "k"
    monkeypatch.delenv("GRAPHDIAG_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache_dir() == tmp_path / "graphdiag" / "kernels"


def _refusing_open(seen):
    def open_(cls, device=0, compiler=None, cache_dir=None):
        seen.append((device, cache_dir))
        raise NoDeviceError("no CUDA device (test)")
    return classmethod(open_)


@pytest.mark.parametrize("devices", [1, 2])
def test_the_runner_hands_the_cache_dir_down_to_the_cuda_driver(monkeypatch, tmp_path, devices):
    # the environment is read in config.py; NVRTC gets the folder through CudaDriver.open, never looks it up
    from graphdiag.backends.drivers import cuda
    from graphdiag.runner import Session
    seen = []
    monkeypatch.setenv("GRAPHDIAG_CACHE_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(cuda.CudaDriver, "open", _refusing_open(seen))
    monkeypatch.setattr(cuda, "device_count", lambda: devices)
    with pytest.raises(NoDeviceError):
        Session(RunConfig(backend="cuda", devices=devices), E.EventBus())
    assert seen and all(cache_dir == tmp_path / "k" for _, cache_dir in seen)


def test_a_compiler_without_a_cache_dir_caches_nothing():
    assert nvrtc.KernelCompiler("sm_90").cache_dir is None


def test_arch_for_compute_capability():
    assert nvrtc.arch_for((9, 0)) == "sm_90" and nvrtc.arch_for((12, 1)) == "sm_121"


def test_kernels_dir_holds_every_catalogue_kernel():
    kdir = resources.kernels_dir()
    assert (kdir / "common.cuh").is_file()
    assert set(nvrtc.kernel_index(kdir)) == set(KERNELS)


def test_installed_data_dir_wins_over_the_checkout(monkeypatch, tmp_path):
    pkg = tmp_path / "site" / "graphdiag"
    (pkg / "_data" / "kernels").mkdir(parents=True)
    (tmp_path / "site" / "kernels").mkdir()
    monkeypatch.setattr(resources, "_PACKAGE", pkg)
    assert resources.kernels_dir() == pkg / "_data" / "kernels"
    (pkg / "_data" / "kernels").rmdir()
    assert resources.kernels_dir() == tmp_path / "site" / "kernels"
    with pytest.raises(FileNotFoundError, match="scenarios"):
        resources.scenarios_dir()


def test_a_kernel_defined_twice_is_an_error(tmp_path):
    for name in ("a.cu", "b.cu"):
        (tmp_path / name).write_text("KERNEL(dup) {}\n")
    with pytest.raises(KernelCompileError, match="dup"):
        nvrtc.kernel_index(tmp_path)


def test_unknown_kernel_names_the_folder(tmp_path):
    (tmp_path / "a.cu").write_text("KERNEL(k) {}\n")
    with pytest.raises(KernelCompileError, match="no kernel named 'nope'"):
        nvrtc.KernelCompiler("sm_90", cache_dir=tmp_path / "c", kdir=tmp_path).file_for("nope")


def test_compile_error_shows_the_file_and_nvrtc_log(tmp_path):
    _nvrtc_or_skip()
    (tmp_path / "common.cuh").write_text("#pragma once\n")
    (tmp_path / "broken.cu").write_text('#include "common.cuh"\nextern "C" __global__ void k() { undeclared_x = 1; }\n')
    comp = nvrtc.KernelCompiler("sm_90", cache_dir=tmp_path / "cache", kdir=tmp_path)
    with pytest.raises(KernelCompileError) as exc:
        comp.cubin("broken")
    msg = str(exc.value)
    assert str(tmp_path / "broken.cu") in msg and "undeclared_x" in msg and "NVRTC_ERROR_COMPILATION" in msg


def test_every_kernel_compiles_to_an_sm90_cubin_and_is_cached(tmp_path):
    _nvrtc_or_skip()
    comp = nvrtc.KernelCompiler("sm_90", cache_dir=tmp_path)
    images = comp.compile_all()
    assert comp.compiled == len(images) and all(img[:4] == b"\x7fELF" for img in images.values())
    for name in KERNELS:   # each kernel's symbol is in its file's CUBIN (extern "C": unmangled)
        assert name.encode() + b"\0" in images[comp.file_for(name)]
    again = nvrtc.KernelCompiler("sm_90", cache_dir=tmp_path)
    assert again.compile_all() == images and again.compiled == 0
    assert len(list(tmp_path.glob("*.cubin"))) == len(images) and not list(tmp_path.glob("*.tmp"))

"""CudaDriver.open() without a usable GPU: one clear NoDeviceError line, never a traceback from the bindings.
The driver calls are monkeypatched, so this runs (and means the same) on machines with and without a GPU."""

from __future__ import annotations

import pytest

from graphdiag.errors import NoDeviceError

cuda = pytest.importorskip("graphdiag.backends.drivers.cuda")
if cuda.D is None:
    pytest.skip("cuda-python is not installed", allow_module_level=True)


def test_missing_driver_library(monkeypatch):
    from cuda.pathfinder import DynamicLibNotFoundError

    def no_lib(flags):
        raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library\nmore detail')
    monkeypatch.setattr(cuda.D, "cuInit", no_lib)
    with pytest.raises(NoDeviceError, match=r"^no CUDA driver: .*NVIDIA driver library$"):
        cuda.CudaDriver.open()


def test_cuinit_error_code(monkeypatch):
    monkeypatch.setattr(cuda.D, "cuInit", lambda flags: (cuda.D.CUresult.CUDA_ERROR_NO_DEVICE,))
    monkeypatch.setattr(cuda.D, "cuGetErrorName", lambda err: (cuda.D.CUresult.CUDA_SUCCESS, b"CUDA_ERROR_NO_DEVICE"))
    with pytest.raises(NoDeviceError, match="cuInit returned CUDA_ERROR_NO_DEVICE"):
        cuda.CudaDriver.open()


def test_zero_devices(monkeypatch):
    monkeypatch.setattr(cuda.D, "cuInit", lambda flags: (cuda.D.CUresult.CUDA_SUCCESS,))
    monkeypatch.setattr(cuda.D, "cuDeviceGetCount", lambda: (cuda.D.CUresult.CUDA_SUCCESS, 0))
    with pytest.raises(NoDeviceError, match="0 devices"):
        cuda.CudaDriver.open()


def test_device_ordinal_out_of_range(monkeypatch):
    monkeypatch.setattr(cuda.D, "cuInit", lambda flags: (cuda.D.CUresult.CUDA_SUCCESS,))
    monkeypatch.setattr(cuda.D, "cuDeviceGetCount", lambda: (cuda.D.CUresult.CUDA_SUCCESS, 1))
    with pytest.raises(NoDeviceError, match="no CUDA device 3"):
        cuda.CudaDriver.open(device=3)


def test_cuda_python_absent(monkeypatch):
    monkeypatch.setattr(cuda, "D", None)
    with pytest.raises(NoDeviceError, match="cuda-python"):
        cuda.CudaDriver.open()


def test_error_mapping_names_result_and_call(monkeypatch):
    from graphdiag.errors import CaptureError, CudaError
    monkeypatch.setattr(cuda.D, "cuGetErrorName", lambda err: (cuda.D.CUresult.CUDA_SUCCESS, err.name.encode()))
    with pytest.raises(CaptureError, match="cuStreamEndCapture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"):
        cuda._check((cuda.D.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None), "cuStreamEndCapture")
    with pytest.raises(CudaError, match="cuMemFree: CUDA_ERROR_INVALID_VALUE") as exc:
        cuda._check((cuda.D.CUresult.CUDA_ERROR_INVALID_VALUE,), "cuMemFree")
    assert type(exc.value) is CudaError and exc.value.name == "CUDA_ERROR_INVALID_VALUE"
    assert cuda._check((cuda.D.CUresult.CUDA_SUCCESS, 5), "x") == 5
    assert cuda._check((cuda.D.CUresult.CUDA_SUCCESS, 1, 2), "x") == (1, 2)

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


def test_launch_structs_have_cuda_h_layout():
    """CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out: cuLaunchKernelEx reads them by offset."""
    import ctypes
    cfg, attr = cuda._LaunchConfig, cuda._LaunchAttribute
    assert ctypes.sizeof(attr) == 72 and attr.value.offset == 8           # id, pad to 8, 64-byte union
    assert (cfg.sharedMemBytes.offset, cfg.hStream.offset, cfg.attrs.offset, cfg.numAttrs.offset) == (24, 32, 40, 48)
    assert ctypes.sizeof(cfg) == 56


def _bound(pdl: bool, stream, handle: int):
    """A _Launcher without libcuda (its two entry points stand-ins) binding one prepared launch."""
    launcher = object.__new__(cuda._Launcher)
    launcher.plain, launcher.ex, launcher.pdl_id, launcher._streams = "plain", "ex", 6, {}
    h = cuda._Prepared((0xF00D, 3, 2, 1, 128, 1, 1, 4096), None, 0xABC0, pdl)
    return launcher, h, launcher.bind(h, stream, handle)


def test_plain_launch_arguments_are_packed_once_per_stream():
    stream = object()
    launcher, h, (fn, args) = _bound(False, stream, 0x5151)
    assert fn == "plain" and h.calls[id(stream)] == (fn, args)
    assert [a.value for a in args[:8]] == [0xF00D, 3, 2, 1, 128, 1, 1, 4096]
    assert (args[8].value, args[9].value, args[10].value) == (0x5151, 0xABC0, None)
    assert launcher._streams[id(stream)] is stream                        # held: its id is never reused


def test_pdl_launch_carries_the_serialisation_attribute():
    import ctypes
    launcher, h, (fn, args) = _bound(True, None, 0)
    assert fn == "ex" and len(args) == 4 and args[1].value == 0xF00D and args[2].value == 0xABC0
    cfg = args[0]._obj                                                    # the struct byref points at
    assert (cfg.gridDimX, cfg.gridDimY, cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs) == (3, 2, 128, 4096, 1)
    assert cfg.hStream is None and cfg.attrs[0].id == 6 and cfg.attrs[0].value == 1

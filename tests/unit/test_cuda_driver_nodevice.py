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


def _bare_driver(monkeypatch, pdl: bool):
    """A CudaDriver with no context: prepare() and launch() only, the function handle faked and the launch
    calls recorded (launch configs are plain structs the bindings build without a GPU)."""
    drv = object.__new__(cuda.CudaDriver)
    drv._configs, drv._shmem_opt_in, drv.tracer, drv.pdl = {}, {}, None, pdl
    drv._null_stream = cuda.D.CUstream(0)
    monkeypatch.setattr(drv, "_function", lambda name: cuda.D.CUfunction(0x1000 + len(name)), raising=False)
    calls = []

    def launch_ex(config, f, params, extra):
        calls.append((config, int(f), params))
        return (cuda.D.CUresult.CUDA_SUCCESS,)

    def plain(*args):
        raise AssertionError("cuLaunchKernel: every launch goes through cuLaunchKernelEx")
    monkeypatch.setattr(cuda.D, "cuLaunchKernelEx", launch_ex)
    monkeypatch.setattr(cuda.D, "cuLaunchKernel", plain)
    return drv, calls


@pytest.mark.parametrize("pdl", [False, True])
def test_launch_configs_built_once_per_geometry_and_stream(monkeypatch, pdl):
    """Every launch is one cuLaunchKernelEx on a config made the first time its geometry meets its stream:
    no per-call conversion of arguments or hStream (about 1 µs of the ~4 µs a launch costs on the H200's
    host), the PDL attribute exactly where GGML_CUDA_PDL is on."""
    from graphdiag.backends.abi import new_params
    from graphdiag.backends.drivers.base import Launch
    drv, calls = _bare_driver(monkeypatch, pdl)
    a = drv.prepare(Launch("add_f32", (4, 1, 1), (256, 1, 1), new_params(), 0))
    b = drv.prepare(Launch("add_f32", (4, 1, 1), (256, 1, 1), new_params(), 0))
    c = drv.prepare(Launch("add_f32", (8, 1, 1), (256, 1, 1), new_params(), 0))
    s1, s2 = cuda.D.CUstream(0x51), cuda.D.CUstream(0x52)
    for stream, launch in ((s1, a), (s1, b), (s1, a), (s2, a), (s1, c), (None, c)):
        drv.launch(stream, launch)
    configs = [cfg for cfg, _, _ in calls]
    assert configs[0] is configs[1] is configs[2]                      # one geometry, one stream
    assert len({id(x) for x in configs}) == 4                          # (a|b, s1) (a, s2) (c, s1) (c, null)
    assert [int(x.hStream) for x in configs] == [0x51, 0x51, 0x51, 0x52, 0x51, 0]
    assert [(x.gridDimX, x.blockDimX) for x in configs] == [(4, 256)] * 4 + [(8, 256)] * 2
    assert [p for _, _, p in calls] == [a.handle.argv_addr, b.handle.argv_addr, a.handle.argv_addr,
                                        a.handle.argv_addr, c.handle.argv_addr, c.handle.argv_addr]
    assert all(x.numAttrs == int(pdl) for x in configs)
    if pdl:
        attr = configs[0].attrs[0]
        assert attr.id == cuda.D.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        assert attr.value.programmaticStreamSerializationAllowed == 1

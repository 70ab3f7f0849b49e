"""Issue 25, point 3, on the real driver: CudaDriver.close tries every release when one fails and raises the
first failure once all were tried."""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]


def test_cuda_close_releases_everything_when_a_stream_destroy_fails(monkeypatch):
    import graphdiag.backends.drivers.cuda as cuda
    from graphdiag.errors import CudaError
    d = cuda.CudaDriver.open()
    d.stream_create()
    d.stream_create()
    d.event_create()
    d.mem_alloc(1 << 20)
    d.mem_alloc(1 << 20)
    calls = {"stream": 0, "mem": 0, "event": 0, "ctx": 0}
    real_stream, real_mem, real_event, real_ctx = (cuda.D.cuStreamDestroy, cuda.D.cuMemFree, cuda.D.cuEventDestroy,
                                                   cuda.D.cuDevicePrimaryCtxRelease)

    def stream_destroy(h):
        calls["stream"] += 1
        result = real_stream(h)                       # released, but reported as failed the first time
        return (cuda.D.CUresult.CUDA_ERROR_INVALID_HANDLE,) if calls["stream"] == 1 else result

    def count(name, real):
        def f(*a):
            calls[name] += 1
            return real(*a)
        return f
    monkeypatch.setattr(cuda.D, "cuStreamDestroy", stream_destroy)
    monkeypatch.setattr(cuda.D, "cuMemFree", count("mem", real_mem))
    monkeypatch.setattr(cuda.D, "cuEventDestroy", count("event", real_event))
    monkeypatch.setattr(cuda.D, "cuDevicePrimaryCtxRelease", count("ctx", real_ctx))
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_HANDLE"):
        d.close()
    assert calls["stream"] >= 2 and calls["mem"] >= 2 and calls["event"] >= 1 and calls["ctx"] == 1
    assert not any(d._owned[k] for k in d._owned)
    d.close()                                          # idempotent: nothing left, nothing raised

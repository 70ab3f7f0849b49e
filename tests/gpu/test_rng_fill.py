"""rng.cu on the GPU writes, byte for byte, what the numpy twin draws; a model loads with no host draw."""

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends import rng
from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.drivers.base import Launch
from graphdiag.backends.geometry import launch_geometry
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.ir.build import contiguous_nb
from graphdiag.ir.dtypes import GGMLType
from graphdiag.memory import quantize_q8_0
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model, load_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("wt", [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0])
def test_rng_fill_on_the_gpu_equals_the_numpy_twin(driver, stream, wt):
    ne = (4096, 37, 1, 1)
    nb = contiguous_nb(int(wt), ne)
    addr = driver.mem_alloc(nb[3])
    p = new_params()
    set_desc(p, 0, addr, int(wt), ne, nb)
    p["ip"][:3] = (*rng.seed_words(0xDEAD_BEEF_01), 123)
    p["fp"][:2] = (rng.multiplier(1 / 64), np.float32(0.25))
    name = f"rng_fill_{wt.name.lower()}"
    grid, block, shmem = launch_geometry(name, p)
    driver.launch(stream, driver.prepare(Launch(name, grid, block, p, shmem)))
    driver.stream_synchronize(stream)
    got = np.empty(nb[3], np.uint8)
    driver.memcpy_dtoh(got, addr)
    driver.mem_free(addr)
    x = rng.draw_f32(0xDEAD_BEEF_01, 123, ne[0] * ne[1], rng.multiplier(1 / 64), np.float32(0.25)).reshape(37, -1)
    want = quantize_q8_0(x) if wt == GGMLType.Q8_0 else x.astype(np.float16 if wt == GGMLType.F16 else np.float32)
    want = np.frombuffer(want.tobytes(), np.uint8)
    assert np.array_equal(got, want), f"{int((got != want).sum())} bytes differ"


def test_a_model_loads_on_the_gpu_without_host_draws_and_equals_the_twin(driver):
    m = create_model(PRESETS["tiny"], GGMLType.Q8_0, seed=4)
    gpu = GpuBackend(driver, E.EventBus(), RuntimeOptions())
    try:
        load_model(m, gpu)
        assert m.host.n_drawn == 0
        for t in m.tensors():
            got = gpu.tensor_get(t.data, t.nbytes())
            if t.name.startswith("cache_"):
                assert not got.any()
            elif t.name in ("blk.2.ffn_up.weight", "output_norm.weight", "token_embd.weight"):
                assert np.array_equal(got, np.frombuffer(m.host[t.name].tobytes(), np.uint8)), t.name
    finally:
        gpu.close()

"""Weights rng_fill cannot draw (BF16, Q4_0 ... Q6_K): drawn and quantised on the host, uploaded to the GPU
byte for byte — the bytes the simulated driver holds for the same model (tests/integration/test_quant_weights)."""

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.ir.dtypes import GGMLType
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model, load_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("wt", [GGMLType.Q4_K, GGMLType.BF16])
def test_a_host_quantised_model_uploads_its_bytes(driver, wt):
    m = create_model(PRESETS["tiny"], wt, seed=4)
    gpu = GpuBackend(driver, E.EventBus(), RuntimeOptions())
    try:
        load_model(m, gpu)
        for t in m.tensors():
            got = gpu.tensor_get(t.data, t.nbytes())
            if t.name.startswith("cache_"):
                assert not got.any()
            elif t.name in ("blk.2.ffn_up.weight", "blk.2.ffn_down.weight", "output_norm.weight", "token_embd.weight"):
                assert np.array_equal(got, np.frombuffer(m.host[t.name].tobytes(), np.uint8)), t.name
        assert m.host.n_drawn > 0                        # the new types were drawn on the host
    finally:
        gpu.close()

"""Every catalogue kernel on the GPU against graphdiag.backends.sim_kernels, on seeded random inputs with
poisoned outputs (cases.py): values within the case's bound, nothing written outside the destination view."""

from __future__ import annotations

import numpy as np
import pytest

from cases import all_cases
from kernel_cases import SimDevice, compare
from graphdiag.backends.drivers.base import Launch
from graphdiag.backends.geometry import launch_geometry

pytestmark = pytest.mark.gpu

CASES = all_cases()


class GpuDevice:
    """kernel_cases' device protocol on a CudaDriver: one launch per run, synchronised."""

    def __init__(self, driver, stream):
        self.drv, self.stream = driver, stream

    def alloc(self, n):
        return self.drv.mem_alloc(n)

    def free(self, a):
        self.drv.mem_free(a)

    def write(self, a, b):
        self.drv.memcpy_htod(a, b)

    def read(self, a, n):
        out = np.empty(n, np.uint8)
        self.drv.memcpy_dtoh(out, a)
        return out

    def run(self, name, params):
        grid, block, shmem = launch_geometry(name, params)
        launch = self.drv.prepare(Launch(name, grid, block, params, shmem))
        self.drv.launch(self.stream, launch)
        self.drv.stream_synchronize(self.stream)


@pytest.mark.parametrize("case_ref", CASES, ids=[str(r) for r in CASES])
def test_kernel_matches_the_simulator(case_ref, driver, stream, error_log):
    case = case_ref.build()
    ref = case.run(SimDevice())
    got = case.run(GpuDevice(driver, stream))
    err = compare(case, ref, got, check_bound=False)
    error_log[f"{case.kernel}[{case.id}]"] = err
    assert err <= case.bound, f"error {err:.3g} of max|ref| exceeds the bound {case.bound:.3g}"


@pytest.mark.parametrize("k, m, n", [(2048, 256, 200), (160, 300, 70), (96, 2100, 600)])
def test_mul_mat_f16_pipelined_and_register_paths_give_the_same_bits(k, m, n, driver, stream):
    """The same W and x through the pipelined path (16-byte aligned rows) and the register path (W's rows
    one half apart: not aligned): every output sums the same k16 products in the same order, so the bits agree."""
    from graphdiag.ir.dtypes import GGMLType as G
    from kernel_cases import Case
    outs = []
    for pad in (0, 1):
        c = Case("mul_mat_f16", f"paths-K{k}-M{m}-N{n}")   # the same seed: the same values both times
        w = c.rng.standard_normal((m, k)).astype(np.float32)
        x = c.randn(G.F32, k, n)
        wd = c.put(G.F16, np.concatenate([w, np.zeros((m, pad), np.float32)], axis=1))
        c.set(c.output(G.F32, m, n), c.view(wd, (k, m), (2, 2 * (k + pad))), x)
        outs.append(c.run(GpuDevice(driver, stream)))
    assert not (outs[0].view(np.uint32) == 0xFFFFFFFF).any()     # every output written
    assert outs[0].tobytes() == outs[1].tobytes()

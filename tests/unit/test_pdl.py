"""GGML_CUDA_PDL: the knob as upstream reads it, where it applies, and every kernel waiting for its
predecessors (which is what makes programmatic dependent launch safe)."""

from __future__ import annotations

import re

import pytest

from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.config import resolve
from graphdiag.resources import kernels_dir


@pytest.mark.parametrize("env,want", [({}, True), ({"GGML_CUDA_PDL": "1"}, True), ({"GGML_CUDA_PDL": "0"}, False),
                                      ({"GGML_CUDA_PDL": "no"}, False), ({"GGML_CUDA_PDL": "2x"}, True)])
def test_the_knob_is_on_unless_atoi_of_the_variable_is_zero(env, want):
    cfg = resolve({"backend": "sim"}, environ=env)
    assert cfg.pdl is want and cfg.settings()["pdl"] is want
    if env:
        assert cfg.sources["pdl"] == "env GGML_CUDA_PDL"


@pytest.mark.parametrize("cc,want", [("9.0", True), ("8.9", False), ("7.0", False)])
def test_pdl_applies_from_compute_capability_9_0(cc, want):
    d = SimDriver(compute_capability=tuple(int(x) for x in cc.split(".")))
    assert d.set_pdl(True) is want and d.pdl is want
    assert d.set_pdl(False) is False


def test_every_kernel_is_declared_through_the_macros_that_wait_for_predecessors():
    """A kernel declared with a bare __global__ would skip pdl_prologue and, launched with the PDL
    attribute, could read its inputs before the kernel ahead of it wrote them."""
    kdir = kernels_dir()
    common = (kdir / "common.cuh").read_text()
    assert re.search(r"void bounds name\(const __grid_constant__ kparams p\) \{ pdl_prologue\(\);", common)
    assert "griddepcontrol.wait" in common
    for f in sorted(kdir.glob("*.cu")):
        text = f.read_text()
        assert "__global__" not in text, f"{f.name}: declare kernels with KERNEL / KERNEL_LB"
        assert re.search(r"^\s*KERNEL(_LB)?\(", text, re.M), f.name

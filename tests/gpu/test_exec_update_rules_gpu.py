"""The CUDA driver's cuGraphExecUpdate verdicts against the simulated driver's (tests/support/update_cases.py:
the same graphs built on each): refused or not, the result, and the node named (index of count). Needs compute
capability 9.0+ for the PDL cases (programmatic edges)."""

import pytest

from support.update_cases import CASES, Graphs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_gives_the_simulated_drivers_verdict(driver, name):
    if driver.cc < 900 and name.startswith("pdl"):
        pytest.skip("PDL needs compute capability 9.0+")
    old, new, expected = CASES[name]
    g = Graphs(driver)
    try:
        got = g.verdict(lambda: old(g), lambda: new(g))
    finally:
        g.close()
    print(name, got)
    assert got == expected

"""CPU checks of the GPU kernel tests' own machinery: every case runs on the simulator, has a valid launch
geometry, produces output, and compare() accepts the simulator against itself and rejects corruptions.
(No gpu mark: this runs everywhere, so a device run is spent only on the kernels themselves.)"""

import numpy as np
import pytest

from cases import all_cases
from kernel_cases import Case, SimDevice, compare
from graphdiag.ir.dtypes import GGMLType as G

CASES = all_cases()


@pytest.mark.parametrize("case_ref", CASES, ids=[str(r) for r in CASES])
def test_case_runs_on_the_simulator_and_matches_itself(case_ref):
    case = case_ref.build()
    ref = case.run(SimDevice())
    got = case.run(SimDevice())
    assert compare(case, ref, got) == 0.0
    poison = case.bufs[case.slots[case.out].buf]
    assert not np.array_equal(ref, poison), "the simulator wrote nothing"


def _add_case():
    c = Case("add_f32", "cmp", 1e-6)
    d = c.output(G.F32, 8, 4)
    return c.set(c.view(d, (6, 4), (4, 32)), c.randn(G.F32, 6, 4), c.randn(G.F32, 6, 4))


def test_compare_rejects_a_write_outside_the_view():
    c = _add_case()
    ref = c.run(SimDevice())
    got = ref.copy()
    got[6 * 4] = 0   # byte 24: the gap after row 0's six floats
    with pytest.raises(AssertionError, match="outside the view"):
        compare(c, ref, got)


def test_compare_rejects_an_unwritten_element_and_a_wrong_value():
    c = _add_case()
    ref = c.run(SimDevice())
    got = ref.copy()
    got[:4] = 0xFF   # element (0, 0) left poisoned
    with pytest.raises(AssertionError, match="poison"):
        compare(c, ref, got)
    got = ref.copy()
    got[:4] = np.frombuffer(np.float32(np.frombuffer(ref[:4].tobytes(), np.float32)[0] + 0.5).tobytes(), np.uint8)
    with pytest.raises(AssertionError, match="exceeds the bound"):
        compare(c, ref, got)


def test_every_catalogue_kernel_has_a_case():
    from graphdiag.backends.kernels import KERNELS
    assert {c.kernel for c in CASES} == set(KERNELS)

"""The time accounting's bound rule (issue 25, point 6): a phase is GPU-bound only when the device is busy for
most of the step's wall time, the host's time before the first kernel included."""

from __future__ import annotations

import pytest

from graphdiag import events as E
from graphdiag.report.analysis.accounting import account, bound_of


def _steps(wall_ns: int, busy_ns: int, span_ns: int, n: int = 5, source: str = "cupti") -> list[E.Event]:
    """n replayed decode steps of `wall_ns` each whose kernels run `busy_ns` within `span_ns`."""
    out: list[E.Event] = []
    for step in range(n):
        out += [E.StepStarted(step=step, t_ns=step * wall_ns, phase="decode", n_tokens=1, n_seqs=1),
                E.DeviceTime(step=step, t_ns=step * wall_ns + 1, source=source, n_kernels=50, busy_ns=busy_ns,
                             span_ns=span_ns, idle_ns=span_ns - busy_ns),
                E.StepFinished(step=step, t_ns=(step + 1) * wall_ns, duration_ns=wall_ns, mode="replay")]
    return out


def test_a_long_host_prelude_before_back_to_back_kernels_is_host_bound():
    """138 ms of wall, 110 µs of device busy with no idle gap between the kernels: the device waited for the
    host before its first kernel for nearly all the step (the old rule compared busy with the gaps only)."""
    phase = account(_steps(138_000_000, 110_000, 110_000)).phases[0]
    assert (phase.phase, phase.wall_ns, phase.busy_ns, phase.idle_ns) == ("replay", 138_000_000, 110_000, 0)
    assert phase.bound == "host"


def test_a_step_the_device_keeps_busy_is_gpu_bound():
    phase = account(_steps(1_200_000, 1_150_000, 1_160_000)).phases[0]
    assert phase.bound == "GPU"


def test_a_simulated_step_reads_host_bound_too():
    """The same rule on the modelled device timeline: numpy's wall time against modelled busy time."""
    assert account(_steps(150_000_000, 109_700, 109_700, source="modelled")).phases[0].bound == "host"


@pytest.mark.parametrize("wall,busy,bound", [(1000, 500, "GPU"), (1000, 499, "host"), (0, 0, "host"),
                                             (1000, 1000, "GPU")])
def test_the_bound_is_busy_against_half_the_wall(wall, busy, bound):
    assert bound_of(wall, busy) == bound

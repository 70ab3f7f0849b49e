"""Where a run's device activity comes from, beside the runtime that issues the work: the simulated
driver's modelled timeline (simulated.py), CUPTI on CUDA (cupti.py, the one module that imports it);
attribution.py names each kernel by the graphdiag node(s) it computes and sums a step into DeviceTime.
Next: real llama.cpp observed through CUPTI callbacks, producing the same events into the same bus.
"""

from __future__ import annotations

from .attribution import DeviceSourceUnavailable
from .simulated import MultiDeviceSource, SimDeviceSource


def open_device_source(driver, want_cupti: bool, more_drivers=()):
    """The device source for `driver` (and the other devices of a layer split): modelled on the simulated
    driver, CUPTI on CUDA when asked for (DeviceSourceUnavailable when cupti-python is missing; on several
    devices its records are all filed under device 0), None for the CPU backend."""
    if driver is None:
        return None
    if driver.simulated:
        return MultiDeviceSource([driver, *more_drivers]) if more_drivers else SimDeviceSource(driver)
    if not want_cupti:
        return None
    from .cupti import CuptiSource      # imports cupti-python: only when asked for
    return CuptiSource(driver)

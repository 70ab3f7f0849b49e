"""GPU fixtures: one CudaDriver for the session, skipped (never failed) where there is no usable GPU."""

from __future__ import annotations

import json
import os

import pytest

from graphdiag.errors import NoDeviceError


@pytest.fixture(scope="session")
def driver():
    from graphdiag.backends.drivers.cuda import CudaDriver
    from graphdiag.config import kernel_cache_dir
    try:
        drv = CudaDriver.open(cache_dir=kernel_cache_dir())
    except NoDeviceError as exc:
        pytest.skip(f"no GPU: {exc}")
    yield drv
    drv.close()


@pytest.fixture
def stream(driver):
    s = driver.stream_create()
    yield s
    driver.stream_destroy(s)


@pytest.fixture(scope="session")
def error_log():
    """Measured kernel errors {case: error}; written to $GRAPHDIAG_KERNEL_ERRORS (JSON) at the end, to set
    the bounds from measurements."""
    errors: dict[str, float] = {}
    yield errors
    path = os.environ.get("GRAPHDIAG_KERNEL_ERRORS")
    if path and errors:
        with open(path, "w") as f:
            json.dump(errors, f, indent=1, sort_keys=True)


@pytest.fixture(scope="session")
def require_gpu():
    """Skip (never fail) tests that open their own CudaDriver where there is no usable GPU."""
    from graphdiag.backends.drivers.cuda import CudaDriver
    try:
        CudaDriver.open().close()
    except NoDeviceError as exc:
        pytest.skip(f"no GPU: {exc}")


def pytest_terminal_summary(terminalreporter):
    """The differential test's seeds and outcomes per seed, on the controller (under pytest -n the module's
    own print of its seeds is a worker's, which xdist swallows): a note can name every seed that ran."""
    from tests.support.diff_seeds import seed_summary
    line = seed_summary(terminalreporter.stats)
    if line:
        terminalreporter.write_line(line)

"""Close paths that release everything: each release is attempted even when one before it fails.

    with releasing() as release:
        release(self.sched.close)
        for addr in self.buffers:
            release(self.driver.mem_free, addr)

Every call runs; the first error (a CUDA error, an interrupt) is raised once all were tried, so one
handle that will not go does not leak the others. Used by Session, DeviceSet, GpuBackend, the allocator
and the drivers."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


class Releases:
    """Calls releases, keeping the first error; `raise_first()` raises it."""

    __slots__ = ("first",)

    def __init__(self):
        self.first: BaseException | None = None

    def __call__(self, release: Callable, *args) -> None:
        try:
            release(*args)
        except BaseException as e:          # a Ctrl-C during one release still lets the others run
            if self.first is None:
                self.first = e

    def raise_first(self) -> None:
        e, self.first = self.first, None
        if e is not None:
            raise e


@contextlib.contextmanager
def releasing() -> Iterator[Releases]:
    """A Releases whose first error is raised when the block ends (the block's own error wins)."""
    r = Releases()
    yield r
    r.raise_first()

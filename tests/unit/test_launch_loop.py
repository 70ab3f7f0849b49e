"""The eager launch loop (backends/drivers/launch_loop.c), built with the host's C compiler and driven here
through a stand-in for cuLaunchKernelEx: rows launch in order with their three words, the first failure
stops the run and is reported with its index, and the loader says why when it cannot build."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
from pathlib import Path

import pytest

from graphdiag.backends.drivers import launch_loop

needs_cc = pytest.mark.skipif(launch_loop.compiler() is None, reason="no C compiler on this machine")

LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def _stand_in(fail_at: int | None = None, code: int = 701):
    seen = []

    def launch(config, f, params, extra):
        seen.append((config, f, params, extra))
        return code if fail_at is not None and len(seen) - 1 == fail_at else 0
    fn = LAUNCH_EX(launch)
    return fn, ctypes.cast(fn, ctypes.c_void_p).value, seen


def _rows(n: int) -> tuple[bytes, list[tuple[int, int, int]]]:
    words = [(0x1000 + 16 * i, 0x2000 + 32 * i, 0x3000 + 48 * i) for i in range(n)]
    return b"".join(struct.pack("<3Q", *w) for w in words), words


@needs_cc
def test_rows_launch_in_order_with_their_words(tmp_path):
    loop, why = launch_loop.load(tmp_path, environ={})
    assert loop is not None, why
    fn, addr, seen = _stand_in()
    rows, words = _rows(37)
    assert loop.run(addr, rows, 37) == (37, 0)
    assert [(c, f, p) for c, f, p, _ in seen] == words
    assert all(extra is None for *_, extra in seen)       # extra is NULL


@needs_cc
def test_the_first_failing_launch_stops_the_run(tmp_path):
    loop, _ = launch_loop.load(tmp_path, environ={})
    fn, addr, seen = _stand_in(fail_at=5, code=701)
    rows, _ = _rows(12)
    assert loop.run(addr, rows, 12) == (5, 701)
    assert len(seen) == 6                                 # the failing one was tried, none after it
    assert loop.run(addr, rows, 0) == (0, 0)


@needs_cc
def test_the_library_is_built_once_and_then_taken_from_the_folder(tmp_path):
    first, _ = launch_loop.load(tmp_path, environ={})
    built = list(tmp_path.glob("launch_loop-*.so"))
    assert len(built) == 1 and not list(tmp_path.glob("*.tmp"))
    stamp = built[0].stat().st_mtime_ns
    again, _ = launch_loop.load(tmp_path, environ={"CC": "/nonexistent/cc"} | {"PATH": os.environ["PATH"]})
    # another compiler names another library: the first stays as it was
    assert built[0].stat().st_mtime_ns == stamp
    same, _ = launch_loop.load(tmp_path, environ={})
    assert same.path == first.path and built[0].stat().st_mtime_ns == stamp


def test_without_a_compiler_the_loader_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    loop, why = launch_loop.load(tmp_path, environ={"PATH": ""})
    assert loop is None and why == "no C compiler ($CC, cc, gcc or clang)"


def test_the_environment_can_turn_the_loop_off(tmp_path):
    loop, why = launch_loop.load(tmp_path, environ={launch_loop.ENV: "0"})
    assert loop is None and why == "GRAPHDIAG_LAUNCH_LOOP=0"


def test_a_compiler_that_fails_is_named_with_its_first_line(tmp_path):
    cc = tmp_path / "badcc"
    cc.write_text("#!/bin/sh\necho 'badcc: error: no such luck' >&2\nexit 1\n")
    cc.chmod(0o755)
    loop, why = launch_loop.load(tmp_path / "cache", environ={"CC": str(cc)})
    assert loop is None and why == "badcc failed on launch_loop.c: badcc: error: no such luck"
    assert not list((tmp_path / "cache").glob("*"))       # nothing half-written is left


@needs_cc
def test_an_unwritable_cache_builds_in_a_private_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        loop, why = launch_loop.load(ro, environ={})
        assert loop is not None, why
        assert Path(loop.path).parent != ro
    finally:
        ro.chmod(0o755)

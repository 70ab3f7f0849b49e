"""The eager launch loop (launch_loop.c), compiled with the host's C compiler on first use and loaded with ctypes.

An eager step hands CudaDriver.launch_batch its prepared launches a block at a time; the loop issues them
through libcuda's cuLaunchKernelEx in one call from Python, on the same CUlaunchConfig structs, CUfunction
handles and kernelParams arrays the one-by-one path (CudaDriver.launch) passes through cuda.bindings. The
launches, their order and the stream are the same; only the host time between them differs.

The shared object is cached beside the CUBINs (named by a hash of the source and the compiler), written
atomically. Where no compiler is found, or it fails, `load` says why and the driver launches one by one;
GRAPHDIAG_LAUNCH_LOOP=0 asks for that too (to measure the difference).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("launch_loop.c")
ENV = "GRAPHDIAG_LAUNCH_LOOP"
ROW_WORDS = 3                      # config address, CUfunction, kernelParams address
COMPILE_TIMEOUT_S = 60


class LaunchLoop:
    """The loaded loop: `run(launch_fn, rows, n)` -> (launched, CUresult of the failing launch or 0)."""

    def __init__(self, fn, path: Path):
        self.fn, self.path = fn, path     # fn: the ctypes function graphdiag_launch_rows
        self._err = ctypes.c_int32(0)
        self._err_ref = ctypes.byref(self._err)

    def run(self, launch_fn: int, rows: bytes, n: int) -> tuple[int, int]:
        done = self.fn(launch_fn, rows, n, self._err_ref)
        return done, self._err.value


def compiler(environ=None) -> str | None:
    """The C compiler: $CC, else cc, gcc or clang on PATH (None: none)."""
    environ = os.environ if environ is None else environ
    cc = environ.get("CC")
    if cc:
        return shutil.which(cc) or (cc if Path(cc).is_file() else None)
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _library_name(cc: str) -> str:
    key = hashlib.sha256(SOURCE.read_bytes() + b"\0" + os.path.realpath(cc).encode()).hexdigest()[:24]
    return f"launch_loop-{key}.so"


def _bind(path: Path) -> LaunchLoop:
    lib = ctypes.CDLL(str(path))
    fn = lib.graphdiag_launch_rows
    fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int32)]
    fn.restype = ctypes.c_int64
    return LaunchLoop(fn, path)


def load(cache_dir: Path | None, environ=None) -> tuple[LaunchLoop | None, str]:
    """(the loop, "") or (None, why not) — never raises. Compiles into `cache_dir` (None, or unwritable: a
    private temporary folder) unless a library built from this source by this compiler is there."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV, "1").strip() in ("0", "off", "no", "false"):
        return None, f"{ENV}={environ[ENV]}"
    cc = compiler(environ)
    if cc is None:
        return None, "no C compiler ($CC, cc, gcc or clang)"
    name = _library_name(cc)
    if cache_dir and (Path(cache_dir) / name).is_file():
        try:
            return _bind(Path(cache_dir) / name), ""
        except OSError:
            pass                           # a damaged file: build again below
    try:
        out_dir = Path(cache_dir) if cache_dir else None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(out_dir, os.W_OK):
                out_dir = None
        out_dir = out_dir or Path(tempfile.mkdtemp(prefix="graphdiag-launch-loop-"))
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=name, suffix=".tmp")
        os.close(fd)
        try:
            done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)], capture_output=True,
                                  text=True, timeout=COMPILE_TIMEOUT_S)
            if done.returncode != 0:
                first = (done.stderr.strip().splitlines() or ["no message"])[0]
                return None, f"{Path(cc).name} failed on launch_loop.c: {first}"
            os.replace(tmp, out_dir / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return _bind(out_dir / name), ""
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"the launch loop could not be built: {exc}"

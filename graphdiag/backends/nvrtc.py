"""NVRTC: compile kernels/*.cu to CUBIN for one GPU architecture, cached on disk in the folder it is given
(config.kernel_cache_dir(), handed down through CudaDriver.open by the runner; none given: no disk cache).

With drivers/cuda.py, the only module importing cuda-python. CUBIN, never PTX: a driver JIT-compiles only
PTX up to its own ISA version, and an NVRTC newer than the driver emits newer PTX (driver 580 = CUDA 13.0
rejects NVRTC 13.1's `.version 9.1`); machine code for the exact architecture skips the JIT altogether.

The cache key covers everything that changes the machine code: the file's source, every header, the
options, the architecture and the NVRTC version. Files are written atomically (temp file + rename), so
concurrent processes never read half a CUBIN. NVRTC needs no GPU and no driver, only libnvrtc.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import KernelCompileError
from ..resources import kernels_dir

# Kernels are declared with KERNEL(name) / KERNEL_LB(name, threads) (kernels/common.cuh).
_KERNEL_DECL = re.compile(r"^\s*KERNEL(?:_LB)?\((\w+)", re.MULTILINE)
BASE_OPTIONS = ("-std=c++17",)


def arch_for(cc: tuple[int, int]) -> str:
    """NVRTC's real architecture for a compute capability: (9, 0) -> 'sm_90'."""
    return f"sm_{cc[0]}{cc[1]}"


def cache_key(source: bytes, headers: Mapping[str, bytes], options: Sequence[str], arch: str,
              nvrtc_version: tuple[int, int]) -> str:
    """sha256 (hex) over everything that changes the CUBIN; headers in name order."""
    h = hashlib.sha256()
    for part in (b"graphdiag-cubin-1", source, *(n.encode() + b"\0" + headers[n] for n in sorted(headers)),
                 "\0".join(options).encode(), arch.encode(), f"{nvrtc_version[0]}.{nvrtc_version[1]}".encode()):
        h.update(len(part).to_bytes(8, "little"))   # length-prefixed: no two inputs hash alike by shifting
        h.update(part)
    return h.hexdigest()


def kernel_index(kdir: Path) -> dict[str, str]:
    """Kernel name -> the stem of the .cu file defining it."""
    index: dict[str, str] = {}
    for path in sorted(kdir.glob("*.cu")):
        for name in _KERNEL_DECL.findall(path.read_text()):
            if name in index:
                raise KernelCompileError(f"kernel {name} is defined in both {index[name]}.cu and {path.name}")
            index[name] = path.stem
    return index


def _nvrtc():
    from cuda.bindings import nvrtc   # imported late: the CPU-only paths never need it
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the libnvrtc actually loaded; KernelCompileError when it cannot be loaded."""
    try:
        err, major, minor = _nvrtc().nvrtcVersion()
    except Exception as exc:   # cuda.pathfinder's DynamicLibNotFoundError when libnvrtc is absent
        raise KernelCompileError(f"NVRTC is not available: {str(exc).splitlines()[0]}") from exc
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def _check(err, call: str, path: str = "") -> None:
    if int(err) != 0:
        nv = _nvrtc()
        name = nv.nvrtcGetErrorString(err)[1].decode()
        raise KernelCompileError(f"{path + ': ' if path else ''}{call} failed: {name}")


def compile_cubin(source: bytes, path: str, headers: Mapping[str, bytes], options: Sequence[str]) -> bytes:
    """One NVRTC compilation to CUBIN; KernelCompileError carries `path` and NVRTC's log on failure."""
    nv = _nvrtc()
    names = sorted(headers)
    err, prog = nv.nvrtcCreateProgram(source, path.encode(), len(names), [headers[n] for n in names],
                                      [n.encode() for n in names])
    _check(err, "nvrtcCreateProgram", path)
    try:
        opts = [o.encode() for o in options]
        (err,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            log = _program_log(nv, prog)
            name = nv.nvrtcGetErrorString(err)[1].decode()
            raise KernelCompileError(f"{path}: NVRTC {name} ({' '.join(options)})\n{log}".rstrip())
        err, size = nv.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize", path)
        buf = b" " * size
        (err,) = nv.nvrtcGetCUBIN(prog, buf)
        _check(err, "nvrtcGetCUBIN", path)
        return buf
    finally:
        nv.nvrtcDestroyProgram(prog)


def _program_log(nv, prog) -> str:
    err, size = nv.nvrtcGetProgramLogSize(prog)
    if int(err) != 0 or size <= 1:
        return ""
    buf = b" " * size
    nv.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace")


@dataclass
class KernelCompiler:
    """Compiles and caches the CUBIN of each kernels/*.cu file for one architecture (e.g. 'sm_90')."""

    arch: str
    cache_dir: Path | None = None      # None: no disk cache; caching is skipped if it is unwritable
    kdir: Path | None = None           # None: resources.kernels_dir()
    extra_options: tuple[str, ...] = ()
    compiled: int = field(default=0, init=False)   # NVRTC runs (cache misses), for tests and reports
    _index: dict[str, str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.kdir = Path(self.kdir) if self.kdir else kernels_dir()
        self.cache_dir = Path(self.cache_dir) if self.cache_dir else None

    @property
    def options(self) -> tuple[str, ...]:
        return (f"--gpu-architecture={self.arch}", *BASE_OPTIONS, *self.extra_options)

    def file_for(self, kernel: str) -> str:
        """The stem of the .cu file defining `kernel`; KernelCompileError if no file does."""
        if self._index is None:
            self._index = kernel_index(self.kdir)
        try:
            return self._index[kernel]
        except KeyError:
            raise KernelCompileError(f"no kernel named {kernel!r} in {self.kdir}") from None

    def headers(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.kdir.glob("*.cuh"))}

    def cache_path(self, stem: str) -> Path:
        """Where the CUBIN of kernels/<stem>.cu is cached (needs a cache_dir)."""
        path = self.kdir / f"{stem}.cu"
        key = cache_key(path.read_bytes(), self.headers(), self.options, self.arch, nvrtc_version())
        return self.cache_dir / f"{stem}-{self.arch}-{key[:24]}.cubin"

    def cubin(self, stem: str) -> bytes:
        """The CUBIN of kernels/<stem>.cu: from the cache, else compiled now (and cached)."""
        path = self.kdir / f"{stem}.cu"
        cached = self.cache_path(stem) if self.cache_dir is not None else None
        if cached is not None:
            try:
                return cached.read_bytes()
            except OSError:
                pass
        image = compile_cubin(path.read_bytes(), str(path), self.headers(), self.options)
        self.compiled += 1
        if cached is not None:
            _write_atomic(cached, image)
        return image

    def compile_all(self) -> dict[str, bytes]:
        """Every kernel file's CUBIN, by stem."""
        return {p.stem: self.cubin(p.stem) for p in sorted(self.kdir.glob("*.cu"))}


def _write_atomic(path: Path, data: bytes) -> None:
    """Best effort: a read-only or full cache costs a recompile next time, never an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass

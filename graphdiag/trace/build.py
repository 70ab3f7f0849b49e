"""The injection library (gdtrace.c), compiled with the host's C compiler on first use into the kernel cache.

Why built on first use, not shipped in the wheel: graphdiag's wheel is pure Python (`py3-none-any`); a
shipped shared object would make it one wheel per platform and libc, and the library must match the CUPTI
headers of the CUPTI it is loaded beside. It needs no CUDA toolkit: the headers come from the nvidia wheels
(`nvidia-cuda-cupti` for cupti*.h and the generated_*_meta.h parameter layouts, `nvidia-cuda-runtime` for
cuda.h / cuda_runtime_api.h, `nvidia-cuda-crt` for crt/host_defines.h, all under nvidia/cu13/include) or
$CUDA_HOME/include (with extras/CUPTI/include). It links nothing but -ldl -lpthread: CUPTI and libcuda are
opened at run time, libcupti from GRAPHDIAG_CUPTI_PATH, which `cupti_library` finds here. As the eager
launch loop (backends/drivers/launch_loop.py): the same compiler search, cached by a hash of the source, the
compiler and the header folder, written atomically.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from ..backends.drivers.launch_loop import compiler
from ..errors import TraceError

SOURCE = Path(__file__).with_name("gdtrace.c")
COMPILE_TIMEOUT_S = 60
NEEDED_HEADERS = ("cupti.h", "generated_cuda_meta.h", "cuda.h", "cuda_runtime_api.h", "crt/host_defines.h")
EXPORTED = ("InitializeInjection", "gdtrace_encode", "gdtrace_rec_init", "gdtrace_encode_batch", "llama_decode",
            "llama_process", "llama_batch_ext_clear", "llama_batch_ext_free", "llama_batch_ext_add",
            "llama_batch_ext_add_token", "llama_batch_ext_add_embd", "llama_batch_ext_add_seq",
            "llama_batch_ext_set_pos", "llama_batch_ext_set_output_logits", "llama_batch_ext_set_output_embd",
            "gdtrace_attach", "gdtrace_detach", "gdtrace_flush", "gdtrace_own_ns")
API_ENV = "GRAPHDIAG_TRACE_API"           # how the library reads CUDA's calls (gdtrace.c, start)
# the CUDA runtime's functions the GD_INTERPOSE build adds (GRAPHDIAG_TRACE_API=interpose)
INTERPOSED = ("cudaGraphLaunch", "cudaGraphLaunch_ptsz", "cudaStreamSynchronize", "cudaStreamSynchronize_ptsz",
              "cudaDeviceSynchronize", "cudaStreamBeginCapture", "cudaStreamBeginCapture_ptsz",
              "cudaStreamEndCapture", "cudaStreamEndCapture_ptsz", "cudaGraphInstantiate",
              "cudaGraphInstantiateWithFlags", "cudaGraphInstantiateWithParams",
              "cudaGraphInstantiateWithParams_ptsz", "cudaGraphExecUpdate", "cudaGraphExecDestroy",
              "cudaGraphDestroy")


def _wheel_dirs(sub: str) -> list[Path]:
    """nvidia/cu13/<sub> of every installed nvidia wheel folder (a namespace package: several roots)."""
    try:
        import nvidia
    except ImportError:
        return []
    return [Path(p) / "cu13" / sub for p in getattr(nvidia, "__path__", [])]


def _cuda_home(environ) -> list[Path]:
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    return [Path(home)] if home else []


def include_dirs(environ=None) -> list[Path]:
    """Folders that together hold every header gdtrace.c needs (raises TraceError naming what is missing)."""
    environ = os.environ if environ is None else environ
    candidates = _wheel_dirs("include") + [p for h in _cuda_home(environ)
                                           for p in (h / "include", h / "extras" / "CUPTI" / "include")]
    dirs = [d for d in candidates if d.is_dir()]
    missing = [h for h in NEEDED_HEADERS if not any((d / h).is_file() for d in dirs)]
    if missing:
        raise TraceError(f"no CUDA headers to build graphdiag's tracing library ({', '.join(missing)} not found): "
                         "install the nvidia-cuda-cupti, nvidia-cuda-runtime and nvidia-cuda-crt wheels "
                         "(pip install 'graphdiag[test]') or set CUDA_HOME to a CUDA toolkit")
    return dirs


def cupti_library(environ=None) -> Path:
    """libcupti's path: the nvidia-cuda-cupti wheel's, else the toolkit's under $CUDA_HOME (TraceError: none)."""
    environ = os.environ if environ is None else environ
    if environ.get("GRAPHDIAG_CUPTI_PATH"):
        p = Path(environ["GRAPHDIAG_CUPTI_PATH"])
        if p.is_file():
            return p
        raise TraceError(f"GRAPHDIAG_CUPTI_PATH={p}: no such file")
    folders = _wheel_dirs("lib") + [p for h in _cuda_home(environ)
                                    for p in (h / "extras" / "CUPTI" / "lib64", h / "lib64")]
    for d in folders:
        for name in ("libcupti.so.13", "libcupti.so"):
            if (d / name).is_file():
                return d / name
    raise TraceError("no CUPTI library found (libcupti.so.13): install the nvidia-cuda-cupti wheel or set "
                     "CUDA_HOME to a CUDA toolkit with CUPTI (or GRAPHDIAG_CUPTI_PATH to libcupti)")


def interpose_defines(environ) -> list[str]:
    """GRAPHDIAG_TRACE_API=interpose: a build that defines the CUDA runtime's graph and sync functions (gdtrace.c,
    GD_INTERPOSE), its own file, so that no other trace carries the interposers."""
    return ["-DGD_INTERPOSE"] if environ.get(API_ENV) == "interpose" else []


def library(cache_dir: Path | None, environ=None) -> Path:
    """The built library's path, compiled into `cache_dir` unless a build of this source by this compiler
    with these headers is there (TraceError, one line: no compiler, no headers, the compiler failed)."""
    environ = os.environ if environ is None else environ
    cc = compiler(environ)
    if cc is None:
        raise TraceError("no C compiler ($CC, cc, gcc or clang) to build graphdiag's tracing library")
    incs = include_dirs(environ)
    defines = interpose_defines(environ)
    key = hashlib.sha256(SOURCE.read_bytes() + b"\0" + os.path.realpath(cc).encode() + b"\0"
                         + "\0".join(map(str, [*incs, *defines])).encode()).hexdigest()[:24]
    name = f"gdtrace-{key}.so"
    if cache_dir and (Path(cache_dir) / name).is_file():
        return Path(cache_dir) / name
    out_dir = _writable(cache_dir)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=name, suffix=".tmp")
    os.close(fd)
    try:
        args = [cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", *defines, *(f"-I{d}" for d in incs), "-o", tmp,
                str(SOURCE), "-ldl", "-lpthread"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            raise TraceError(f"{Path(cc).name} failed on gdtrace.c: {first}")
        os.replace(tmp, out_dir / name)
    except (OSError, subprocess.SubprocessError) as exc:
        raise TraceError(f"graphdiag's tracing library could not be built: {exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out_dir / name


def _writable(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        try:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            if os.access(cache_dir, os.W_OK):
                return Path(cache_dir)
        except OSError:
            pass
    return Path(tempfile.mkdtemp(prefix="graphdiag-trace-"))

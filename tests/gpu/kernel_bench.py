"""Kernel microbenchmark on the real GPU: the decode and prefill shapes of tiny / 1b / 7b.

    PYTHONPATH=. python tests/gpu/kernel_bench.py [--json FILE] [--only SUBSTRING]

Each row launches a node's kernels as the lowering does (Q8_0: quantize_q8_1 then the kernel; attention:
partials then combine) on random data, times `batch` back-to-back repetitions between CUDA events after a
warm-up, and reports the median over `reps` windows: microseconds per node, GB/s of weight (+ KV) bytes,
TFLOP/s for the mat-muls. Not a test (no gpu-marked asserts): a measurement for the kernel author.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from graphdiag.backends.abi import Q8_1, Q8_1_BYTES, new_params, set_desc
from graphdiag.backends.drivers.base import Launch
from graphdiag.backends.geometry import fa_plan, launch_geometry
try:
    from graphdiag.backends.geometry import fa_vec
except ImportError:   # older trees: one partial kernel
    fa_vec = None
try:
    from graphdiag.backends.kernels import fa_mma_kernel
except ImportError:   # older trees: the CUDA-core batch kernel
    fa_mma_kernel = None
try:
    from graphdiag.backends.kernels import fa_direct_kernel
except ImportError:   # older trees: the g1 vec entry with ip[3]
    def fa_direct_kernel(d):
        return fa_vec_kernel(d, 1)
try:
    from graphdiag.backends.kernels import fa_vec_kernel
except ImportError:   # older trees: one decode kernel for every head size and group
    def fa_vec_kernel(d, g):
        return "flash_attn_vec_f16"
from graphdiag.ir.build import contiguous_nb
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.memory import quantize_q8_0

RNG = np.random.default_rng(0)


class Bench:
    def __init__(self, drv):
        self.drv, self.stream = drv, drv.stream_create()
        self.e0, self.e1 = drv.event_create(timing=True), drv.event_create(timing=True)
        self.bufs: list[int] = []

    def buf(self, host: np.ndarray | None = None, nbytes: int = 0) -> int:
        n = host.nbytes if host is not None else nbytes
        a = self.drv.mem_alloc(max(n, 256))
        if host is not None:
            self.drv.memcpy_htod(a, np.frombuffer(host.tobytes(), np.uint8))
        self.bufs.append(a)
        return a

    def tensor(self, t, ne, values=None):
        ne = tuple(ne) + (1,) * (4 - len(ne))
        nb = contiguous_nb(t, ne)
        if values is None:
            shape = ne[::-1]
            x = RNG.standard_normal(shape).astype(np.float32)
            values = quantize_q8_0(x) if t == G.Q8_0 else x.astype({G.F16: np.float16, G.F32: np.float32}[t])
        return (self.buf(values), int(t), ne, nb)

    def q8_1(self, k, n):
        row = Q8_1_BYTES * (k // 32)
        return (self.buf(nbytes=row * n), Q8_1, (k, n, 1, 1), (Q8_1_BYTES, row, row * n, row * n))

    def launch(self, name, descs, ip=(), fp=()):
        p = new_params()
        for i, d in enumerate(descs):
            if d is not None:
                set_desc(p, i, *d)
        p["ip"][: len(ip)] = ip
        p["fp"][: len(fp)] = fp
        grid, block, shmem = launch_geometry(name, p)
        return self.drv.prepare(Launch(name, grid, block, p, shmem))

    def window_us(self, issue, reps=15) -> float:
        """Median µs of `issue()` between two events, after a warm-up call."""
        issue()
        self.drv.stream_synchronize(self.stream)
        times = []
        for _ in range(reps):
            self.drv.event_record(self.e0, self.stream)
            issue()
            self.drv.event_record(self.e1, self.stream)
            self.drv.stream_synchronize(self.stream)
            times.append(self.drv.event_elapsed_ms(self.e0, self.e1) * 1e3)
        return statistics.median(times)

    def time_us(self, launches, batch=20, reps=15) -> float:
        for _ in range(3):
            for l in launches:
                self.drv.launch(self.stream, l)
        self.drv.stream_synchronize(self.stream)
        times = []
        for _ in range(reps):
            self.drv.event_record(self.e0, self.stream)
            for _ in range(batch):
                for l in launches:
                    self.drv.launch(self.stream, l)
            self.drv.event_record(self.e1, self.stream)
            self.drv.stream_synchronize(self.stream)
            times.append(self.drv.event_elapsed_ms(self.e0, self.e1) * 1e3 / batch)
        return statistics.median(times)

    def free(self):
        for a in self.bufs:
            self.drv.mem_free(a)
        self.bufs.clear()


def mat_vec_rows(b: Bench, only: str):
    shapes = {"tiny": [(512, 512), (512, 1408), (1408, 512), (512, 4096)],
              "1b": [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 32000)],
              "7b": [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 32000)],
              "gemma": [(640, 262144), (640, 1024), (640, 256), (1024, 640), (2048, 640)]}
    for preset, ks in shapes.items():
        for w, t in (("f16", G.F16), ("q8_0", G.Q8_0)):
            for k, m in ks:
                name = f"mmv {w} {preset} K{k} M{m}"
                if only not in name:
                    continue
                W, x, d = b.tensor(t, (k, m)), b.tensor(G.F32, (k, 1)), b.tensor(G.F32, (m, 1), np.zeros(m, np.float32))
                if t == G.Q8_0:
                    xq = b.q8_1(k, 1)
                    ls = [b.launch("quantize_q8_1", [xq, x]), b.launch("mul_mat_vec_q8_0", [d, W, xq])]
                else:
                    ls = [b.launch("mul_mat_vec_f16", [d, W, x])]
                us = b.time_us(ls)
                wbytes = k * m * (2 if t == G.F16 else 34 / 32)
                yield {"row": name, "us": round(us, 2), "GB_s": round(wbytes / us / 1e3, 1)}
                b.free()


def glu_rows(b: Bench, only: str):
    for preset, k, m in (("tiny", 512, 1408), ("1b", 2048, 8192), ("7b", 4096, 11008)):
        for w, t in (("f16", G.F16), ("q8_0", G.Q8_0)):
            name = f"mmv glu {w} {preset} K{k} M{m}"
            if only not in name:
                continue
            Wg, Wu, x = b.tensor(t, (k, m)), b.tensor(t, (k, m)), b.tensor(G.F32, (k, 1))
            d = b.tensor(G.F32, (m, 1), np.zeros(m, np.float32))
            if t == G.Q8_0:
                xq = b.q8_1(k, 1)
                ls = [b.launch("quantize_q8_1", [xq, x]), b.launch("mul_mat_vec_glu_q8_0", [d, Wg, Wu, xq], ip=(2,))]
            else:
                ls = [b.launch("mul_mat_vec_glu_f16", [d, Wg, Wu, x], ip=(2,))]
            us = b.time_us(ls)
            wbytes = 2 * k * m * (2 if t == G.F16 else 34 / 32)
            yield {"row": name, "us": round(us, 2), "GB_s": round(wbytes / us / 1e3, 1)}
            b.free()


def attention_rows(b: Bench, only: str):
    for name, d, h, hkv, t, n_kv in (("fa decode tiny", 64, 8, 8, 1, 256), ("fa decode 1b", 64, 32, 8, 1, 256),
                                     ("fa decode 7b", 128, 32, 32, 1, 256), ("fa decode 1b kv4096", 64, 32, 8, 1, 4096),
                                     ("fa prefill tiny T200", 64, 8, 8, 200, 256),
                                     ("fa prefill 1b T512", 64, 32, 8, 512, 512)):
        if only not in name:
            continue
        tq, n_split, chunk, nbytes = fa_plan(d, h, hkv, n_kv, t)
        q = b.tensor(G.F32, (d, h, t))
        kc, vc = b.tensor(G.F16, (d, hkv, n_kv)), b.tensor(G.F16, (d, hkv, n_kv))
        m = np.zeros((t, n_kv), np.float32)
        for i in range(t):
            m[i, n_kv - t + i + 1:] = -np.inf
        mask = b.tensor(G.F16, (n_kv, t), m.astype(np.float16))
        ne = (d + 2, n_split, h, t)
        part = (b.buf(nbytes=nbytes), int(G.F32), ne, contiguous_nb(G.F32, ne))
        dst = b.tensor(G.F32, (d, h, t), np.zeros((t, h, d), np.float32))
        kernel = (fa_vec_kernel(d, h // hkv) if fa_vec is not None and fa_vec(h, hkv, t)
                  else fa_mma_kernel(d) if fa_mma_kernel is not None else "flash_attn_ext_f16")
        ls = [b.launch(kernel, [part, q, kc, vc, mask], ip=(chunk, tq), fp=(0.125,)),
              b.launch("flash_attn_combine_f32", [dst, part])]
        us = b.time_us(ls, batch=10)
        us_part = b.time_us(ls[:1], batch=10)
        flop = 4 * d * h * t * n_kv / (2 if t > 1 else 1)
        yield {"row": name, "kernel": kernel, "us": round(us, 2), "partials_us": round(us_part, 2), "n_split": n_split,
               "chunk": chunk, "TFLOP_s": round(flop / us / 1e6, 2)}
        b.free()


def direct_attention_rows(b: Bench, only: str):
    """Gemma 3's decode attention where upstream runs its vec kernel alone (D 256, 4 heads on 1 kv head, n_kv
    256): one launch writing the node, the 4 heads in one block (g4) or one block per head (g1, ip[3])."""
    d, h, hkv, n_kv = 256, 4, 1, 256
    for per_head in (False, True):
        name = f"fa decode gemma direct {'per-head' if per_head else 'grouped'}"
        if only not in name:
            continue
        q = b.tensor(G.F32, (d, h, 1))
        kc, vc = b.tensor(G.F16, (d, hkv, n_kv)), b.tensor(G.F16, (d, hkv, n_kv))
        mask = b.tensor(G.F16, (n_kv, 1), np.zeros((1, n_kv), np.float16))
        dst = b.tensor(G.F32, (d, h, 1), np.zeros((1, h, d), np.float32))
        kernel = fa_direct_kernel(d) if per_head else fa_vec_kernel(d, h // hkv)
        ls = [b.launch(kernel, [dst, q, kc, vc, mask], ip=(n_kv, 1, 1, int(per_head)), fp=(0.0625,))]
        yield {"row": name, "kernel": kernel, "us": round(b.time_us(ls, batch=10), 2)}
        b.free()


def mat_mul_rows(b: Bench, only: str):
    for w, t in (("f16", G.F16), ("q8_0", G.Q8_0)):
        for k, m, n in ((2048, 2048, 512), (2048, 8192, 512), (8192, 2048, 512), (4096, 11008, 512),
                        (512, 1408, 200)):
            name = f"mm {w} K{k} M{m} N{n}"
            if only not in name:
                continue
            W, x = b.tensor(t, (k, m)), b.tensor(G.F32, (k, n))
            d = b.tensor(G.F32, (m, n), np.zeros((n, m), np.float32))
            if t == G.Q8_0:
                xq = b.q8_1(k, n)
                ls = [b.launch("quantize_q8_1", [xq, x]), b.launch("mul_mat_q8_0", [d, W, xq])]
            else:
                ls = [b.launch("mul_mat_f16", [d, W, x])]
            us = b.time_us(ls, batch=5, reps=9)
            yield {"row": name, "us": round(us, 1), "TFLOP_s": round(2 * k * m * n / us / 1e6, 1)}
            b.free()


PARAM_SRC = r"""
struct P576 { unsigned long long a[72]; };
struct P64 { unsigned long long a[8]; };
// spread: nine fields, one per 64-byte line of the struct (as a kparams kernel reads t[0..5]'s ne/nb)
extern "C" __global__ void k576_spread(const P576 p) {
    unsigned long long s = 0;
#pragma unroll
    for (int i = 0; i < 72; i += 8) s += p.a[i];
    if (threadIdx.x == 0 && s == 1) *(int *)p.a[0] = 1;
}
extern "C" __global__ void k576_one(const P576 p) { if (threadIdx.x == 0 && p.a[1] == 1) *(int *)p.a[0] = 1; }
extern "C" __global__ void k64(const P64 p) {
    unsigned long long s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += p.a[i];
    if (threadIdx.x == 0 && s == 1) *(int *)p.a[0] = 1;
}
extern "C" __global__ void k8(unsigned long long a) { if (threadIdx.x == 0 && a == 1) *(int *)a = 1; }
"""


def param_rows(b: Bench, only: str):
    """What a kernel's parameter block costs per node of a replayed graph and per eager launch: 400 one-block
    kernels that do nothing, taking 576 bytes (graphdiag's kparams, nine 64-byte lines read or one), 64 or 8.
    Not graphdiag's kernels: a question for its ABI (ggml's kernels take ~100-200 bytes of scalars)."""
    from cuda.bindings import driver as D

    from graphdiag.backends.nvrtc import compile_cubin
    rows = [(n, size) for n, size in (("k576_spread", 576), ("k576_one", 576), ("k64", 64), ("k8", 8))
            if only in f"launch params {n}"]
    if not rows:
        return
    arch = "sm_%d%d" % tuple(b.drv.info.compute_capability)
    image = np.frombuffer(compile_cubin(PARAM_SRC.encode(), "params.cu", {}, (f"--gpu-architecture={arch}",)),
                          np.uint8).copy()
    err, mod = D.cuModuleLoadData(image.ctypes.data)
    assert not err, err
    n_launch = 400
    for name, size in rows:
        err, fn = D.cuModuleGetFunction(mod, name.encode())
        assert not err, err
        arg = np.zeros(size // 8, np.uint64)
        argv = np.array([arg.ctypes.data], np.uint64)

        def launch_all(args=(fn, 1, 1, 1, 128, 1, 1, 0), argv=argv):
            for _ in range(n_launch):
                (e,) = D.cuLaunchKernel(*args, b.drv._s(b.stream), argv.ctypes.data, 0)
                assert not e, e
        launch_all()
        b.drv.stream_synchronize(b.stream)
        eager = b.window_us(launch_all) / n_launch
        b.drv.begin_capture(b.stream)
        launch_all()
        graph = b.drv.end_capture(b.stream)
        exe = b.drv.instantiate(graph)
        replay = b.window_us(lambda: b.drv.graph_launch(exe, b.stream)) / n_launch
        b.drv.exec_destroy(exe)
        b.drv.graph_destroy(graph)
        yield {"row": f"launch params {name}", "bytes": size, "eager_us_per_kernel": round(eager, 3),
               "replay_us_per_kernel": round(replay, 3)}
    D.cuModuleUnload(mod)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--only", default="", help="substring(s) of the row names, comma-separated")
    args = ap.parse_args(argv)
    from graphdiag.backends.drivers.cuda import CudaDriver
    from graphdiag.config import kernel_cache_dir
    drv = CudaDriver.open(cache_dir=kernel_cache_dir())
    b = Bench(drv)
    rows = []
    from quant_bench import quant_rows   # the file's weight types (kernels/mmvq.cu)
    for gen in (mat_vec_rows, glu_rows, attention_rows, direct_attention_rows, mat_mul_rows, quant_rows, param_rows):
        for only in args.only.split(","):
            for row in gen(b, only):
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    drv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

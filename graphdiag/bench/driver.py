"""Micro benchmark of the CUDA driver layer (needs a GPU): python -m graphdiag.bench.driver [--json PATH]

Measures, as medians after warm-up:
  launch_host_us        host time of one launch as the driver makes it (cuLaunchKernelEx on a config built
                        once, no attributes; pre-packed params, tiny kernel, no sync). Before 2026-12-04
                        it timed cuLaunchKernel, so older figures are not comparable
  launch_host_us_pdl    the same with the PDL attribute (as eager launches on 9.0+)
  launch_host_us_loop   the PDL launch issued 1000 at a time through launch_batch (the C launch loop, as
                        eager steps launch; one by one through the bindings where it could not be built:
                        launcher says which)
  capture_ms            stream capture of a graph of --kernels tiny kernels (host time)
  instantiate_ms        cuGraphInstantiate of that graph
  update_ms             cuGraphExecUpdate to a recapture with other pointers (same topology)
  replay_us_per_kernel  GPU time of one graph launch (CUDA events) / number of kernels
  eager_us_per_kernel   GPU time of the same kernels launched one by one on a stream (events) / number
  mat-vec rows          mul_mat_vec_{f16,q8_0} on the 1b preset's largest shapes: us per launch and the
                        weight-streaming bandwidth in GB/s (bytes of W, x and dst / time)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from ..backends.abi import new_params, set_desc
from ..backends.drivers.base import Launch
from ..backends.geometry import launch_geometry
from ..ir.build import contiguous_nb
from ..ir.dtypes import GGMLType as G
from ..memory import quantize_q8_0
from .timing import median_ns


def _prepared(drv, name, slots, fp=()):
    """slots: [(addr, type, ne)] contiguous tensors."""
    p = new_params()
    for i, (addr, t, ne) in enumerate(slots):
        set_desc(p, i, addr, t, ne, contiguous_nb(t, ne))
    p["fp"][: len(fp)] = fp
    grid, block, shmem = launch_geometry(name, p)
    return drv.prepare(Launch(name, grid, block, p, shmem))


def _median_ms(fn, reps: int, warmup: int = 2) -> float:
    return median_ns(fn, reps, warmup) / 1e6


def _gpu_ms(drv, stream, fn, reps: int) -> float:
    """Median GPU time of fn(stream) between two timing events, after one warm-up."""
    start, end = drv.event_create(timing=True), drv.event_create(timing=True)
    fn(stream)
    times = []
    for _ in range(reps):
        drv.event_record(start, stream)
        fn(stream)
        drv.event_record(end, stream)
        times.append(drv.event_elapsed_ms(start, end))
    drv.event_destroy(start)
    drv.event_destroy(end)
    return statistics.median(times)


def bench_launch_and_graphs(drv, stream, n_kernels: int) -> dict:
    n = 256
    bufs = [drv.mem_alloc(4 * n) for _ in range(4)]
    vec = (G.F32, (n, 1, 1, 1))
    chain_a = [_prepared(drv, "add_f32", [(bufs[(i + 1) % 2], *vec), (bufs[i % 2], *vec), (bufs[2], *vec)])
               for i in range(n_kernels)]
    chain_b = [_prepared(drv, "add_f32", [(bufs[(i + 1) % 2], *vec), (bufs[i % 2], *vec), (bufs[3], *vec)])
               for i in range(n_kernels)]
    one = chain_a[0]
    per_rep = 1000

    def launches():
        for _ in range(per_rep):
            drv.launch(stream, one)

    def timed_launches():   # host time of the launches only; the sync is outside the timed window
        t0 = time.perf_counter_ns()
        launches()
        dt = time.perf_counter_ns() - t0
        drv.stream_synchronize(stream)
        return dt

    timed_launches()
    launch_us = statistics.median(timed_launches() for _ in range(15)) / per_rep / 1e3
    # the same launch as eager runs it on 9.0+ (GGML_CUDA_PDL on by default): its config carries the
    # programmatic stream serialisation attribute
    pdl_us = loop_us = None
    run = [one] * per_rep

    def timed_batch():
        t0 = time.perf_counter_ns()
        drv.launch_batch(stream, run)
        dt = time.perf_counter_ns() - t0
        drv.stream_synchronize(stream)
        return dt

    if drv.set_pdl(True):
        drv.prepare(one)
        timed_launches()
        pdl_us = statistics.median(timed_launches() for _ in range(15)) / per_rep / 1e3
        timed_batch()
        loop_us = statistics.median(timed_batch() for _ in range(15)) / per_rep / 1e3
        drv.set_pdl(False)
        drv.prepare(one)

    def capture(chain):
        drv.begin_capture(stream)
        try:
            for launch in chain:
                drv.launch(stream, launch)
        finally:
            graph = drv.end_capture(stream)
        return graph

    capture_ms = _median_ms(lambda: drv.graph_destroy(capture(chain_a)), reps=10)
    ga, gb = capture(chain_a), capture(chain_b)
    inst_ms = _median_ms(lambda: drv.exec_destroy(drv.instantiate(ga)), reps=10)
    exec_ = drv.instantiate(ga)
    flip = [gb, ga]

    def update():
        flip.reverse()
        if not drv.exec_update(exec_, flip[0]).ok:
            raise RuntimeError("same-topology update refused")
    update_ms = _median_ms(update, reps=20)
    replay_ms = _gpu_ms(drv, stream, lambda s: drv.graph_launch(exec_, s), reps=20)
    eager_ms = _gpu_ms(drv, stream, lambda s: [drv.launch(s, x) for x in chain_a], reps=10)
    drv.exec_destroy(exec_)
    drv.graph_destroy(ga)
    drv.graph_destroy(gb)
    for b in bufs:
        drv.mem_free(b)
    return {"kernels": n_kernels, "launch_host_us": launch_us, "launch_host_us_pdl": pdl_us,
            "launch_host_us_loop": loop_us, "launcher": drv.launcher,
            "capture_ms": capture_ms,
            "instantiate_ms": inst_ms, "update_ms": update_ms,
            "replay_us_per_kernel": replay_ms * 1e3 / n_kernels, "eager_us_per_kernel": eager_ms * 1e3 / n_kernels}


def bench_mat_vec(drv, stream, reps: int = 50) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for wname, t in (("f16", G.F16), ("q8_0", G.Q8_0), ("f32", G.F32)):
        for k, m in ((2048, 8192), (8192, 2048)):
            w = rng.standard_normal((m, k)).astype(np.float32)
            host = quantize_q8_0(w) if t == G.Q8_0 else w.astype(np.float16 if t == G.F16 else np.float32)
            host = np.frombuffer(host.tobytes(), np.uint8)
            bw, bx, bd = drv.mem_alloc(host.nbytes), drv.mem_alloc(4 * k), drv.mem_alloc(4 * m)
            drv.memcpy_htod(bw, host)
            drv.memcpy_htod(bx, rng.standard_normal(k).astype(np.float32))
            launch = _prepared(drv, f"mul_mat_vec_{wname}",
                               [(bd, G.F32, (m, 1, 1, 1)), (bw, t, (k, m, 1, 1)), (bx, G.F32, (k, 1, 1, 1))])
            batch = 20   # launches per timed window, so event resolution does not dominate
            ms = _gpu_ms(drv, stream, lambda s: [drv.launch(s, launch) for _ in range(batch)], reps) / batch
            nbytes = host.nbytes + 4 * (k + m)
            rows.append({"kernel": f"mul_mat_vec_{wname}", "K": k, "M": m, "us": ms * 1e3,
                         "GB_per_s": nbytes / (ms * 1e-3) / 1e9})
            for b in (bw, bx, bd):
                drv.mem_free(b)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m graphdiag.bench.driver", description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=300, help="kernels in the captured graph (default 300)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    from ..backends.drivers.cuda import CudaDriver
    from ..config import kernel_cache_dir
    from ..errors import GraphdiagError
    try:
        drv = CudaDriver.open(cache_dir=kernel_cache_dir())
    except GraphdiagError as exc:
        print(f"bench_driver: {exc}", file=sys.stderr)
        return exc.exit_code
    with drv:
        stream = drv.stream_create()
        graphs = bench_launch_and_graphs(drv, stream, args.kernels)
        mat_vec = bench_mat_vec(drv, stream)
    out = {"device": drv.info.name, "graphs": graphs, "mat_vec": mat_vec}
    print(f"device: {drv.info.name}")
    for k, v in graphs.items():
        print(f"  {k:22s} {v:10.3f}" if isinstance(v, float) else f"  {k:22s} {v if v is not None else '—':>10}")
    for r in mat_vec:
        print(f"  {r['kernel']:18s} K={r['K']:5d} M={r['M']:5d} {r['us']:8.2f} us {r['GB_per_s']:8.1f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

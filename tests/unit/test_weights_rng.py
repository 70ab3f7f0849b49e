"""Weights from the counter-based generator: the numpy twin of rng.cu (bit-exact), drawn where they live."""

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends import rng
from graphdiag.backends.abi import new_params, set_desc
from graphdiag.backends.cpu import CpuBackend
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.backends.sim_kernels import run_kernel
from graphdiag.memory import aligned
from graphdiag.cli.main import main
from graphdiag.errors import UsageError
from graphdiag.ir.build import contiguous_nb
from graphdiag.ir.dtypes import GGMLType
from graphdiag.memory import AddressSpace, quantize_q8_0
from graphdiag.model import weights as W
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model, load_model

MASK = (1 << 64) - 1
PINNED = [62805, -18060, 33682, 62064]   # c of elements 0..3 of stream (seed 0, tensor 0)


def _lanes_scalar(key: int, i: int) -> int:
    """The hash of element i in plain Python integers: an independent check of numpy's uint64 wrapping."""
    z = rng.mix64_int((key + (i + 1) * rng.GOLDEN) & MASK)
    return sum((z >> s) & 0xFFFF for s in (0, 16, 32, 48)) - 2 * 65535


def test_the_hash_is_pinned_and_numpy_wraps_like_python_integers():
    key = rng.stream_key(7, 3)
    assert key == rng.mix64_int(7 * rng.GOLDEN + 4)
    got = rng.centred_lanes(key, 1000, 64)
    assert got.tolist() == [_lanes_scalar(key, 1000 + j) for j in range(64)]
    # pinned: a change of generator changes every model's weights, so it must be deliberate
    assert rng.mix64_int(rng.GOLDEN) == 0xE220A8397B1DCDAF   # splitmix64's published first output (seed 0)
    assert rng.stream_key(0, 0) == 0x5692161D100B05E5
    assert rng.centred_lanes(rng.stream_key(0, 0), 0, 4).tolist() == PINNED


def test_values_have_the_asked_scale_and_centre_and_streams_differ():
    x = rng.draw_f32(1, 5, 1 << 18, rng.multiplier(0.5), np.float32(1.0))
    assert abs(float(x.mean()) - 1.0) < 0.01 and abs(float(x.std()) - 0.5) < 0.01
    assert float(np.abs(x - 1).max()) <= 0.5 * 3.47
    y = rng.draw_f32(1, 6, 1 << 18, rng.multiplier(0.5), np.float32(1.0))
    z = rng.draw_f32(2, 5, 1 << 18, rng.multiplier(0.5), np.float32(1.0))
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.01 and abs(np.corrcoef(x, z)[0, 1]) < 0.01
    # chunked drawing is the same stream as one draw
    a = rng.draw_f32(1, 5, rng.CHUNK + 100, rng.multiplier(1.0), np.float32(0.0))
    assert np.array_equal(a[rng.CHUNK:], rng.centred_lanes(rng.stream_key(1, 5), rng.CHUNK, 100)
                          .astype(np.float32) * rng.multiplier(1.0) + np.float32(0.0))


def test_seed_words_round_trip_through_the_kernel_scalars():
    for seed in (0, 1, 0xFFFFFFFF, 0x1_0000_0001, -1):
        lo, hi = rng.seed_words(seed)
        assert ((lo & 0xFFFFFFFF) | (hi & 0xFFFFFFFF) << 32) == seed & MASK


@pytest.mark.parametrize("wt", [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0])
def test_the_sim_kernel_writes_what_the_host_twin_draws(wt):
    """rng_fill_* on simulated device memory == draw_f32 -> the stored type, byte for byte."""
    ne = (64, 5, 1, 1)
    space = AddressSpace(base=0x7000_0000_0000)
    nb = contiguous_nb(int(wt), ne)
    addr = space.alloc(nb[3])
    p = new_params()
    set_desc(p, 0, addr, int(wt), ne, nb)
    p["ip"][:3] = (*rng.seed_words(0x1234_5678_9A), 17)
    p["fp"][:2] = (rng.multiplier(0.125), np.float32(0.0))
    run_kernel(space, f"rng_fill_{wt.name.lower()}", p)
    x = rng.draw_f32(0x1234_5678_9A, 17, 64 * 5, rng.multiplier(0.125), np.float32(0.0)).reshape(5, 64)
    want = quantize_q8_0(x) if wt == GGMLType.Q8_0 else x.astype(np.float16 if wt == GGMLType.F16 else np.float32)
    assert np.array_equal(space.bytes(addr, nb[3]), np.frombuffer(want.tobytes(), np.uint8))


def _sim_gpu(memory_bytes=8 << 30):
    drv = SimDriver(memory_bytes=memory_bytes)
    return drv, GpuBackend(drv, E.EventBus(), RuntimeOptions())


@pytest.mark.parametrize("wt", [GGMLType.F16, GGMLType.Q8_0])
def test_a_gpu_load_draws_on_the_device_and_the_host_reproduces_it(wt):
    m = create_model(PRESETS["tiny"], wt, seed=9)
    drv, gpu = _sim_gpu(memory_bytes=1 << 20)          # too small: the device is sized for the model
    load_model(m, gpu)
    assert m.host.n_drawn == 0                           # nothing drawn on the host
    assert drv.info.total_memory > 60 << 20
    for t in m.tensors():
        got = gpu.tensor_get(t.data, t.nbytes())
        if t.name.startswith("cache_"):
            assert not got.any()
        elif t.name in ("blk.0.attn_norm.weight", "blk.3.ffn_down.weight", "output.weight"):
            assert np.array_equal(got, np.frombuffer(m.host[t.name].tobytes(), np.uint8)), t.name
    gpu.close()
    drv.close()


def test_a_cpu_load_draws_on_the_host_and_matches_the_device_values():
    m = create_model(PRESETS["tiny"], GGMLType.F16, seed=9)
    cpu = CpuBackend()
    load_model(m, cpu)
    assert m.host.n_drawn == len(m.host)
    t = next(t for t in m.tensors() if t.name == "blk.1.attn_q.weight")
    assert np.array_equal(cpu.tensor_get(t.data, t.nbytes()), np.frombuffer(m.host[t.name].tobytes(), np.uint8))


def test_weights_keep_their_scales():
    m = create_model(PRESETS["tiny"], GGMLType.F32, seed=2)
    cfg = PRESETS["tiny"]
    assert 0.95 < float(m.dense("blk.0.ffn_down.weight").std() * np.sqrt(cfg.n_ff)) < 1.05
    assert 0.95 < float(m.dense("token_embd.weight").std()) < 1.05
    norm = m.dense("blk.0.attn_norm.weight")
    assert abs(float(norm.mean()) - 1) < 0.02 and 0.08 < float(norm.std()) < 0.12
    assert not np.array_equal(m.dense("blk.0.attn_q.weight"), m.dense("blk.1.attn_q.weight"))


def test_a_model_that_cannot_fit_is_refused_up_front_naming_the_bytes(monkeypatch):
    monkeypatch.setattr(W, "available_host_bytes", lambda: 1 << 30)
    m = create_model(PRESETS["1b"], GGMLType.F16, seed=0)
    drv, gpu = _sim_gpu()
    with pytest.raises(UsageError) as exc:
        load_model(m, gpu)
    msg = str(exc.value)
    need = sum(aligned(t.nbytes()) for t in m.tensors())
    assert f"{need:,} bytes" in msg and "1b" in msg and "\n" not in msg
    assert drv.space.used == 0 and m.host.n_drawn == 0   # refused before any allocation or draw
    gpu.close()
    drv.close()


def test_run_7b_without_a_gpu_is_one_line_and_exit_2(capsys, monkeypatch):
    """Computing 7b on the simulated driver needs its bytes in host memory (no cost line: the refusal says it)."""
    monkeypatch.setattr(W, "available_host_bytes", lambda: 4 << 30)
    rc = main(["run", "--backend", "sim", "--model", "7b", "--steps", "1", "--sim-mode", "compute"])
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == 2 and len(lines) == 1 and "bytes" in lines[0] and "7b" in lines[0], err


def test_run_7b_decisions_only_fits_a_small_host(capsys, monkeypatch):
    """Decisions-only (7b's default without --verify/--oracle) reserves the device's memory: none of it is host memory."""
    monkeypatch.setattr(W, "available_host_bytes", lambda: 4 << 30)
    assert main(["run", "--backend", "sim", "--model", "7b", "--steps", "1", "--json"]) == 0
    out = capsys.readouterr()
    assert '"sim_mode": "decisions"' in out.out and "loading" not in out.err, out.err


def test_load_progress_reaches_the_callback():
    seen = []
    m = create_model(PRESETS["tiny"], GGMLType.F16, with_data=False)
    token = W.LOAD_PROGRESS.set(lambda done, total: seen.append((done, total)))
    try:
        load_model(m, CpuBackend())
    finally:
        W.LOAD_PROGRESS.reset(token)
    total = sum(t.nbytes() for t in m.tensors())
    assert seen[-1] == (total, total) and len(seen) == len(m.tensors())


@pytest.mark.parametrize("n", [1, rng.CHUNK - 1, 3 * rng.CHUNK + 5])
def test_a_draw_is_the_same_bits_on_one_thread_or_many(monkeypatch, n):
    """draw_f32 and the F16 store split their work over the host's cores: the bytes are those of one thread
    and of the element-wise formula (value = f32(c) * mul + add, each f32-rounded; F16 as numpy's cast)."""
    import graphdiag.parallel as par
    from graphdiag.quants import quantize
    mul, add = rng.multiplier(0.02), np.float32(0.25)
    monkeypatch.setattr(par, "threads", lambda: 1)
    one = rng.draw_f32(3, 9, n, mul, add)
    monkeypatch.setattr(par, "threads", lambda: 7)
    many = rng.draw_f32(3, 9, n, mul, add)
    assert one.tobytes() == many.tobytes()
    c = rng.centred_lanes(rng.stream_key(3, 9), 0, n).astype(np.float32)
    assert one.tobytes() == ((c * mul).astype(np.float32) + add).astype(np.float32).tobytes()
    assert quantize(many, GGMLType.F16).tobytes() == one.astype(np.float16).tobytes()


def test_a_failing_span_stops_the_rest_and_raises(monkeypatch):
    """over_spans raises the first failing span's error and starts no span queued behind it."""
    import threading
    import graphdiag.parallel as par
    monkeypatch.setattr(par, "threads", lambda: 2)
    ran, failed = [], threading.Event()

    def span(a, b):
        if a == 0:
            failed.set()
            raise ValueError("span 0")
        failed.wait(5)                        # the other worker is busy until span 0 has failed
        ran.append(a)
    with pytest.raises(ValueError, match="span 0"):
        par.over_spans(100, 1, span)
    assert len(ran) < 10                      # not the 99 queued behind it

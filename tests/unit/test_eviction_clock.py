"""The CUDA eviction clock leaves out graphdiag's own work: kernel loading (NVRTC compiles, module loads; a
first step that compiles for seconds must not age an entry past ggml's 10 s idle rule, llama.cpp is
precompiled) and its checks (--verify, --oracle: llama.cpp runs none)."""

from types import SimpleNamespace

from graphdiag.backends.gpu.entry import EVICT_AFTER_US, Clock, GraphCache
from graphdiag.runner import _wall_less_own_work


def _session(*loads_ns):
    drivers = [SimpleNamespace(kernel_load_ns=n) for n in loads_ns]
    return SimpleNamespace(driver=drivers[0], extra_drivers=drivers[1:], own_ns=0), drivers


def test_the_clock_is_the_wall_less_every_driver_s_kernel_loads():
    session, drivers = _session(0, 0)
    now = _wall_less_own_work(session)
    before = now()
    drivers[0].kernel_load_ns += 7_000_000_000
    drivers[1].kernel_load_ns += 5_000_000_000
    after = now()
    assert -12_100_000 < after - before < -11_900_000 + 100_000


def test_an_entry_stamped_before_a_long_compile_is_not_swept(monkeypatch):
    wall = [1_000_000_000_000]
    monkeypatch.setattr("graphdiag.runner.time.monotonic_ns", lambda: wall[0])
    session, (drv,) = _session(0)
    cache = GraphCache(Clock(_wall_less_own_work(session)))
    key = 0x1000
    cache.lookup(key)                                  # stamped (and the first lookup sweeps)
    compile_ns = 2 * EVICT_AFTER_US * 1000             # a step that spent 20 s compiling kernels
    wall[0] += compile_ns + 1_000_000
    drv.kernel_load_ns += compile_ns
    cache.lookup(key + 1)                              # a sweep is due (5 s passed on any clock)... or not
    assert key in cache.entries
    wall[0] += EVICT_AFTER_US * 1000                   # but 10 s of real idling still evicts
    cache.lookup(key + 2)
    assert key not in cache.entries


def test_the_checks_time_is_off_the_clock_too(monkeypatch):
    """An entry stamped before a step whose oracle took 12 s (a 1b forward in numpy on a loaded host) is not
    swept by the next lookup: llama.cpp, which checks nothing, would not have idled that long."""
    wall = [1_000_000_000_000]
    monkeypatch.setattr("graphdiag.runner.time.monotonic_ns", lambda: wall[0])
    session, _ = _session(0)
    cache = GraphCache(Clock(_wall_less_own_work(session)))
    cache.lookup(0x1000)
    wall[0] += 12_000_000_000
    session.own_ns += 12_000_000_000 - 1_000_000
    cache.lookup(0x2000)
    assert 0x1000 in cache.entries


def test_a_run_counts_its_checks_time(monkeypatch):
    """The runner adds the time of --verify and --oracle to Session.own_ns (the simulated driver's clock is
    modelled and ignores it; the count is the same code on CUDA)."""
    from graphdiag import runner
    from graphdiag.config import resolve
    seen = []
    real = runner.Session.close

    def close(self):
        seen.append(self.own_ns)
        return real(self)
    monkeypatch.setattr(runner.Session, "close", close)
    runner.run(resolve({"backend": "sim", "model": "tiny", "steps": 3, "prompt_tokens": 4, "oracle": True,
                        "nvtx": False}, environ={}))
    runner.run(resolve({"backend": "sim", "model": "tiny", "steps": 3, "prompt_tokens": 4, "nvtx": False},
                       environ={}))
    assert seen[0] > 0 and seen[1] < seen[0] / 10

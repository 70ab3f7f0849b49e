"""Host-quantised weights are quantised once per process (weights.HOST_QUANTISED): the same preset, weight
type and seed drawn again reuse the bytes; other seeds, types and presets do not; the cache keeps to its budget."""

import numpy as np
import pytest

from graphdiag.ir.dtypes import GGMLType
from graphdiag.model import weights as W
from graphdiag.model.presets import get_preset, weight_type
from graphdiag.model.weights import QuantisedCache, create_model


@pytest.fixture
def counted(monkeypatch):
    """A fresh process cache and a count of the quantiser's calls per type."""
    monkeypatch.setattr(W, "HOST_QUANTISED", QuantisedCache(8 << 30))
    calls: dict[GGMLType, int] = {}
    real = W.quantize

    def counting(x, t):
        if t not in W.DEVICE_FILL:           # F32 norms pass through quantize too (a cast): never kept
            calls[t] = calls.get(t, 0) + 1
        return real(x, t)
    monkeypatch.setattr(W, "quantize", counting)
    return calls


def _all_weights(wtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    m = create_model(get_preset("tiny"), weight_type(wtype), seed=seed)
    return {n: m.host[n] for n in m.host}


def _host_quantised(wtype: str) -> set[str]:
    """The weights of tiny/`wtype` with no device generator (K-quants and their fallbacks)."""
    m = create_model(get_preset("tiny"), weight_type(wtype), seed=0)
    return {t.name for t in m.tensors() if t.name in m.host and t.type not in W.DEVICE_FILL}


def test_a_second_model_of_the_same_preset_type_and_seed_is_not_quantised_again(counted):
    kept = _host_quantised("q4_k")
    first = _all_weights("q4_k")
    n = sum(counted.values())
    assert n == len(kept) and counted[GGMLType.Q4_K] > 0 and counted[GGMLType.Q5_0] > 0   # Q5_0: fallbacks
    second = _all_weights("q4_k")
    assert sum(counted.values()) == n                      # every host-quantised weight came from the cache
    assert W.HOST_QUANTISED.hits == n
    for name, a in first.items():
        assert np.array_equal(a, second[name])
        if name in kept:
            assert second[name] is a and not a.flags.writeable   # shared, so nobody may write into it
        else:
            assert second[name] is not a


def test_the_cached_bytes_are_the_bytes_a_fresh_draw_makes(counted):
    cached = _all_weights("q4_k")
    W.HOST_QUANTISED.clear()
    fresh = _all_weights("q4_k")
    for name, a in cached.items():
        assert fresh[name] is not a and np.array_equal(fresh[name], a)


def test_another_seed_or_type_is_quantised_anew(counted):
    _all_weights("q4_k", seed=0)
    n = sum(counted.values())
    _all_weights("q4_k", seed=1)
    assert sum(counted.values()) == 2 * n
    _all_weights("q5_k", seed=0)
    assert counted.get(GGMLType.Q5_K, 0) > 0


def test_device_filled_types_are_not_kept(counted):
    _all_weights("f16")
    _all_weights("q8_0")
    assert len(W.HOST_QUANTISED) == 0 and W.HOST_QUANTISED.nbytes == 0


def test_the_cache_keeps_to_its_budget_least_recently_used_out():
    c = QuantisedCache(budget=3000)
    a, b, d = (np.zeros(1000, np.uint8) for _ in range(3))
    c.put("a", a), c.put("b", b), c.put("d", d)
    assert c.get("a") is a                                 # a is now the most recently used
    c.put("e", np.zeros(1000, np.uint8))
    assert c.get("b") is None and c.get("a") is a and c.nbytes == 3000 and len(c) == 3
    c.put("big", np.zeros(4000, np.uint8))                 # larger than the whole budget: not kept
    assert c.get("big") is None and c.nbytes == 3000
    c.put("a", np.zeros(500, np.uint8))                    # replaced: its bytes counted once
    assert c.nbytes == 2500 and len(c) == 3


def test_the_budget_yields_to_the_hosts_available_memory(monkeypatch):
    monkeypatch.setattr(W, "available_host_bytes", lambda: 4000)     # a quarter of it: 1000 bytes
    c = QuantisedCache(budget=1 << 30)
    c.put("a", np.zeros(800, np.uint8))
    c.put("b", np.zeros(800, np.uint8))
    assert c.get("a") is None and c.get("b") is not None and c.nbytes == 800

"""The numpy oracle per architecture (model/reference.py + model/arch/*): Reference(model) is the arch's
forward; NEOX rope pairs element i with i + head_dim/2; qwen2 adds its Q/K/V biases; qwen3 RMS-norms each
head of Q and K; a tied output reads the embedding."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag.model.arch import qwen2, qwen3
from graphdiag.model.reference import Reference, _rope
from graphdiag.model.weights import create_model
from support.arch_gguf import MINI, MINI_QWEN3_WIDE, arch_config


def test_neox_rope_rotates_element_i_with_i_plus_half_the_head():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 8))
    pos = np.array([0, 1, 5])
    got = _rope(x, pos, 100.0, neox=True)
    th = pos[:, None] * 100.0 ** (-np.arange(0, 8, 2) / 8)              # (T, 4)
    c, s = np.cos(th)[:, None], np.sin(th)[:, None]
    want = np.concatenate([x[..., :4] * c - x[..., 4:] * s, x[..., :4] * s + x[..., 4:] * c], axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert not np.allclose(_rope(x, pos, 100.0), got)                    # NORM pairs adjacent elements


@pytest.mark.parametrize("arch,cls", [("qwen2", qwen2.Reference), ("qwen3", qwen3.Reference)])
def test_reference_of_a_model_is_its_architectures_oracle(arch, cls):
    assert type(Reference(create_model(arch_config(arch), seed=1))) is cls


def test_the_qwen2_oracle_adds_each_bias():
    m = create_model(arch_config("qwen2"), seed=1)
    ref = Reference(m)
    h = np.random.default_rng(1).normal(size=(2, MINI.n_embd))
    for name in ("attn_q", "attn_k", "attn_v"):
        plain = h @ ref.w(f"blk.0.{name}.weight").T
        np.testing.assert_allclose(ref._proj(h, "blk.0.", name) - plain,
                                   np.broadcast_to(ref.w(f"blk.0.{name}.bias"), plain.shape), atol=1e-12)


def test_the_qwen3_oracle_norms_each_head_before_rope():
    m = create_model(arch_config("qwen3", MINI_QWEN3_WIDE), seed=1)
    ref = Reference(m)
    ref._w["blk.0.attn_q_norm.weight"] = np.ones(64)
    ref._w["blk.0.attn_k_norm.weight"] = np.full(64, 2.0)
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(3, 4, 64)) * 5, rng.normal(size=(3, 2, 64)) * 0.1
    qn, kn = ref._qk(0, q, k, np.arange(3))
    # unit RMS per head (rope keeps each pair's length), times the weight
    np.testing.assert_allclose(np.linalg.norm(qn, axis=-1), np.sqrt(64), rtol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(kn, axis=-1), 2 * np.sqrt(64), rtol=1e-3)


def test_a_tied_oracle_projects_with_the_embedding():
    tied = Reference(create_model(arch_config("qwen2", tied=True), seed=4))
    logits = tied.prefill([5, 9, 11])
    assert logits.shape == (1, MINI.n_vocab) and "output.weight" not in tied._w
    # an untied model given the same weights and output.weight = the embedding computes the same logits
    untied = Reference(create_model(arch_config("qwen2"), seed=4))
    untied._w = {**tied._w, "output.weight": tied._w["token_embd.weight"]}
    np.testing.assert_array_equal(untied.prefill([5, 9, 11]), logits)


@pytest.mark.parametrize("q8_1", [False, True])
def test_a_weight_past_wide_max_is_kept_float32_and_gives_the_same_logits(monkeypatch, q8_1):
    """The oracle keeps a weight of more than WIDE_MAX elements as float32 (Gemma 3 270M's weights: 1.1 GB
    instead of 2.2 GB) and widens it a block of rows at a time: the same float64 products."""
    import graphdiag.model.reference_base as rb
    from graphdiag.ir.dtypes import GGMLType
    model = create_model(arch_config("qwen2", tied=True), GGMLType.Q8_0, seed=4)
    wide = Reference(model, q8_1_activations=q8_1)
    want = wide.prefill([5, 9, 11], all_logits=True)
    monkeypatch.setattr(rb, "WIDE_MAX", 1000)           # every matrix past it (norms and biases stay float64)
    monkeypatch.setattr(rb, "WIDE_BLOCK", 3 * MINI.n_embd + 7)   # blocks of 3 rows, the last one short
    narrow = Reference(model, q8_1_activations=q8_1)
    got = narrow.prefill([5, 9, 11], all_logits=True)
    assert narrow._w["token_embd.weight"].dtype == np.float32 and narrow._w["blk.0.attn_q.weight"].dtype == np.float32
    assert wide._w["token_embd.weight"].dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("q8_1", [False, True])
def test_a_quantised_weight_past_stored_max_stays_in_its_blocks_and_gives_the_same_logits(monkeypatch, q8_1):
    """A block-quantised weight of more than STORED_MAX elements is dequantised where it is read (the embedding's
    rows, each product's blocks of rows), never kept as float32 (Gemma 3 270M's tied embedding: 671 MB): the
    logits are the same to the bit."""
    import graphdiag.model.reference_base as rb
    from graphdiag.ir.dtypes import GGMLType
    model = create_model(arch_config("qwen2", tied=True), GGMLType.Q8_0, seed=4)
    monkeypatch.setattr(rb, "WIDE_MAX", 1000)
    monkeypatch.setattr(rb, "WIDE_BLOCK", 3 * MINI.n_embd + 7)
    kept = Reference(model, q8_1_activations=q8_1)
    want = kept.prefill([5, 9, 11], all_logits=True)
    monkeypatch.setattr(rb, "STORED_MAX", 1000)        # every block-quantised matrix past it
    stored = Reference(model, q8_1_activations=q8_1)
    got = stored.prefill([5, 9, 11], all_logits=True)
    assert isinstance(stored._w["token_embd.weight"], rb.StoredWeight)
    assert isinstance(stored._w["blk.0.attn_q.weight"], rb.StoredWeight)
    assert stored._w["token_embd.weight"].shape == kept._w["token_embd.weight"].shape
    assert stored._w["blk.0.attn_norm.weight"].dtype == np.float64             # F32 norms: kept as before
    np.testing.assert_array_equal(got, want)

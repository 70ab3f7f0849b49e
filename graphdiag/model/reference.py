"""The oracle of a model: its architecture's independent numpy forward, picked from the registry.

The forward itself and its pieces are model/reference_base.py's (the public interface the architectures'
oracles build on, as their graphs build on model/graph_context.py); this module sits above the registry
(model/arch/), so nothing under model/arch/ imports it. The pieces are named here too for the callers and
tests that read them from here.
"""

from __future__ import annotations

from .arch import get_arch
from .reference_base import (F64, ReferenceBase, SeqCache, _rms_norm, _rope, _SeqCache, _softmax,  # noqa: F401
                             geglu, gelu_tanh, greedy, rms_norm, rope, rope_neox, rope_pairs, silu, softmax)
from .weights import Model


def Reference(model: Model, *args, **kwargs) -> ReferenceBase:  # noqa: N802 (named as the class it makes)
    """The oracle of the model's architecture (its arch module's Reference: a ReferenceBase subclass), made
    with ReferenceBase's arguments (q8_1_activations, jitter, weights_of)."""
    return get_arch(model.cfg.arch).Reference(model, *args, **kwargs)

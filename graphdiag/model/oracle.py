"""The numpy oracle of a model: the architecture's independent forward (model/reference.py for llama)."""

from __future__ import annotations

from .arch.gemma3_reference import Gemma3Reference
from .reference import Reference


def make_reference(model, q8_1_activations: bool = False) -> Reference:
    """The oracle for `model`'s architecture; q8_1_activations as Reference's."""
    cls = Gemma3Reference if getattr(model.cfg, "arch", "llama") == "gemma3" else Reference
    return cls(model, q8_1_activations=q8_1_activations)

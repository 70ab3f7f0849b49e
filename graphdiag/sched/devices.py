"""Which device holds each layer in a layer split (llama.cpp --split-mode layer, --tensor-split). Pure.

llama_model::load_tensors: the shares (--tensor-split, else each device's free memory) are summed into
cumulative split points and normalised to 1, in float32. Every layer is offloaded (n_gpu_layers defaults to
all), so there are n_layer + 1 offloadable layers: the repeating layers, then the output layer
(output_norm, output). Layer il goes to the first device whose split point is above il / (n_layer + 1)
(std::upper_bound). Each layer's KV cache lives with the layer. The input layer (the token embeddings) stays
on the CPU upstream ("very little benefit to offloading"); graphdiag, on one device or several, keeps it on
device 0 with the embedding lookup (as its one-device runs always have).

The scheduler also follows llama_context's graph callback (graph_get_cb, full offload): a layer's `norm`
nodes (the rms_norm of its attention and FFN norms) are pinned to the layer's device, so the cut falls before
the layer's first norm and one tensor (the previous layer's output) crosses, rather than the norm landing
on the previous layer's device.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.|^cache_[kv]_l(\d+)$")
_OUTPUT_TENSORS = ("output_norm.weight", "output.weight")
_LAYER_NORM = "norm"          # the rms_norm of a layer's norms, "norm-{il}" (model/graph_context.py), as upstream's cb name


def split_points(shares: Sequence[float]) -> tuple[float, ...]:
    """Cumulative shares normalised to 1, in float32 as llama.cpp computes them."""
    acc = np.cumsum(np.asarray(shares, np.float32), dtype=np.float32)
    return tuple(float(x) for x in (acc / acc[-1]).astype(np.float32))


def layer_devices(n_layer: int, points: Sequence[float]) -> tuple[int, ...]:
    """Device of each layer 0..n_layer-1, then of the output layer (index n_layer)."""
    pts = np.asarray(points, np.float32)
    n_off = n_layer + 1
    return tuple(min(int(np.searchsorted(pts, np.float32(il) / np.float32(n_off), side="right")), len(pts) - 1)
                 for il in range(n_off))


@dataclass(frozen=True)
class LayerSplit:
    """A model's layers over `n_devices` devices: `layers[il]` (il = n_layer: the output layer)."""

    n_devices: int
    layers: tuple[int, ...]
    points: tuple[float, ...]
    shares_from: str = "--tensor-split"      # or "free memory" (llama.cpp's default)

    @classmethod
    def of(cls, n_layer: int, shares: Sequence[float], shares_from: str = "--tensor-split") -> "LayerSplit":
        pts = split_points(shares)
        return cls(len(shares), layer_devices(n_layer, pts), pts, shares_from)

    @classmethod
    def chosen(cls, n_layer: int, tensor_split: Sequence[float] | None, free_memory) -> "LayerSplit":
        """llama_model::load_tensors' choice: the --tensor-split shares, unless none was given or every
        share is 0 (then each device's free bytes, `free_memory()`, called only then)."""
        if tensor_split is None or all(np.float32(x) == 0 for x in tensor_split):
            return cls.of(n_layer, free_memory(), "free memory")
        return cls.of(n_layer, tensor_split)

    def tensor_device(self, name: str) -> int:
        """The device a persistent tensor lives on (weights, KV caches)."""
        m = _LAYER_TENSOR.match(name)
        if m:
            return self.layers[int(m.group(1) or m.group(2))]
        if name in _OUTPUT_TENSORS:
            return self.layers[-1]
        return 0                                # token_embd: the input layer (see the module docstring)

    def node_device(self, name: str) -> int | None:
        """The device a graph node is pinned to by name (a layer's opening norm), None for the others."""
        base, _, il = name.rpartition("-")
        if base == _LAYER_NORM and il.isdigit() and int(il) < len(self.layers) - 1:
            return self.layers[int(il)]
        return None

    def layer_counts(self) -> tuple[int, ...]:
        """Repeating layers per device (the output layer not counted)."""
        return tuple(sum(1 for d in self.layers[:-1] if d == k) for k in range(self.n_devices))

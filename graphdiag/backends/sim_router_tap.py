"""The run's expert choices, read off the simulated driver as its router kernels compute them (--oracle).

A SimDriver's kernel_observer sees every computed kernel. Two of them hold a MoE layer's choice: the fused
topk_moe_f32 (its ids, t[1]: (…, T, k)) and the unfused ARGSORT `ffn_moe_argsort-<il>` (t[0]: (…, T,
n_expert), of which build_moe_ffn's VIEW `ffn_moe_topk-<il>` keeps the first k). Both carry the layer in
their label (`ffn_moe_argsort-<il>` is in the fused kernel's label too). The tap keeps, per layer, the id
rows of the current step in launch order; the oracle takes them after the step (RouterTap.take).
"""

from __future__ import annotations

import re

import numpy as np

from .sim_view import view

_LAYER = re.compile(r"ffn_moe_argsort-(\d+)")
_IDS_SLOT = {"topk_moe_f32": 1, "argsort_f32_i32_desc": 0}


class RouterTap:
    """A kernel observer collecting each MoE layer's chosen expert ids (T, k) int arrays, by layer."""

    def __init__(self, n_expert_used: int):
        self.k = n_expert_used
        self._rows: dict[int, list[np.ndarray]] = {}

    def __call__(self, kernel: str, label: str, space, params: np.ndarray) -> None:
        slot = _IDS_SLOT.get(kernel)
        m = _LAYER.search(label) if slot is not None else None
        if m is None:
            return
        ids = np.asarray(view(space, params, slot))
        ids = ids.reshape(-1, ids.shape[-1])[:, : self.k].astype(np.int64)
        self._rows.setdefault(int(m.group(1)), []).append(ids)

    def clear(self) -> None:
        self._rows = {}

    def take(self, n_tokens: int, out_rows: tuple[int, ...] = ()) -> dict[int, np.ndarray]:
        """The choices of the step's n_tokens token rows, by layer, and a fresh record for the next step. A
        layer whose rows are the step's output rows only (`out_rows`: a prefill's last layer, which the run
        computes for the rows with logits) gets -1 in every other row (no choice read there). A layer is left
        out where its rows make neither once (--verify's recompute launches the same kernels again: an
        identical second record is the same choice; anything else is ambiguous)."""
        rows, self._rows = self._rows, {}
        out = {}
        for il, parts in rows.items():
            n = sum(len(p) for p in parts)
            if n == n_tokens:
                out[il] = np.concatenate(parts)
            elif all(len(p) == n_tokens and np.array_equal(p, parts[0]) for p in parts):
                out[il] = parts[0]
            elif out_rows and n == len(out_rows) and len(out_rows) < n_tokens:
                full = np.full((n_tokens, self.k), -1, dtype=np.int64)
                full[list(out_rows)] = np.concatenate(parts)
                out[il] = full
        return out

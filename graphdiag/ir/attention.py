"""Flash attention's operands in the layout graphdiag's attention kernels read.

llama.cpp 0c1e57098's build_attn_mha hands FLASH_ATTN_EXT permuted views (ggml_permute(x, 0, 2, 1, 3)):
q (D, T, H), k/v (D, n_kv, H_kv). graphdiag's llama graph hands it the unpermuted ones: q (D, H, T), k/v
(D, H_kv, n_kv). A (0, 2, 1, 3) permute is a view of its source's bytes with dims 1 and 2 swapped, so the
source is exactly the operand in the kernels' layout: the backends read through it (the Gemma 3 graph keeps
upstream's permutes, so its node count and op census are llama.cpp's).
"""

from __future__ import annotations

from .ops import Op
from .tensor import Tensor

_SWAP_1_2 = (0, 2, 1, 3)


def unpermuted(t: Tensor) -> Tensor:
    """`t` itself, or the source of a (0, 2, 1, 3) permute; ValueError for another permute."""
    if t.op != Op.PERMUTE:
        return t
    axes = tuple(t.param_i32(i) for i in range(4))
    if axes != _SWAP_1_2:
        raise ValueError(f"flash attention operand {t.name!r}: permute {axes}, only {_SWAP_1_2} is read through")
    return t.src[0]


def fa_operands(node: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(q, k, v, mask) of a FLASH_ATTN_EXT node, q as (D, H, T), k/v as (D, H_kv, n_kv)."""
    q, k, v, mask = node.src[:4]
    return unpermuted(q), unpermuted(k), unpermuted(v), mask

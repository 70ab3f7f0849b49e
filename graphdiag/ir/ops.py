"""Operations the reference model uses, named as in ggml (values are graphdiag's own)."""

from __future__ import annotations

import enum


class Op(enum.IntEnum):
    NONE = 0
    ADD = 2
    ADD_ID = 3       # a + b's row ids[i, t] for each (i, t) (ggml_add_id: gpt-oss's expert biases)
    MUL = 6
    DIV = 7
    SUM_ROWS = 14
    RMS_NORM = 24
    MUL_MAT = 29
    MUL_MAT_ID = 30
    SCALE = 32
    CPY = 34
    CONT = 35
    RESHAPE = 36
    VIEW = 37
    PERMUTE = 38
    TRANSPOSE = 39
    GET_ROWS = 40
    SET_ROWS = 42
    SOFT_MAX = 45
    ROPE = 47
    CLAMP = 49
    ARGSORT = 60
    TOP_K = 61
    FLASH_ATTN_EXT = 64
    GLU = 80


class GluOp(enum.IntEnum):
    """enum ggml_glu_op, ggml's values (GEGLU_ERF 4 and GEGLU_QUICK 5 are never built here)."""
    REGLU = 0
    GEGLU = 1
    SWIGLU = 2
    SWIGLU_OAI = 3       # gpt-oss: x = min(gate, limit), y = clamp(up, ±limit), x * sigmoid(alpha x) * (y + 1),
                         # alpha and limit f32 in op params 2 and 3 (ggml_swiglu_oai)
    SWIGLU_CLAMP = 6     # llama.cpp 0c1e57098 (not in ggml d99724f2): silu(min(gate, limit)) * clamp(up, ±limit),
                         # the limit an f32 in op param 3


class TensorFlag(enum.IntFlag):
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


_VIEW_OPS = frozenset({Op.NONE, Op.RESHAPE, Op.TRANSPOSE, Op.VIEW, Op.PERMUTE})
VIEW_OPS = sorted(int(op) for op in _VIEW_OPS)     # the same, as ints (for vectorised tests)


def is_view_op(op: int) -> bool:
    return op in _VIEW_OPS


def is_view_or_noop(op: int, ne) -> bool:
    """ggml_cuda_is_view_or_noop: an empty tensor or a pure view/no-op."""
    return op in _VIEW_OPS or any(int(n) == 0 for n in ne)

"""A light handle on one tensor struct in the arena (the `ggml_tensor *`)."""

from __future__ import annotations

import numpy as np

from .arena import TENSOR_SIZE, Arena
from .dtypes import GGMLType, block_size, type_size
from .ops import Op


class _Members(dict):
    """Value -> member of an enum by a dict lookup (an Enum call costs ~1 us); a value that is no member
    raises the enum's own ValueError."""

    def __init__(self, enum):
        super().__init__({m.value: m for m in enum})
        self.enum = enum

    def __missing__(self, value):
        return self.enum(value)


_TYPES, _OPS = _Members(GGMLType), _Members(Op)


class Tensor:
    __slots__ = ("arena", "idx")

    def __init__(self, arena: Arena, idx: int):
        self.arena = arena
        self.idx = idx

    def __eq__(self, other) -> bool:
        return isinstance(other, Tensor) and other.idx == self.idx and other.arena is self.arena

    def __hash__(self) -> int:
        return self.idx

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.op.name}, {GGMLType(self.type).name}, ne={self.ne})"

    @property
    def r(self):
        return self.arena.rec[self.idx]

    @property
    def addr(self) -> int:
        return self.arena.base + self.idx * TENSOR_SIZE

    # -- fields -------------------------------------------------------------------------------------------
    @property
    def type(self) -> GGMLType:
        return _TYPES[int(self.arena.rec["type"][self.idx])]

    @property
    def ne(self) -> tuple[int, int, int, int]:
        return tuple(self.arena.rec["ne"][self.idx].tolist())   # tolist: Python ints in one C call

    @property
    def nb(self) -> tuple[int, int, int, int]:
        return tuple(self.arena.rec["nb"][self.idx].tolist())

    @property
    def op(self) -> Op:
        return _OPS[int(self.arena.rec["op"][self.idx])]

    @property
    def op_params(self) -> np.ndarray:
        """The 16 int32 op_params (a live view)."""
        return self.arena.rec["op_params"][self.idx]

    def param_i32(self, i: int) -> int:
        return int(self.arena.rec["op_params"][self.idx][i])

    def param_f32(self, i: int) -> float:
        return float(self.arena.rec["op_params"][self.idx][i : i + 1].view(np.float32)[0])

    def set_param_i32(self, i: int, v: int) -> None:
        self.arena.rec["op_params"][self.idx][i] = v

    def set_param_f32(self, i: int, v: float) -> None:
        self.arena.rec["op_params"][self.idx][i] = np.array([v], np.float32).view(np.int32)[0]

    @property
    def flags(self) -> int:
        return int(self.arena.rec["flags"][self.idx])

    @flags.setter
    def flags(self, v: int) -> None:
        self.arena.rec["flags"][self.idx] = v

    @property
    def src(self) -> list["Tensor | None"]:
        arena = self.arena
        base = arena.base
        return [Tensor(arena, (a - base) // TENSOR_SIZE) if a else None
                for a in arena.rec["src"][self.idx].tolist()]   # tolist: Python ints in one C call

    def set_src(self, j: int, t: "Tensor | None") -> None:
        self.arena.rec["src"][self.idx][j] = 0 if t is None else t.addr

    @property
    def view_src(self) -> "Tensor | None":
        a = int(self.arena.rec["view_src"][self.idx])
        return None if a == 0 else Tensor(self.arena, self.arena.index(a))

    @property
    def view_offs(self) -> int:
        return int(self.arena.rec["view_offs"][self.idx])

    @property
    def data(self) -> int:
        return int(self.arena.rec["data"][self.idx])

    @data.setter
    def data(self, v: int) -> None:
        self.arena.rec["data"][self.idx] = v

    @property
    def buffer(self) -> int:
        return int(self.arena.rec["buffer"][self.idx])

    @buffer.setter
    def buffer(self, v: int) -> None:
        self.arena.rec["buffer"][self.idx] = v

    @property
    def name(self) -> str:
        return self.arena.rec["name"][self.idx].decode()

    @name.setter
    def name(self, v: str) -> None:
        b = v.encode()[:63]
        self.arena.rec["name"][self.idx] = b

    # -- derived ------------------------------------------------------------------------------------------
    def nelements(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    def nbytes(self) -> int:
        """Bytes spanned, as ggml_nbytes."""
        rec, i = self.arena.rec, self.idx
        ne, nb = rec["ne"][i].tolist(), rec["nb"][i].tolist()
        if 0 in ne:
            return 0
        t = self.type
        bs = block_size(t)
        rest = (ne[1] - 1) * nb[1] + (ne[2] - 1) * nb[2] + (ne[3] - 1) * nb[3]
        if bs == 1:
            return type_size(t) + (ne[0] - 1) * nb[0] + rest
        return ne[0] * nb[0] // bs + rest

    def is_contiguous(self) -> bool:
        ne, nb = self.ne, self.nb
        if nb[0] != type_size(self.type):
            return False
        expect = nb[0] * ne[0] // block_size(self.type)
        for i in range(1, 4):
            if ne[i] != 1 and nb[i] != expect:
                return False
            expect *= ne[i]
        return True

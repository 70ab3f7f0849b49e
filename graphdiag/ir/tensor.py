"""A light handle on one tensor struct in the arena (the `ggml_tensor *`)."""

from __future__ import annotations

import struct

import numpy as np

from .arena import TENSOR_DTYPE, TENSOR_SIZE, Arena
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

# Field reads straight from the arena's bytes (Arena.mem, struct i at i * TENSOR_SIZE): one unpack_from each,
# where a numpy field view, an index and a conversion cost a few hundred ns apiece.
_OFF = {f: TENSOR_DTYPE.fields[f][1] for f in ("type", "ne", "nb", "op", "op_params", "flags", "src",
                                                  "view_src", "view_offs", "data", "buffer")}
_I32, _U64, _F32 = struct.Struct("<i"), struct.Struct("<Q"), struct.Struct("<f")
_NE, _NB, _SRC = struct.Struct("<4q"), struct.Struct("<4Q"), struct.Struct("<10Q")
_O_TYPE, _O_NE, _O_NB, _O_OP, _O_PARAMS, _O_FLAGS, _O_SRC, _O_VIEW_SRC, _O_VIEW_OFFS, _O_DATA, _O_BUFFER = (
    _OFF.values())


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
        return _TYPES[_I32.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_TYPE)[0]]

    @property
    def ne(self) -> tuple[int, int, int, int]:
        return _NE.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_NE)

    @property
    def nb(self) -> tuple[int, int, int, int]:
        return _NB.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_NB)

    @property
    def op(self) -> Op:
        return _OPS[_I32.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_OP)[0]]

    @property
    def op_params(self) -> np.ndarray:
        """The 16 int32 op_params (a live view)."""
        return self.arena.rec["op_params"][self.idx]

    def param_i32(self, i: int) -> int:
        return _I32.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_PARAMS + 4 * i)[0]

    def param_f32(self, i: int) -> float:
        return _F32.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_PARAMS + 4 * i)[0]

    def set_param_i32(self, i: int, v: int) -> None:
        _I32.pack_into(self.arena.mem, self.idx * TENSOR_SIZE + _O_PARAMS + 4 * i, v)

    def set_param_f32(self, i: int, v: float) -> None:
        _F32.pack_into(self.arena.mem, self.idx * TENSOR_SIZE + _O_PARAMS + 4 * i, v)

    @property
    def flags(self) -> int:
        return _I32.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_FLAGS)[0]

    @flags.setter
    def flags(self, v: int) -> None:
        _I32.pack_into(self.arena.mem, self.idx * TENSOR_SIZE + _O_FLAGS, v)

    @property
    def src(self) -> list["Tensor | None"]:
        arena = self.arena
        base = arena.base
        return [Tensor(arena, (a - base) // TENSOR_SIZE) if a else None
                for a in _SRC.unpack_from(arena.mem, self.idx * TENSOR_SIZE + _O_SRC)]

    def set_src(self, j: int, t: "Tensor | None") -> None:
        self.arena.rec["src"][self.idx][j] = 0 if t is None else t.addr

    @property
    def view_src(self) -> "Tensor | None":
        a = _U64.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_VIEW_SRC)[0]
        return None if a == 0 else Tensor(self.arena, (a - self.arena.base) // TENSOR_SIZE)

    @property
    def view_offs(self) -> int:
        return _U64.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_VIEW_OFFS)[0]

    @property
    def data(self) -> int:
        return _U64.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_DATA)[0]

    @data.setter
    def data(self, v: int) -> None:
        self.arena.rec["data"][self.idx] = v

    @property
    def buffer(self) -> int:
        return _U64.unpack_from(self.arena.mem, self.idx * TENSOR_SIZE + _O_BUFFER)[0]

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
        mem, at = self.arena.mem, self.idx * TENSOR_SIZE
        ne, nb = _NE.unpack_from(mem, at + _O_NE), _NB.unpack_from(mem, at + _O_NB)
        if 0 in ne:
            return 0
        t = self.type
        bs = block_size(t)
        rest = (ne[1] - 1) * nb[1] + (ne[2] - 1) * nb[2] + (ne[3] - 1) * nb[3]
        if bs == 1:
            return type_size(t) + (ne[0] - 1) * nb[0] + rest
        return ne[0] * nb[0] // bs + rest

    def is_contiguous(self) -> bool:
        """ggml_is_contiguous (_0): a row of one block has no element stride to test; each higher dim of
        more than one element must follow on the previous."""
        ne, nb = self.ne, self.nb
        bs = block_size(self.type)
        if ne[0] != bs and nb[0] != type_size(self.type):
            return False
        expect = type_size(self.type) * ne[0] // bs
        for i in range(1, 4):
            if ne[i] != 1 and nb[i] != expect:
                return False
            expect *= ne[i]
        return True

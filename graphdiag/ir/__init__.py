"""Graph IR mirroring ggml: tensor structs in a metadata arena, graphs and graph views."""

from .dtypes import GGMLType, type_size, block_size, row_size, is_quantized
from .ops import Op, GluOp, is_view_or_noop, TensorFlag
from .arena import Arena, TENSOR_DTYPE, TENSOR_SIZE
from .tensor import Tensor
from .graph import Graph, graph_view, next_uid

__all__ = [
    "GGMLType", "type_size", "block_size", "row_size", "is_quantized", "Op", "GluOp", "is_view_or_noop",
    "TensorFlag", "Arena", "TENSOR_DTYPE", "TENSOR_SIZE", "Tensor", "Graph", "graph_view", "next_uid",
]

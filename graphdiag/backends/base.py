"""The backend interface the scheduler drives (ggml_backend): buffers, tensor I/O and graph_compute."""

from __future__ import annotations

import abc

import numpy as np

from ..ir.graph import Graph


class InputStage:
    """Where a built graph's input tensors are written on the host each step, and how they reach the device
    (llm_graph_result::set_inputs). Made once per graph from the inputs' (addr, nbytes) layout: call
    `writable()`, write input i's bytes into `views[i]` (uint8, in place), then `send()`. This form keeps
    plain arrays and writes each input with tensor_set."""

    def __init__(self, backend: "Backend", layout: tuple[tuple[int, int], ...]):
        self.backend, self.layout = backend, layout
        self.views = [np.zeros(n, np.uint8) for _, n in layout]

    def writable(self) -> list[np.ndarray]:
        """The views, free to be overwritten (what was sent from them has reached the device)."""
        return self.views

    def send(self) -> None:
        for (addr, _), v in zip(self.layout, self.views):
            self.backend.tensor_set(addr, v)


class Backend(abc.ABC):
    """One compute backend. `name` is what the scheduler and reports show ("CPU", "CUDA0", "SIM0")."""

    name: str = "?"
    is_gpu: bool = False
    # the buffer type's get_alignment: where the graph allocator's blocks start and how its sizes round
    # (ggml's TENSOR_ALIGNMENT, 32, for the CPU buffer type; 128 for CUDA's)
    alignment: int = 32

    @abc.abstractmethod
    def buffer_alloc(self, nbytes: int) -> int:
        """A buffer of this backend's memory; returns its address."""

    @abc.abstractmethod
    def buffer_free(self, addr: int) -> None: ...

    @abc.abstractmethod
    def tensor_set(self, addr: int, data: np.ndarray) -> None:
        """Write the bytes of `data` at `addr` (synchronous)."""

    def input_stage(self, layout: tuple[tuple[int, int], ...], slot: int = 0, grow: int = 0) -> InputStage:
        """The host side of a graph's inputs at these (addr, nbytes) (backends may batch the copies). The
        context keeps two stages per graph (slots 0 and 1) and alternates: one can be written for the next
        step while the other's copies may still be in flight. `grow`: how many bytes more a later graph of
        the same batch may need (its mask at the most cells), for backends that reserve host memory."""
        return InputStage(self, layout)

    @abc.abstractmethod
    def tensor_get(self, addr: int, nbytes: int) -> np.ndarray:
        """A uint8 copy of [addr, addr + nbytes) (synchronous)."""

    def tensor_read(self, addr: int, nbytes: int) -> np.ndarray:
        """[addr, addr + nbytes) as read-only uint8 bytes that stay valid until this backend's next read
        (synchronous). Backends that read through a buffer of their own hand out that buffer, with no copy;
        this default is a copy (tensor_get)."""
        return self.tensor_get(addr, nbytes)

    @abc.abstractmethod
    def graph_compute(self, graph: Graph, split: int) -> None:
        """Compute every node of `graph` (a split: nodes without the COMPUTE flag are skipped)."""

    def graph_optimize(self, graph: Graph, split: int, alloc_deps: dict[int, list[int]] | None = None,
                       reserve: bool = False) -> None:
        """Called once per split each time the scheduler splits the graph (ggml_backend_graph_optimize).
        `alloc_deps` (0c1e57098's add_alloc_dep, #27301): the backend may add tensors (arena slots) the
        allocator must keep alive until a node (its slot: the key) has run. The GPU backend may also reorder
        `graph.nodes` (the concurrent regions' branch interleave), which the allocator then walks. `reserve`:
        a graph the context only reserves (Scheduler.reserve), never computed."""

    def synchronize(self) -> None:
        """Wait for queued work."""

    def close(self) -> None:
        """Release buffers and handles."""

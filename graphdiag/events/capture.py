"""Capture and replay: fusion, concurrent regions, chunk boundaries, each chunk's capture, instantiate,
update or refusal, eager runs, replays and pool invalidation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Event


@dataclass(frozen=True)
class FusionApplied(Event):
    kind: ClassVar[str] = "fusion"
    node: int = -1
    pattern: str = ""              # "rms_norm+mul", "mul_mat_vec+glu", "rope+view+set_rows"
    absorbed: int = 0              # following nodes skipped


@dataclass(frozen=True)
class ConcurrentRegion(Event):
    kind: ClassVar[str] = "concurrent_region"
    fork_node: int = -1
    join_node: int = -1
    fork_name: str = ""
    n_branches: int = 0
    branch_sizes: tuple = ()


@dataclass(frozen=True)
class ConcurrentRefused(Event):
    """graph_optimize formed no region here, or graph_compute dropped the regions it had formed."""
    kind: ClassVar[str] = "concurrent_refused"
    fork_node: int = -1            # -1: the whole split (graph_optimize looked for no region)
    join_node: int = -1            # -1: none found, or the whole split
    fork_name: str = ""
    reason: str = ""
    cleared: int = 0               # regions dropped with it (one invalid region at graph_compute drops all)


@dataclass(frozen=True)
class ConcurrentRace(Event):
    """A region the validity check let through whose streams touch the same bytes with no event between
    them (concurrency.races): its branches run at once, as in llama.cpp, and may compute wrongly."""
    kind: ClassVar[str] = "concurrent_race"
    fork_node: int = -1
    join_node: int = -1
    fork_name: str = ""
    writer: str = ""               # the first pair: a branch output ...
    writer_stream: int = 0
    other: str = ""                # ... and what another stream writes or reads in the same bytes
    other_stream: int = 0
    n_pairs: int = 0               # pairs of tensors in the region that share bytes across streams


@dataclass(frozen=True)
class ChunkBoundary(Event):
    kind: ClassVar[str] = "chunk_boundary"
    chunk: int = 0
    start_node: int = 0            # first node of the chunk
    end_node: int = 0              # one past the last node
    moved_by: str = ""             # "" | "concurrent region" | "fusion" (boundary later than chunk_end)


@dataclass(frozen=True)
class ChunkCaptured(Event):
    kind: ClassVar[str] = "chunk_captured"
    chunk: int = 0
    n_graph_nodes: int = 0         # CUDA graph nodes captured
    capture_ns: int = 0
    cublas_extra: int = 0          # kernel nodes upstream's capture holds beyond these: the conversions its
    #   cuBLAS path launches around each BF16 / quantized mat-mul's GEMM that graphdiag's kernels do without
    #   (gpu/compat.cublas_launches; 0 for F16, whose conversions graphdiag launches as upstream does)


@dataclass(frozen=True)
class ChunkInstantiated(Event):
    kind: ClassVar[str] = "chunk_instantiated"
    chunk: int = 0
    duration_ns: int = 0
    after_refusal: bool = False
    mem_bytes: int = 0             # device memory the executable took: free memory before - after (cuMemGetInfo;


@dataclass(frozen=True)
class ChunkUpdated(Event):
    kind: ClassVar[str] = "chunk_updated"
    chunk: int = 0
    duration_ns: int = 0


@dataclass(frozen=True)
class UpdateRefused(Event):
    kind: ClassVar[str] = "update_refused"
    chunk: int = 0
    reason: str = ""               # UpdateResult name, e.g. "TOPOLOGY_CHANGED"
    error_node: str = ""
    duration_ns: int = 0


@dataclass(frozen=True)
class CaptureAbandoned(Event):
    """A capture ended and dropped before it completed (the pool invalidated every graph meanwhile);
    the split finished eagerly from node `node`'s chunk."""
    kind: ClassVar[str] = "capture_abandoned"
    chunk: int = 0
    node: int = 0
    reason: str = ""


@dataclass(frozen=True)
class ChunksDestroyed(Event):
    kind: ClassVar[str] = "chunks_destroyed"
    first: int = 0
    count: int = 0


@dataclass(frozen=True)
class EagerRun(Event):
    kind: ClassVar[str] = "eager_run"
    n_launches: int = 0
    duration_ns: int = 0


@dataclass(frozen=True)
class CaptureRun(Event):
    kind: ClassVar[str] = "capture_run"
    n_chunks: int = 0
    n_launches: int = 0
    duration_ns: int = 0


@dataclass(frozen=True)
class ReplayLaunched(Event):
    kind: ClassVar[str] = "replay"
    n_chunks: int = 0
    duration_ns: int = 0


@dataclass(frozen=True)
class PoolInvalidated(Event):
    kind: ClassVar[str] = "pool_invalidated"
    reason: str = ""               # "alloc failure" | "free into full pool"
    n_graphs: int = 0              # entries cleared
    n_captured: int = 0            # executables destroyed
    nbytes: int = 0

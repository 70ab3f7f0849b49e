"""Programmatic dependent launch and cuBLAS's split-K decide updates as in llama.cpp (simulated driver).

Recorded on the H100 (2026-12-06, tools/captured_kernels.py, llama.cpp 0c1e57098): with fusion off, 1 -> 2
sequences on F16 weights keeps the kernel count but llama.cpp's mat-vecs (PDL) become mul_mat_f (plain) and
its update is refused; on Q8_0 both run mul_mat_vec_q and it updates. On moe-tiny the F32 router moves from
MMVF to cuBLAS at 4 columns, which ran a split-K GEMM and its reduce: 84 -> 88 kernels (graphdiag +1), refused.
"""

from types import SimpleNamespace

import pytest

from graphdiag import events as E
from support.simrun import of, run_sim

pytestmark = pytest.mark.filterwarnings("ignore")


def _refusals(r):
    return [e for e in of(r, E.UpdateRefused)]


@pytest.mark.parametrize("wtype, refused", [("f16", True), ("q8_0", False)])
def test_one_to_two_sequences_with_fusion_off(wtype, refused):
    r = run_sim(model="tiny", wtype=wtype, prompt_tokens=1, steps=14, batch=1, chunk_size=0,
                timeline=[{"at_step": 7, "batch": 2}], env={"GGML_CUDA_DISABLE_FUSION": "1"})
    got = _refusals(r)
    assert bool(got) == refused, got
    assert of(r, E.ChunkUpdated) or refused
    if refused:
        assert got[0].step == 8 and got[0].reason == "TOPOLOGY_CHANGED"
        # the CUDA driver named "node 85 of 86" here (H100, graphdiag on CUDA): the output mat-mul, the last
        # node, met first walking back from the exit node (sim_update.py); a walk in capture order says node 3.
        # At 2 tokens it is upstream's MMF, graphdiag's tile kernel (a mat-vec before 2026-12-07)
        assert got[0].error_node == ("node 85 of 86: kernel mul_mat_f16; its edge from node 84 became "
                                     "ordinary (PDL launch changed)")


def test_pdl_off_keeps_every_edge_ordinary():
    r = run_sim(model="tiny", wtype="f16", prompt_tokens=1, steps=14, batch=1, chunk_size=0,
                timeline=[{"at_step": 7, "batch": 2}],
                env={"GGML_CUDA_DISABLE_FUSION": "1", "GGML_CUDA_PDL": "0"})
    assert not _refusals(r)


def test_moe_router_moves_to_cublas_split_k_at_four_columns():
    r = run_sim(model="moe-tiny", prompt_tokens=1, steps=30, batch=1, chunk_size=0,
                timeline=[{"at_step": 6, "batch": 2}, {"at_step": 12, "batch": 3}, {"at_step": 18, "batch": 4},
                          {"at_step": 24, "batch": 5}])
    nodes = [e.n_graph_nodes for e in of(r, E.ChunkCaptured)]
    assert nodes == [74, 85, 85, 89, 89]          # llama.cpp: 73, 84, 84, 88, 88 (its embedding is on the CPU)
    assert [e.step for e in _refusals(r)] == [7, 19]

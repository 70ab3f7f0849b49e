"""llama.cpp's log lines in a trace, placed in time: common_log prints from a worker thread, so graphdiag reads a
compute's "CUDA Graph id N reused" after that compute's graph launch; its own stamp puts it back before
(trace/convert.log_places). The traced context's n_ctx for a replay (logged, -c, or the file's n_ctx_train).
The kernels upstream's cuBLAS path adds around a GEMM (gpu/compat.cublas_launches), which a replay of
llama-server's recorded prefill excuses by that count exactly (known.py cublas-conversions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.backends.gpu.compat import GGML_PREC_F32, cublas_launches
from graphdiag.ir.arena import Arena
from graphdiag.ir.build import Ctx
from graphdiag.ir.dtypes import GGMLType
from graphdiag.ir.graph import Graph
from graphdiag.ir.ops import Op
from graphdiag.trace.convert import LOG_LATE_NS, convert, log_places
from graphdiag.trace.replay_plan import server_settings

DATA = Path(__file__).resolve().parents[1] / "data" / "trace"
US = 1000


def _api(fn, t0, **kw):
    return {"ev": "api", "fn": fn, "pid": 1, "tid": 1, "device": 0, "stream": 7, "t0_ns": t0, "t1_ns": t0 + 2 * US,
            "ret": 0, **kw}


def _batch(t0):
    return {"ev": "batch", "pid": 1, "tid": 1, "ctx": 9, "n_tokens": 1, "tokens": [1], "pos": [0], "seq": [[0]],
            "out": [1], "t0_ns": t0, "t1_ns": t0 + 300 * US, "ret": 0}


def _log(stamp_us, read_ns, text):
    mi, rest = divmod(stamp_us, 60_000_000)
    se, rest = divmod(rest, 1_000_000)
    ms, us = divmod(rest, 1000)
    return {"ev": "log", "t_ns": read_ns, "text": f"{mi}.{se:02d}.{ms:03d}.{us:03d} D {text}"}


def _replays(late_us: int, stamped: bool = True) -> list[dict]:
    """Three decodes replaying executable 2, each compute's "reused" line stamped 10 us before its launch and
    read `late_us` after it (the first 15 us after: 25 us from its stamp, the run's fastest, so each line's
    place from its stamp still falls 15 us after its launch)."""
    lines, t = [], 1_000_000 * US
    for k in range(3):
        b, launch = t + k * 1000 * US, t + k * 1000 * US + 200 * US
        lines.append(_batch(b))
        read = launch + (15 * US if k == 0 else late_us * US)
        stamp = (launch - 10 * US - t) // US
        lines.append(_api("cudaGraphLaunch", launch, exec=2))
        text = "CUDA Graph id 5 reused"
        lines.append(_log(stamp, read, text) if stamped else {"ev": "log", "t_ns": read, "text": text})
    return lines


def _uid_steps(lines) -> list[int]:
    head = {"raw": "graphdiag-trace", "version": 1, "cmd": ["llama-server"]}
    _, events = convert(head, lines)
    launched = [e.step for e in events if isinstance(e, E.ReplayLaunched)]
    return [launched.index(e.step) if e.step in launched else -1 for e in events if isinstance(e, E.UidHit)]


def test_a_line_read_after_its_launch_is_placed_before_it_by_its_stamp():
    lines = _replays(late_us=30)
    assert _uid_steps(lines) == [0, 1, 2]
    at = log_places(lines)
    launches = [ln["t0_ns"] for ln in lines if ln["ev"] == "api"]
    assert [at[i] for i in sorted(at)] == [t - 1 for t in launches]


def test_by_read_time_the_line_went_to_the_next_compute():
    """Without stamps (a program that prints none) the read time stands, and the placement says so."""
    assert _uid_steps(_replays(late_us=30, stamped=False)) == [1, 2]     # the last one: after every step
    assert log_places(_replays(late_us=30, stamped=False)) == {}


def test_a_line_far_past_a_launch_is_not_moved_before_it():
    """A line whose stamp puts it LOG_LATE_NS or more after the last graph call belongs after that call."""
    lines = [_batch(0), _api("cudaGraphLaunch", 200 * US, exec=2),
             _log(0, 100 * US, "first line read fast"),
             _log(100 + 200 + LOG_LATE_NS // US, 400 * US + LOG_LATE_NS, "CUDA graph warmup reset")]
    at = log_places(lines)
    assert at[2] == 100 * US and at[3] == 400 * US + LOG_LATE_NS
    assert at[3] - lines[1]["t0_ns"] >= LOG_LATE_NS


def test_n_ctx_is_logged_else_the_command_line_else_the_files():
    assert server_settings(["llama-server", "-c", "16384"], (16384, 16384)).n_ctx(4096) == 16384
    assert server_settings(["llama-server", "-c", "1000"]).n_ctx(4096) == 1024        # padded to 256
    assert server_settings(["llama-server", "--ctx-size=0"]).n_ctx(2048) == 2048       # 0: n_ctx_train
    assert server_settings(["llama-server"]).n_ctx(32768) == 32768
    assert server_settings(["llama-server", "-c", "8192"], (8192, 512)).n_ctx(4096) == 8192   # two contexts


def test_the_recorded_server_trace_has_its_n_ctx_from_the_command_line():
    """Recorded before graphdiag kept llama.cpp's "llama_context: n_ctx" lines: -c 16384 says it (graphdiag's
    own cap of the file's cells, 4096, ran out of cells at batch 117)."""
    from graphdiag.trace.convert import convert_raw
    header, _ = convert_raw(DATA / "server-e2e-h100.raw.jsonl")
    assert "n_ctx" not in header.trace
    assert server_settings(header.trace["cmd"], ()).n_ctx(4096) == 16384


def test_the_n_ctx_line_is_kept_in_the_header():
    line = "0.00.214.245 I llama_context: n_ctx                 = 16384"
    lines = _replays(late_us=30) + [{"ev": "log", "t_ns": 5, "text": line}]
    head = {"raw": "graphdiag-trace", "version": 1, "cmd": ["llama-server"]}
    header, _ = convert(head, lines)
    assert header.trace["n_ctx"] == [16384]


@pytest.mark.parametrize("wtype,cols,cc,prec,want", [
    (GGMLType.F16, 512, 900, 0, 3),      # convert x to F16, h-GEMM, convert the F16 result to F32
    (GGMLType.F16, 17, 900, 0, 3),
    (GGMLType.F16, 16, 900, 0, 0),       # MMF takes up to 16 columns
    (GGMLType.F16, 512, 700, 0, 2),      # Volta: cuBLAS writes F32
    (GGMLType.F16, 512, 900, GGML_PREC_F32, 2),   # F32 compute: the weights converted, x as it is
    (GGMLType.BF16, 512, 900, 0, 2),     # BF16 GEMM writes F32
    (GGMLType.F32, 512, 900, 0, 0),      # Sgemm: cublas_split_k_parts' stand-in
    (GGMLType.Q8_0, 512, 900, 0, 0),     # MMQ
])
def test_cublas_launches(wtype, cols, cc, prec, want):
    node = _mul_mat(wtype, 256, 64, cols)
    if prec:
        node.set_param_i32(0, prec)
    assert node.op == Op.MUL_MAT
    assert cublas_launches(node, cc, H100_SMS) == want


H100_SMS = 132


def _mul_mat(wtype, k: int, m: int, cols: int):
    ctx = Ctx(Arena())
    node = ctx.mul_mat(ctx.new_tensor(wtype, (k, m), "w"), ctx.new_input(GGMLType.F32, (k, cols), "x"), "out")
    Graph(ctx.arena).build_forward_expand(node)
    return node


# Every cuBLAS GEMM of the F16 captures recorded on the H100 (2026-12-07; tests/data/llama/kernels-tiny-f16-gen-
# 716079883.json, kernels-qwen3moe-f16-moe-sequences-sweep.json, and llama-server's tiny F16 512-token ubatch),
# as (K, M, columns, split over K by cuBLAS: its h16816gemm followed by cublasLt's splitKreduce_kernel)
RECORDED_F16_GEMMS = [
    (1408, 512, 47, True),     # tiny ffn_down (layers 0-2; layer 3's takes the output row alone: MMVF)
    (1408, 512, 56, True),
    (1024, 512, 32, True),     # qwen3moe-tiny attn_output (8 heads x 128)
    (512, 512, 47, False),     # tiny attn_q / attn_k / attn_v / attn_output
    (512, 1408, 47, False),    # tiny ffn_gate / ffn_up
    (512, 1024, 32, False),    # qwen3moe-tiny attn_q
    (512, 256, 32, False),     # qwen3moe-tiny attn_k / attn_v
    (512, 4096, 32, False),    # qwen3moe-tiny's LM head at 32 outputs
    (1408, 512, 512, False),   # tiny ffn_down at a 512-token ubatch (llama-server)
]


@pytest.mark.parametrize("k,m,cols,split", RECORDED_F16_GEMMS)
def test_cublas_splits_k_where_the_h100_did(k, m, cols, split):
    """cuBLAS's own choice, modelled (compat.cublas_split_k_parts) and held to every F16 GEMM recorded: a split
    GEMM is one launch more in upstream's graph (the reduce), and graphdiag's stand-in launches two too."""
    from graphdiag.backends.gpu.compat import cublas_split_k_parts
    node = _mul_mat(GGMLType.F16, k, m, cols)
    assert bool(cublas_split_k_parts(node, 900, H100_SMS)) == split
    assert cublas_launches(node, 900, H100_SMS) == 3 + split


def test_bf16_gemms_do_not_split():
    """tiny BF16 at 47 columns: its ffn_down ran as one GEMM (the differential test's seed 716079883 agreed)."""
    from graphdiag.backends.gpu.compat import cublas_split_k_parts
    assert cublas_split_k_parts(_mul_mat(GGMLType.BF16, 1408, 512, 47), 900, H100_SMS) == 0


@pytest.mark.parametrize("k,m,cols,split", RECORDED_F16_GEMMS)
def test_f16_cublas_path_is_lowered_as_upstream_launches_it(k, m, cols, split):
    """graphdiag's lowering of each recorded F16 GEMM: x's F16 copy, the tile mat-mul reading it into an F16
    result (its k-split and fixup where cuBLAS split), the result back to F32 — upstream's launch count, so
    nothing is left for cublas_extra; on Volta (cuBLAS writes F32 there) the stand-in of before."""
    from graphdiag.backends.gpu.lowering import lower_node, op_launches
    node = _mul_mat(GGMLType.F16, k, m, cols)
    g = Graph(node.arena)
    g.build_forward_expand(node)
    launches = op_launches(lower_node(g, g.n_nodes - 1, None, 900, nsm=H100_SMS))
    names = [launch.kernel for launch in launches]
    assert names == ["cpy_f32_f16", "mul_mat_f16"] + ["mul_mat_fixup_f32"] * split + ["cpy_f16_f32"]
    assert len(names) == cublas_launches(node, 900, H100_SMS)
    f16 = int(GGMLType.F16)
    assert int(launches[1].params["t"][2]["type"]) == f16 and int(launches[1].params["t"][0]["type"]) == f16
    volta = [launch.kernel for launch in op_launches(lower_node(g, g.n_nodes - 1, None, 700, nsm=80))]
    assert "cpy_f16_f32" not in volta

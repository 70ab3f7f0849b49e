"""graphdiag llama on the GPU (issue 28): a watched run of an exported tiny records what real llama.cpp did
(capture, replays, the uid reuse lines, a refusal at 1 -> 2 sequences), the libstdc++ fix loads it in
process, and bench steps --peer llama times it graphs on and off beside graphdiag's rows."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.report.record.read import read_record

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from graphdiag.errors import GraphdiagError
    from graphdiag.llama.driver import load_llama_cpp
    try:
        load_llama_cpp()
    except GraphdiagError as e:
        pytest.skip(str(e))
    p = tmp_path_factory.mktemp("llama") / "tiny-f16.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    return p


def _llama(tmp_path, *args, env=None):
    rec = tmp_path / "l.jsonl"
    p = subprocess.run([sys.executable, "-m", "graphdiag", "llama", *map(str, args), "--events", str(rec),
                        "--raw", str(tmp_path / "l.raw.jsonl")], capture_output=True, text=True, timeout=600,
                       env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout, read_record(rec)


def test_a_watched_run_records_llama_cpps_graphs(tiny, tmp_path):
    out, (h, ev) = _llama(tmp_path, tiny, "--steps", "12", "--prompt-tokens", "8")
    from graphdiag.backends.drivers.cuda import device_identity
    assert h.device and h.device.startswith(device_identity()[0]) and h.llama["perf"]["n_reused"] > 0
    phases = [e.phase for e in ev if isinstance(e, E.PhaseDecided)]
    assert phases[0] == "eager" and "capture" in phases and phases[-1] == "replay"
    caps = [e for e in ev if isinstance(e, E.ChunkCaptured)]
    assert caps and all(c.n_graph_nodes > 10 for c in caps)
    assert any(isinstance(e, E.UidHit) for e in ev)                  # "CUDA Graph id N reused" from the log
    assert any(isinstance(e, E.WarmupTransition) and e.to_state == "warm" for e in ev)
    assert all(e.duration_ns > 0 for e in ev if isinstance(e, E.StepFinished))
    assert "not observable in llama.cpp" in out


def test_a_batch_change_is_refused_and_reinstantiated(tiny, tmp_path):
    _, (h, ev) = _llama(tmp_path, tiny, "--scenario", "fusion-boundary")
    refused = [e for e in ev if isinstance(e, E.UpdateRefused)]
    assert refused and refused[0].reason == "TOPOLOGY_CHANGED"          # 1 -> 2 tokens (the fusions change)
    assert any(isinstance(e, E.ChunkUpdated) and e.step >= 30 for e in ev)   # 8 -> 9: updated in place


def test_the_interposing_watcher_decides_as_the_cupti_one(tiny, tmp_path):
    """GRAPHDIAG_WATCHER=interpose (the injection library's interposing build loaded before libllama, no CUPTI):
    the same captures, kernel counts, refusals, updates and replays as the default watcher's run of the plan."""
    import os

    def decisions(folder, watcher):
        folder.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "GRAPHDIAG_WATCHER"} | (
            {"GRAPHDIAG_WATCHER": watcher} if watcher else {})
        _, (h, ev) = _llama(folder, tiny, "--scenario", "fusion-boundary", env=env)
        kinds = (E.PhaseDecided, E.ChunkCaptured, E.UpdateRefused, E.ChunkUpdated, E.ChunkInstantiated)
        return h, [(type(e).__name__, e.step, getattr(e, "phase", None), getattr(e, "n_graph_nodes", None))
                   for e in ev if isinstance(e, kinds)]
    h_i, interposed = decisions(tmp_path / "i", "interpose")
    h_c, cupti = decisions(tmp_path / "c", None)
    assert h_i.llama["watcher"] == "injection library, interposing" and "interposing" in h_i.note
    assert h_c.llama["watcher"] == "injection library"
    assert interposed == cupti and any(d[0] == "UpdateRefused" for d in cupti)


def test_bench_steps_peer_llama(tiny, capsys):
    assert main(["bench", "steps", "--model", "tiny", "--steps", "32", "--peer", "llama", "--json"]) == 0
    (row,) = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert row["llama_replay_ms"] > 0 and row["llama_eager_ms"] > 0 and row["replay_vs_llama"] > 0
    print(f"tiny f16: graphdiag replay {row['replay_ms']:.3f} / llama.cpp {row['llama_replay_ms']:.3f} ms; "
          f"eager {row['eager_ms']:.3f} / {row['llama_eager_ms']:.3f} ms")

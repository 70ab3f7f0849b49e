"""The llama.cpp peer of `bench steps --peer llama`: real llama.cpp's decode step on the same model, graphs on
and graphs off, the headline comparison.

The row's preset is exported as a GGUF (the same seeded weights graphdiag times), and `graphdiag llama`
decodes it with the row's plan (the same prompt and steps, so the same n_kv) in a child process per mode:
ggml reads GGML_CUDA_DISABLE_GRAPHS once per process, and graphdiag's own rows are timed without
llama.cpp's libraries, CUDA context and threads in their process. Each child is watched as `graphdiag
llama` always is (CUPTI callbacks on its six graph calls only), which is how its replayed steps are told
from the others. Times are llama_decode through llama_synchronize (host wall, ms) less what the watcher's
own Python callbacks took inside it (CUPTI's and the log's: the raw stream's watch_ns), decode steps only,
after the same warm-up graphdiag's rows drop.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import GraphdiagError, UsageError

CHILD_TIMEOUT_S = 900


def check_llama_peer(backend: str | None) -> None:
    """--peer llama needs llama_cpp and a GPU: one line before any row is run."""
    from ..llama.driver import NO_LLAMA
    if backend in ("sim", "cpu"):
        raise UsageError(f"--peer llama runs real llama.cpp on the GPU: not with --backend {backend}")
    if importlib.util.find_spec("llama_cpp") is None:
        raise UsageError(NO_LLAMA)


def export_row_model(row: dict, folder: Path) -> Path:
    """The row's GGUF: a file's row runs the file itself; a preset's row its preset and weight type exported
    into `folder` (seed 0, as graphdiag's rows)."""
    if "model_path" in row:
        return Path(row["model_path"])
    from ..model.gguf_io import export_gguf
    from ..model.presets import get_preset, weight_type
    from ..model.weights import create_model
    path = folder / f"{row['model']}-{row['wtype']}.gguf"
    if not path.exists():
        export_gguf(create_model(get_preset(row["model"]), weight_type(row["wtype"]), seed=0), path, row["model"])
    return path


def llama_decode_stats(model: Path, steps: int, prompt_tokens: int, graphs: bool, folder: Path, decode_stats) -> dict:
    """`decode_stats` (steps.py's, handed in: steps.py calls this module) of a `graphdiag llama` child run:
    its replayed steps with graphs, its eager ones without."""
    from ..report.record.read import read_record
    rec = folder / f"{model.stem}-{'on' if graphs else 'off'}.jsonl"
    argv = [sys.executable, "-m", "graphdiag", "llama", str(model), "--steps", str(steps), "--prompt-tokens",
            str(prompt_tokens), "--events", str(rec), "--raw", str(rec.with_suffix(".raw.jsonl")), "--json"]
    if not graphs:
        argv.append("--no-graphs")
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GraphdiagError(f"the llama.cpp peer (graphs {'on' if graphs else 'off'}) ran past "
                             f"{CHILD_TIMEOUT_S} s") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no message"])[-1]
        raise GraphdiagError(f"the llama.cpp peer failed (graphs {'on' if graphs else 'off'}, exit {p.returncode}): {last}")
    _, events = read_record(rec)
    return decode_stats(events, "replay" if graphs else "eager")


def llama_peer_figures(row: dict, steps: int, prompt_tokens: int, folder: Path, progress, decode_stats) -> dict:
    """llama.cpp's figures for the model `row` names (its graphdiag times are not read: this can run before
    them)."""
    from .timing import host_reference_us
    model = export_row_model(row, folder)
    out = {"llama_host_ref_us": host_reference_us()}
    for graphs, key in ((True, "replay"), (False, "eager")):
        progress.start(f"{row['model']} {row['wtype']} llama.cpp graphs {'on' if graphs else 'off'}", 1)
        st = llama_decode_stats(model, steps, prompt_tokens, graphs, folder, decode_stats)
        progress.advance()
        out[f"llama_{key}_ms"], out[f"llama_{key}_p90_ms"] = st.get("ms"), st.get("p90_ms")
        out[f"llama_{key}_steps"] = st.get("steps", 0)
    out["llama"] = "llama.cpp 0.3.36 (llama-cpp-python), watched"
    return out


def add_llama_ratios(row: dict) -> None:
    """The ratios of graphdiag's replayed and eager step to llama.cpp's, on a row holding both."""
    row["replay_vs_llama"] = _ratio(row.get("replay_ms"), row.get("llama_replay_ms"))
    row["eager_vs_llama"] = _ratio(row.get("eager_ms"), row.get("llama_eager_ms"))
    row["llama_graph_speedup"] = _ratio(row.get("llama_eager_ms"), row.get("llama_replay_ms"))


def _ratio(a, b):
    return a / b if a and b else None


def llama_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="graphdiag-llama-peer-"))

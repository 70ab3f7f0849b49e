"""The llama.cpp peer of `bench steps --peer llama`: real llama.cpp's decode step on the same model, graphs on
and graphs off, the headline comparison.

The row's preset is exported as a GGUF (the same seeded weights graphdiag times), and `graphdiag llama`
decodes it with the row's plan (the same prompt and steps, so the same n_kv) in a child process per mode:
ggml reads GGML_CUDA_DISABLE_GRAPHS once per process, and graphdiag's own rows are timed without
llama.cpp's libraries, CUDA context and threads in their process. No timed child has a CUPTI subscriber:
CUPTI's dispatch around the callbacks it enables slows every call it sees (tracing llama-bench cost 7-12 %
of its tokens per second on the H100, 2026-12-07), beyond the callbacks' own time. Graphs off, the child
makes none (no graph call to watch); graphs on, one child is watched as `graphdiag llama` always is (CUPTI
callbacks on its graph calls), which is how its replayed steps are told from the others, and a second
child runs the same plan unwatched (GRAPHDIAG_WATCHER=log) for the times (retimed). Times are llama_decode
through llama_synchronize (host wall, ms) less what the log callback took inside it, decode steps only,
after the same warm-up graphdiag's rows drop.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import events as E
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


def _child(model: Path, steps: int, prompt_tokens: int, graphs: bool, folder: Path, timed: bool) -> list:
    """The events of one `graphdiag llama` child run of the plan; `timed`: run unwatched (GRAPHDIAG_WATCHER=log:
    no CUPTI subscriber, whose dispatch around its callbacks slows every call it sees)."""
    from ..report.record.read import read_record
    rec = folder / f"{model.stem}-{'on' if graphs else 'off'}{'-timed' if timed else ''}.jsonl"
    argv = [sys.executable, "-m", "graphdiag", "llama", str(model), "--steps", str(steps), "--prompt-tokens",
            str(prompt_tokens), "--events", str(rec), "--raw", str(rec.with_suffix(".raw.jsonl")), "--json"]
    if not graphs:
        argv.append("--no-graphs")
    env = dict(os.environ, GRAPHDIAG_WATCHER="log") if timed else None
    which = f"graphs {'on' if graphs else 'off'}{', unwatched' if timed else ''}"
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise GraphdiagError(f"the llama.cpp peer ({which}) ran past {CHILD_TIMEOUT_S} s") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no message"])[-1]
        raise GraphdiagError(f"the llama.cpp peer failed ({which}, exit {p.returncode}): {last}")
    return read_record(rec)[1]


def retimed(watched: list, timed: list) -> list:
    """`watched`'s events with each step's host and GPU times taken from `timed`, a run of the same plan made
    unwatched (its graph calls unseen, so its own steps' phases unknown). The plan and the file are the same,
    and so are llama.cpp's decisions; both runs must have finished the same steps."""
    times = {e.step: e for e in timed if isinstance(e, E.StepFinished)}
    steps = [e.step for e in watched if isinstance(e, E.StepFinished)]
    if sorted(times) != sorted(steps):
        raise GraphdiagError(f"the llama.cpp peer's watched and unwatched runs finished different steps "
                             f"({len(steps)} and {len(times)})")
    return [dataclasses.replace(e, duration_ns=times[e.step].duration_ns, gpu_ns=times[e.step].gpu_ns)
            if isinstance(e, E.StepFinished) else e for e in watched]


def llama_decode_stats(model: Path, steps: int, prompt_tokens: int, graphs: bool, folder: Path, decode_stats) -> dict:
    """`decode_stats` (steps.py's, handed in: steps.py calls this module) of `graphdiag llama` child runs: the
    replayed steps with graphs, the eager ones without. Timed without CUPTI: graphs off, the child makes no
    subscriber (there is no graph call to watch); graphs on, a watched run says which steps replayed and an
    unwatched run of the same plan gives their times."""
    if not graphs:
        return decode_stats(_child(model, steps, prompt_tokens, False, folder, timed=False), "eager")
    watched = _child(model, steps, prompt_tokens, True, folder, timed=False)
    return decode_stats(retimed(watched, _child(model, steps, prompt_tokens, True, folder, timed=True)), "replay")


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
    out["llama"] = "llama.cpp 0.3.36 (llama-cpp-python), timed unwatched"
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

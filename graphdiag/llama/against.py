"""`graphdiag run --model M.gguf … --against-llama`: the graphdiag run, the same plan on real llama.cpp,
and the aligned diff of the two, in one command.

Upstream captures each split as one graph, so the graphdiag run takes --chunk-size 0 unless one is given
(any other is refused: the captures could not match). Both records are written: the graphdiag one where
--events says (else beside the llama one), the llama one as NAME.llama.jsonl next to it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from ..errors import UsageError


def _check_upstream(settings: dict, scenario: str | None) -> None:
    """The llama.cpp that llama-cpp-python runs is UPSTREAMS[0]: a graphdiag run under another commit's
    rules (--upstream, or the scenario's [run] upstream) would be held against the wrong code. Refused
    before any model is built."""
    from ..config import UPSTREAMS
    from ..scenario import load_scenario
    given, where = settings.get("upstream"), "--upstream"
    if given is None and scenario:
        sc = load_scenario(scenario)
        given, where = sc.run.get("upstream"), f"upstream ({sc.where('run.upstream')})"
    if given not in (None, UPSTREAMS[0]):
        raise UsageError(f"{where} {given} with --against-llama: llama.cpp through llama-cpp-python is "
                         f"{UPSTREAMS[0]}, so its decisions cannot be compared with {given}'s rules (drop it)")


def run_against_llama(settings: dict, scenario: str | None, events_path: str | None, verbosity: int = 0,
                      out=None, **inject) -> int:
    """Exit status: 1 when either run's checks fail or the decisions differ, else 0."""
    from ..model.source import is_file
    from ..report.analysis.known import diff_records
    from ..report.record.read import read_record
    from ..report.views.observed_diff import render_observed_diff
    from ..runner import run_cli
    from .command import llama_cli

    out = out or sys.stdout
    _check_upstream(settings, scenario)
    model = settings.get("model")
    if not model or not is_file(model):
        raise UsageError("--against-llama runs real llama.cpp on a GGUF file: give --model PATH.gguf "
                         "(graphdiag export-gguf writes a preset as one)")
    if events_path == "-":
        raise UsageError("--against-llama writes two records to files: give --events FILE.jsonl, not -")
    if settings.get("chunk_size") not in (None, 0):
        raise UsageError(f"--chunk-size {settings['chunk_size']} with --against-llama: upstream captures each "
                         f"split as one graph (use 0, the default here)")
    if inject.get("lib") is None:         # llama_cpp missing: said now, not after the whole graphdiag run
        from .driver import require_llama_cpp
        require_llama_cpp()
    settings = {**settings, "chunk_size": 0}
    ours = Path(events_path) if events_path else Path(tempfile.mkdtemp(prefix="graphdiag-")) / "graphdiag.jsonl"
    theirs = ours.with_suffix(".llama.jsonl")
    llama_settings = {k: settings.get(k) for k in ("seed", "prompt_tokens", "prompt_ids", "steps", "batch", "fusion",
                                                   "concurrent_streams", "graphs_disabled", "reuse_disabled",
                                                   "swa_full")}
    rc = run_cli(settings, scenario=scenario, events_path=str(ours), verbosity=verbosity, out=out)
    rc = max(rc, llama_cli(model, llama_settings, scenario=scenario, events_path=str(theirs), out=out,
                           raw_path=str(ours.with_suffix(".llama.raw.jsonl")), **inject))
    d = diff_records(read_record(ours), read_record(theirs), (f"graphdiag {ours}", f"llama.cpp {theirs}"),
                     model=model)          # the known differences excused pair by pair, as `graphdiag diff` does
    out.write("\n")
    render_observed_diff(d, out)
    return max(rc, 0 if d.equal else 1)

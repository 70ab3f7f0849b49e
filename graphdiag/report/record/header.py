"""The record's schema and its first line: `RunHeader`, what a run was (also the top of every report).

A record is UTF-8 JSON lines: this header (`{"schema": "graphdiag-events", "version": 1, ...}`), then one
event's `to_dict()` per line (write.py writes them, read.py reads and checks them back).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ... import __version__
from ... import events as E

SCHEMA_NAME = "graphdiag-events"


@dataclass
class RunHeader:
    """What a run was: the first line of a record, and the top of every report.

    backend: "cuda" | "sim" | "cpu"; device: the GPU's name or "simulated GPU (cc 9.0)";
    settings: RunConfig.settings(); sources: RunConfig.sources (setting -> "default" | "env NAME" |
    "scenario" | "cli"); started: ISO-8601 local time; scenario: the scenario's name or None."""

    backend: str = "sim"
    device: str = ""
    simulated: bool = True
    model: str = ""
    upstream: str = ""             # the upstream commit whose rules the run followed ("": a record from before)
    rules: str = ""                # what ran: "upstream 0c1e57098", "... + article: chunked capture (512)" (config.rules)
    article: list[str] = field(default_factory=list)   # the design article's rules followed, in config.ARTICLE_RULES' words
    settings: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    started: str = ""
    scenario: str | None = None
    note: str = ""                 # what the runner wants said, e.g. "no GPU (...); using the SIMULATED driver"
    sim_mode: str = ""             # the simulated driver's mode: "compute" | "decisions" ("": not simulated)
    sim_mode_reason: str = ""      # why, e.g. "default for model 7b", "--sim-mode", "--verify needs computed results"
    blas: dict[str, Any] = field(default_factory=dict)   # config.BlasThreads.to_dict(): numpy's BLAS threads
    model_file: dict[str, Any] = field(default_factory=dict)   # a GGUF model: path, arch, tensor types, bytes
    launcher: str = ""             # CUDA: how eager steps issue their launches ("C loop", or one by one and why)
    llama: dict[str, Any] = field(default_factory=dict)   # a record converted from a watched llama.cpp run
    #   (graphdiag/llama/convert.py): llama_cpp version, raw stream, env, perf counters, not_observable
    trace: dict[str, Any] = field(default_factory=dict)   # a record converted from `graphdiag trace -- CMD`
    #   (graphdiag/trace/convert.py): cmd, raw stream, pids, devices, what a step is, not_observable
    replay: dict[str, Any] = field(default_factory=dict)  # a `graphdiag replay` of a trace's batches
    #   (graphdiag/trace/replay.py): the trace, model, batches and ubatches replayed, what was not
    graphdiag_version: str = __version__
    schema: str = SCHEMA_NAME
    version: int = E.SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The header as the record's first JSON object (schema and version first)."""
        d = dataclasses.asdict(self)
        head = {"schema": d.pop("schema"), "version": d.pop("version")}
        return head | d

    @property
    def traced_without_cuda(self) -> bool:
        """A trace of a program that decoded (llama_decode batches recorded) but never initialised CUDA (no
        process with a CUDA context: a CPU build): batches to replay, no graph decisions."""
        return not self.trace.get("pids") and bool(self.trace.get("decode_batches"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunHeader":
        """Build from a header object; unknown fields (from a newer writer) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def as_header(header: "RunHeader | dict[str, Any]") -> RunHeader:
    """A RunHeader from either a RunHeader or the header dict the runner builds."""
    return header if isinstance(header, RunHeader) else RunHeader.from_dict(header)

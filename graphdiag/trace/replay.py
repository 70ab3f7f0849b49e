"""`graphdiag replay`: a trace's llama_decode batches run through graphdiag's runtime on the same GGUF file.

The trace is read (a raw stream from `graphdiag trace --raw`, or its converted record), its batches become a
step plan (replay_plan.py), graphdiag's runtime walks it (the simulated driver, or CUDA), and the replay's
record is graphdiag's events with each replayed DecodeBatch put back before its first step (step: the last
step before it, as the trace's), so the record reads as the trace does and whatif can take it. The
comparison itself is report/analysis/replay_diff.py.
"""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass, replace
from pathlib import Path

from .. import events as E
from ..errors import EventFileError, UsageError
from ..report.record.header import RunHeader, as_header
from .replay_plan import ReplayPlan, ServerSettings, replay_plan, server_settings, trace_batches


@dataclass
class Replay:
    """A trace and graphdiag's run of its batches."""

    trace: tuple[RunHeader, list[E.Event]]
    ours: tuple[RunHeader, list[E.Event]]
    plan: ReplayPlan
    settings: ServerSettings
    model: str


    def notes(self) -> list[str]:
        """What the reader must know about this replay: batches not replayed, cells removed by inference (the
        caller's seq_rm, the server's idle-slot clears), cells the server put back unseen, a KV cache graphdiag
        does not model, a synthetic trace."""
        out = [f"{n} batch{'es' * (n != 1)} {why}" for why, n in self.plan.skipped.items()]
        if any("another llama_context" in why for why in self.plan.skipped):
            out[-1] += " (--model-draft FILE replays a draft model's)"
        if self.plan.inferred_removals:
            out.append(f"{self.plan.inferred_removals} KV-cell removals inferred (a sequence placed again at "
                       f"positions it held: the caller's seq_rm, not in a trace)")
        n = self.plan.idle_clears
        if n:
            whose = "1 idle slot's" if n == 1 else f"{n} idle slots'"
            out.append(f"{whose} cells cleared as the server started a task (inferred: llama-server's "
                       f"--cache-idle-slots, its default, with a unified KV cache)")
        if self.plan.restored:
            out.append(f"{self.plan.restored} task{'s' * (self.plan.restored != 1)} started past position 0 on a slot "
                       f"holding none of its cells: the server put a prompt back from its prompt cache "
                       f"(llama_state_seq_set_data), a placement no trace shows; graphdiag's cells, and maybe n_kv, "
                       f"differ from there on")
        if not self.settings.unified:
            out.append(f"the traced server ran -np {self.settings.n_parallel} without --kv-unified: one KV stream "
                       f"per sequence, which graphdiag does not model (it replays one unified cache); trace with "
                       f"-kvu (or without -np: the server's auto is unified) to compare")
        synthetic = self.trace[0].trace.get("synthetic")
        if synthetic:
            out.append(f"the trace is {synthetic}")
        excerpt = self.trace[0].trace.get("excerpt")
        if excerpt:
            out.append(f"the trace is an excerpt: {excerpt}")
        return out

    def header_lines(self) -> list[str]:
        h = self.ours[0]
        return [f"ran: {h.device or h.backend} ({h.note})" if h.note else f"ran: {h.device or h.backend}",
                f"replayed: {len(self.plan.batches)} batches as {len(self.plan.steps)} ubatches (n_ubatch "
                f"{self.settings.n_ubatch}, n_ctx {h.settings.get('n_ctx', '?')})"]


def write_record(r: Replay, path: str | Path) -> None:
    """The replay's record: its header (with `replay`) and events, as `graphdiag run --events` writes one."""
    from ..report.record.write import JsonlWriter
    with JsonlWriter(path, r.ours[0]) as w:
        for ev in r.ours[1]:
            w(ev)


def load_trace(path: str | Path) -> tuple[RunHeader, list[E.Event]]:
    """A raw stream (`graphdiag trace --raw`) converted, or a converted trace record. One-line errors for
    anything else."""
    from ..rawstream import first_line
    from ..report.record.read import read_record
    from .convert import convert_raw
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        head = json.loads(first_line(p))
    except (ValueError, EOFError, lzma.LZMAError):
        raise EventFileError(f"{path}:1: not a graphdiag trace (no JSON header line)") from None
    if isinstance(head, dict) and head.get("raw") == "graphdiag-trace":
        return convert_raw(p)
    header, events = read_record(p)
    if not header.trace:
        raise UsageError(f"{path} is not a trace (`graphdiag trace -- CMD` writes one): replay takes the "
                         f"batches a traced program gave llama_decode")
    return header, events


def run_replay(trace_path: str | Path, model: str, backend: str = "auto", warn=None, draft: bool = False,
               loaded: tuple | None = None) -> Replay:
    """Run the trace's batches through graphdiag on `model` (a GGUF file): the target's (the first
    llama_context's), or with `draft` the second context's (a draft model's, llama-server --model-draft).
    `loaded`: the trace's (header, events) when already read. UsageError, one line, where the trace has no
    batches (or no second context) or its token ids are not the model's."""
    from ..llama.expressible import check_gguf
    from .replay_plan import contexts
    check_gguf(model)
    header, events = loaded or load_trace(trace_path)
    batches = trace_batches(events, header.trace.get("not_observable", ()))
    settings = server_settings(list(header.trace.get("cmd") or []), tuple(header.trace.get("n_ctx") or ()))
    ctxs = contexts([b for b in batches if b.ret == 0]) or [batches[0].ctx]
    if draft and len(ctxs) < 2:
        raise UsageError(f"{trace_path}: its batches went to one llama_context: no draft model's batches to "
                         f"replay (trace llama-server run with --model-draft)")
    ours, plan = replay_batches(batches, model, backend, settings, warn, ctx=ctxs[1] if draft else ctxs[0])
    ours[0].replay = {"trace": str(trace_path), "model": str(model), "batches": len(plan.batches),
                      "ubatches": len(plan.steps), "skipped": plan.skipped,
                      "inferred_removals": plan.inferred_removals, "idle_clears": plan.idle_clears,
                      "restored": plan.restored, "n_ubatch": settings.n_ubatch,
                      "kv_unified": settings.unified, "trace_cmd": header.trace.get("cmd") or []}
    return Replay((header, events), ours, plan, settings, str(model))


def replay_batches(batches: list[E.DecodeBatch], model: str, backend: str = "auto",
                   settings: ServerSettings = ServerSettings(), warn=None, ctx: int | None = None
                   ) -> tuple[tuple, ReplayPlan]:
    """((header, events), plan) of graphdiag's run of the batches of context `ctx` (None: the first
    batch's) on `model`: the simulated driver in decisions-only mode (no logits are needed), or CUDA."""
    from ..config import RunConfig
    from ..model.source import model_config, n_ctx_train
    from ..runner import run
    mcfg = model_config(model)
    plan = replay_plan(batches, mcfg.n_vocab, settings, Path(model).name, ctx)
    if not plan.steps:
        raise UsageError(f"none of the trace's {len(batches)} llama_decode batches can be replayed "
                         f"({'; '.join(plan.skipped)})")
    cfg = RunConfig(backend=backend, model=str(model), ubatch_size=settings.n_ubatch, steps=len(plan.steps),
                    n_ctx=settings.n_ctx(n_ctx_train(model)),
                    sim_mode=None if backend == "cuda" else "decisions")   # the decisions need no logits
    cfg.sources = {"model": "cli", "backend": "cli", "ubatch_size": "trace", "n_ctx": "trace", "sim_mode": "replay"}
    cfg.validate()
    res = run(cfg, plan=plan.steps, warn=warn, n_seq_max=settings.n_seq_max, n_outputs_max=settings.n_outputs_max)
    return (as_header(res.header), with_batches(res.events, plan)), plan


def with_batches(events: list[E.Event], plan: ReplayPlan) -> list[E.Event]:
    """graphdiag's events with each replayed batch's DecodeBatch before its first step's events (the cells
    it removed first included)."""
    first = {start: b for b, (start, _) in zip(plan.batches, plan.step_range)}
    out: list[E.Event] = []
    for ev in events:
        if ev.step in first and not isinstance(ev, E.RunEnded):
            out.append(replace(first.pop(ev.step), step=ev.step - 1))
        out.append(ev)
    return out

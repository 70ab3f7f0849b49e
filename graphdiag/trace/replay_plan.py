"""A trace's llama_decode batches -> graphdiag's step plan (plan.StepPlan, kind "ubatch"): what `graphdiag
replay` runs.

Each batch is taken as the traced program gave it: token ids, positions, sequence ids, the rows with logits.
Where the caller left an array NULL, llama.cpp's own filling is applied (positions: each sequence's next;
sequences: 0; outputs: the last row). A batch llama_decode refused (ret != 0) decoded nothing and is left
out. A batch is cut into ubatches as llama.cpp's unified KV cache cuts it (split_simple: n_ubatch rows at a
time, in order); each ubatch is one step, its n_outputs the rows with logits in it. The time the caller
spent between two batches (one's t0 minus the end of the one before) is the step's idle time. A sequence
placed again at a position it already holds had its cells removed first (llama-server's seq_rm when a slot
takes a new request, its rollback past rejected drafts in speculative decoding, or llama_memory_clear after
its warmup decode): the replay removes them too, the inference named in each step's `removes`. So are the
cells llama-server frees where no batch shows it: with a unified KV cache it clears every idle slot when it
starts a task (`_idle_clears`; a speculative rollback starts none).

One llama_context is replayed at a time (the target: the first batch's; or a draft model's, on its own
model): each context has its own graphs and CUDA-graph cache, so a draft model's batches (speculative
decoding) replay on the draft's file apart from the target's, and are listed as not replayed in the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import events as E
from ..errors import UsageError
from ..plan import N_BATCH, N_UBATCH, StepPlan


SPEC_DRAFT_N_MAX = 3    # common.h's params.speculative.draft.n_max, 0c1e57098 and b11434 alike


@dataclass(frozen=True)
class ServerSettings:
    """What the traced command line says about batching (llama-server's / llama.cpp common's flags)."""

    n_ubatch: int = N_UBATCH
    n_batch: int = N_BATCH
    n_parallel: int | None = None   # -np as given (None: not given; llama-server's auto is 4, unified KV)
    kv_unified: bool = False        # --kv-unified / -kvu given
    server: bool = False            # the traced program is llama-server
    draft: bool = False             # --model-draft / -md given (speculative decoding)
    ctx_size: int | None = None     # -c / --ctx-size as given (None: not given; 0: the model's n_ctx_train)
    logged_n_ctx: tuple = ()        # llama.cpp's "llama_context: n_ctx = N" lines in the trace, in order
    cache_idle_slots: bool = True   # --cache-idle-slots (llama-server's default) / --no-cache-idle-slots
    cache_ram: int | None = None    # -cram / --cache-ram MiB as given (None: not given, 8192; 0: no prompt cache)
    spec_draft_n_max: int = SPEC_DRAFT_N_MAX   # --spec-draft-n-max: the most tokens one draft step drafts

    def n_ctx(self, n_ctx_train: int) -> int:
        """The traced context's KV cells: what llama.cpp logged (where every context logged one value), else
        -c padded to 256 cells as llama_context pads it, else (no -c, or -c 0) the model's n_ctx_train."""
        if self.logged_n_ctx and len(set(self.logged_n_ctx)) == 1:
            return self.logged_n_ctx[0]
        if self.ctx_size:
            return -(-self.ctx_size // 256) * 256
        return n_ctx_train

    @property
    def n_seq_max(self) -> int:
        """The context's sequences (llama.cpp's n_seq_max: the SWA cache is sized by it): -np, else 4 for
        llama-server (its auto), else 1."""
        return self.n_parallel if self.n_parallel else 4 if self.server else 1

    @property
    def n_outputs_max(self) -> int | None:
        """The context's n_outputs_max, which sizes its worst-case reserve: llama-server's
        min(n_batch, n_parallel) without a draft model (server-context.cpp server_output_limits, its log's
        "n_outputs_max = 4" at -np 4); None (llama.cpp's default, n_batch) for any other program, or a server
        with a draft model (its limit counts the draft's tokens, not in the command line)."""
        return min(self.n_batch, self.n_seq_max) if self.server and not self.draft else None

    @property
    def clears_idle_slots(self) -> bool:
        """Whether the server frees every idle slot's cells as it starts a task: server-context.cpp's
        process_single_task, with cache_idle_slots (on by default), saves each slot not processing to the
        prompt cache and, where params.kv_unified is set (-kvu, or -np left to the server's auto), calls
        prompt_clear: seq_rm(slot, -1, -1). Its init turns cache_idle_slots off under --cache-ram 0."""
        return (self.server and self.cache_idle_slots and self.cache_ram != 0
                and (self.kv_unified or self.n_parallel is None))

    @property
    def rollback(self) -> int:
        """How far back a sequence may be placed again without starting a task: with a draft model, the
        server rolls each slot back past its rejected drafts every step (at most --spec-draft-n-max positions:
        the target's verify rows, the draft context's drafted and re-evaluated rows); else 0."""
        return self.spec_draft_n_max if self.server and self.draft else 0

    @property
    def unified(self) -> bool:
        """One KV cache for every sequence, as graphdiag models it: -kvu, -np not given (the server's auto
        sets it), or one slot."""
        return self.kv_unified or self.n_parallel is None or self.n_parallel <= 1


def server_settings(cmd: list[str], logged_n_ctx: tuple = ()) -> ServerSettings:
    """Parse the flags that shape batches and the KV cache from the traced command (unknown flags ignored);
    `logged_n_ctx`: the n_ctx values llama.cpp logged (the trace header's)."""
    vals: dict[str, int] = {}
    names = {"-ub": "n_ubatch", "--ubatch-size": "n_ubatch", "-b": "n_batch", "--batch-size": "n_batch",
             "-np": "n_parallel", "--parallel": "n_parallel", "-c": "ctx_size", "--ctx-size": "ctx_size",
             "-cram": "cache_ram", "--cache-ram": "cache_ram", "--spec-draft-n-max": "spec_draft_n_max"}
    for i, a in enumerate(cmd):
        flag, _, inline = a.partition("=")
        if flag in names:
            v = inline or (cmd[i + 1] if i + 1 < len(cmd) else "")
            try:
                vals[names[flag]] = int(v)
            except ValueError:
                pass
    n_batch = vals.get("n_batch", N_BATCH)
    n_ubatch = min(vals.get("n_ubatch", N_UBATCH), n_batch)
    np_ = vals.get("n_parallel")
    idle = [a == "--cache-idle-slots" for a in cmd if a in ("--cache-idle-slots", "--no-cache-idle-slots")]
    return ServerSettings(n_ubatch, n_batch, None if np_ is not None and np_ < 0 else np_,
                          any(a in ("-kvu", "--kv-unified") for a in cmd),
                          bool(cmd) and Path(cmd[0]).name.startswith("llama-server"),
                          any(a.partition("=")[0] in ("-md", "--model-draft") for a in cmd),
                          vals.get("ctx_size"), tuple(logged_n_ctx), idle[-1] if idle else True,
                          vals.get("cache_ram"), vals.get("spec_draft_n_max", SPEC_DRAFT_N_MAX))


@dataclass
class ReplayPlan:
    """The steps to run, and for each replayed batch (in the trace's order) its index among all batches and
    the range of steps its ubatches take (first, count)."""

    steps: list[StepPlan] = field(default_factory=list)
    batches: list[E.DecodeBatch] = field(default_factory=list)     # the replayed ones
    batch_index: list[int] = field(default_factory=list)          # each one's index among the trace's batches
    step_range: list[tuple[int, int]] = field(default_factory=list)
    ctx: int = 0
    skipped: dict[str, int] = field(default_factory=dict)         # why -> batches not replayed
    inferred_removals: int = 0
    idle_clears: int = 0            # idle slots' cells cleared as the server started a task (inferred)
    restored: int = 0               # tasks started past position 0 on none of their cells (prompt cache)


def trace_batches(events: list[E.Event], not_observable: list[str] | tuple = ()) -> list[E.DecodeBatch]:
    """The trace's DecodeBatch events; UsageError where it has none."""
    batches = [e for e in events if isinstance(e, E.DecodeBatch)]
    if not batches:
        why = next((x for x in not_observable if "llama_decode" in x), "the traced program made no llama_decode "
                   "call graphdiag's library saw")
        raise UsageError(f"no llama_decode batches in this trace: {why}")
    unread = [i for i, b in enumerate(batches) if b.n_tokens < 0]
    if unread:
        raise UsageError(f"{len(unread)} of the trace's {len(batches)} decode batches were not mirrored (the first: "
                         f"batch {unread[0]}; a llama_batch_ext built through a call graphdiag's library did not "
                         f"see): it cannot be replayed")
    return batches


def contexts(batches: list[E.DecodeBatch]) -> list[int]:
    """The llama_contexts the batches went to, in order of their first batch: the target's first (llama-server
    loads and warms it up before a draft model's)."""
    return list(dict.fromkeys(b.ctx for b in batches))


def replay_plan(batches: list[E.DecodeBatch], n_vocab: int, settings: ServerSettings = ServerSettings(),
                model: str = "the model", ctx: int | None = None) -> ReplayPlan:
    """The replay's steps: the batches of context `ctx` (None: the first batch's). UsageError on a batch
    graphdiag cannot replay: embeddings instead of token ids, or a token id outside the model's vocabulary
    (the trace was recorded with another model)."""
    rp = ReplayPlan(ctx=batches[0].ctx if ctx is None else ctx)
    kept, next_pos = [], {}
    for i, b in enumerate(batches):
        if b.ctx != rp.ctx:
            _skip(rp, "of another llama_context (a draft model's or its target's): not replayed on this model")
            continue
        if b.ret != 0:
            _skip(rp, "refused by llama_decode (ret != 0): nothing decoded")
            continue
        if b.embd or not b.tokens:
            raise UsageError(f"batch {i} gives embeddings, not token ids: replay needs the tokens")
        bad = next((t for t in b.tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise UsageError(f"batch {i}: token id {bad} is not in {model}'s vocabulary (n_vocab {n_vocab}): the "
                             f"trace was recorded with another model")
        rows = _rows(b, next_pos)
        kept.append((i, b, rows, *_removals(rows[0], rows[1], next_pos, settings.rollback)))
    rp.inferred_removals = sum(len(k[3]) for k in kept)
    clears = (_idle_clears([(rows[0], rows[1], starts) for _, _, rows, _, starts in kept], settings.n_seq_max, rp)
              if settings.clears_idle_slots else [()] * len(kept))
    for (i, b, rows, removes, _), cleared in zip(kept, clears):
        first = len(rp.steps)
        rp.steps += _ubatches(b, rows, cleared + removes, _idle_s(rp.batches[-1] if rp.batches else None, b),
                              settings.n_ubatch)
        rp.batches.append(b)
        rp.batch_index.append(i)
        rp.step_range.append((first, len(rp.steps) - first))
    return rp


def _skip(rp: ReplayPlan, why: str) -> None:
    rp.skipped[why] = rp.skipped.get(why, 0) + 1


def _idle_s(prev: E.DecodeBatch | None, b: E.DecodeBatch) -> float:
    """Seconds between the end of the context's batch before and this one's start (another context's
    batches in between included: this context's graphs sat idle meanwhile)."""
    return 0.0 if prev is None else max(b.t_ns - (prev.t_ns + prev.duration_ns), 0) / 1e9


def _rows(b: E.DecodeBatch, next_pos: dict[int, int]) -> tuple[list[int], list[int], list[bool]]:
    """(positions, sequence ids, wants logits) per row, llama.cpp's defaults where the caller gave none. A
    row of several sequences (a shared prompt) is placed as its first sequence's."""
    n = len(b.tokens)
    seqs = [s[0] if s else 0 for s in b.seqs] if b.seqs is not None else [0] * n
    if b.positions is not None:
        pos = list(b.positions)
    else:
        base, pos = dict(next_pos), []
        for q in seqs:
            pos.append(base.get(q, 0))
            base[q] = pos[-1] + 1
    out = [False] * n
    for r in (b.outputs if b.outputs is not None else (n - 1,)):
        if 0 <= r < n:
            out[r] = True
    return pos, seqs, out


def _removals(pos: list[int], seqs: list[int], next_pos: dict[int, int], rollback: int = 0) -> tuple:
    """(removals, those that start a task): (seq, pos_min) of each sequence placed again at a position it holds
    (the caller's seq_rm(seq, pos_min, -1) before the batch), and of those the ones further back than
    `rollback` positions (ServerSettings.rollback); `next_pos` brought past the batch."""
    removes, starts = [], []
    for q in sorted(set(seqs)):
        p0 = min(p for p, s in zip(pos, seqs) if s == q)
        if p0 < next_pos.get(q, 0):
            removes.append((q, p0))
            if next_pos[q] - p0 > rollback:
                starts.append((q, p0))
        next_pos[q] = max(p for p, s in zip(pos, seqs) if s == q) + 1
    return tuple(removes), tuple(starts)


def _idle_clears(batches: list[tuple[list[int], list[int], tuple]], n_slots: int, rp: ReplayPlan) -> list[tuple]:
    """Per batch (positions, sequence ids, inferred removals that start a task), the (slot, 0) removals
    llama-server made before it and no batch shows. A task starts on a slot (its sequence id) where the
    slot's sequence is placed again at positions it held (further back than a speculative rollback:
    ServerSettings.rollback), or for the first time; the server (process_single_task, [TAG_IDLE_SLOT_CLEAR])
    then clears every slot not processing: seq_rm(slot, -1, -1), whose llama_kv_cache::seq_rm also moves the
    cache's head down to the first cell it freed, so the task's prompt and tokens take the lowest free cells
    again. A slot is processing while its task goes on: its sequence comes back in this batch or a later
    one without starting a task (a slot's last batch is the one whose sampled token ended its task: it is
    released in that same update_slots, before the next task is taken). The slots starting tasks in the
    batch are left to their own removals (the launched slot is processing; one launched beside it from a
    cached prefix of its own was not cleared, or it would not start past position 0 on cells it holds).

    Counted in `rp.restored`, not modelled: a slot starting a task past position 0 on no cells of its own
    (cleared while idle, or never used). The server found the prompt in its prompt cache and put its cells
    back (llama_state_seq_set_data: a contiguous run from the head, as many as the cached prompt held, then
    seq_rm(slot, n_past, -1)), a placement no batch shows. Nor is a slot whose own cells the server swapped for
    a cached prompt that matched better (its log's "found better prompt"): positions alone cannot tell it."""
    slots = range(n_slots)
    starts, seen = [], set()              # starts: per batch, slot -> its first position there
    for pos, seqs, removes in batches:
        new = ({r[0] for r in removes} | (set(seqs) - seen)) & set(slots)
        starts.append({q: min(p for p, x in zip(pos, seqs) if x == q) for q in new})
        seen.update(seqs)
    busy = _busy_slots([seqs for _, seqs, _ in batches], starts)
    out, holds = [], set()                # holds: slots with cells
    for k, (_, seqs, _) in enumerate(batches):
        cleared = sorted(q for q in holds if q not in busy[k] and q not in starts[k]) if starts[k] else []
        holds.difference_update(cleared)
        rp.restored += sum(1 for q, p0 in starts[k].items() if p0 > 0 and q not in holds)
        holds.update(q for q in seqs if q in slots)
        out.append(tuple((q, 0) for q in cleared))
    rp.idle_clears = sum(map(len, out))
    return out


def _busy_slots(seqs: list[list[int]], starts: list[dict]) -> list[frozenset]:
    """Per batch where a task starts, the sequences processing then: those whose next batch, from this one
    on, goes on with their task (does not start one)."""
    busy, going = [frozenset()] * len(seqs), {}          # going: sequence -> its next batch goes on
    for k in range(len(seqs) - 1, -1, -1):
        for q in set(seqs[k]):
            going[q] = q not in starts[k]
        if starts[k]:
            busy[k] = frozenset(q for q, on in going.items() if on)
    return busy


def _ubatches(b: E.DecodeBatch, rows: tuple, removes: tuple, idle_s: float, n_ubatch: int) -> list[StepPlan]:
    pos, seqs, out = rows
    steps = []
    for u0 in range(0, len(seqs), max(n_ubatch, 1)):
        u1 = min(u0 + n_ubatch, len(seqs))
        steps.append(StepPlan("ubatch", n_tokens=u1 - u0, n_outputs=sum(out[u0:u1]), offset=u0,
                              token_ids=tuple(b.tokens[u0:u1]), positions=tuple(pos[u0:u1]),
                              seq_ids=tuple(seqs[u0:u1]), idle_s=idle_s if u0 == 0 else 0.0,
                              removes=removes if u0 == 0 else ()))
    return steps

"""What a server operator asks of a trace: the same requests under other batching, as llama_decode batches.

Two transformations of a trace's batches (DecodeBatch, the replayed context's), each run through graphdiag's
runtime by `graphdiag whatif` (trace/replay.py) and summarised by report/analysis/server_whatif.py:

- `pad_batches`: each decode batch (every row an output, one row per sequence) padded up to the next bucket
  of the list (1, 2, 4, 8: as vLLM pads to its capture sizes) with rows of padding sequences of their own
  at position 0, outputs too, so every batch of a bucket has one shape; a batch past the largest bucket, or
  one with prompt rows, is left as it is. A padding sequence's cell is taken again by the next padded batch
  (its seq_rm, inferred by replay_plan) and computed for nothing: the padded tokens.
- `reschedule`: the trace's requests (each sequence's rows from its first or a restarted position: its
  prompt up to its first output row, then one row per generated token) served again by llama-server's
  loop with N slots: requests taken by free slots in arrival order; each iteration one row per generating
  slot (an output), then the prompt rows of slots still reading theirs up to n_batch, the prompt's last row
  an output; a request whose tokens are all decoded frees its slot. Time per batch is fitted to the trace's
  own llama_decode times (a + b x tokens); with no slot busy, the clock waits for the next arrival. A
  request waits for a free slot: with fewer slots the same requests take more, narrower batches. The
  server's startup warmup batch (before any request) stays first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import events as E
from ..plan import N_BATCH
from .replay_plan import _rows


def is_decode(b: E.DecodeBatch) -> bool:
    """Every row an output and each sequence's only row (a batch of sampled tokens)."""
    pos, seqs, out = _rows(b, {})
    return all(out) and len(set(seqs)) == len(seqs)


def pad_batches(batches: list[E.DecodeBatch], buckets: list[int]) -> tuple[list[E.DecodeBatch], int, int]:
    """(the batches with each decode batch padded to its bucket, batches padded, padding rows added)."""
    base = 1 + max((q for b in batches if b.seqs for s in b.seqs for q in s), default=0)
    out, padded, rows = [], 0, 0
    for b in batches:
        n = len(b.tokens)
        bucket = next((x for x in sorted(buckets) if x >= n), None)
        if not b.tokens or bucket is None or bucket == n or not is_decode(b):
            out.append(b)
            continue
        pos, seqs, _ = _rows(b, {})
        k = bucket - n
        out.append(replace(b, n_tokens=bucket, tokens=b.tokens + (0,) * k, positions=tuple(pos) + (0,) * k,
                           seqs=tuple((q,) for q in seqs) + tuple((base + j,) for j in range(k)),
                           outputs=tuple(range(bucket))))
        padded, rows = padded + 1, rows + k
    return out, padded, rows


@dataclass
class Request:
    """One request as the trace shows it: arrival (ns), prompt token ids, then the generated ones."""

    t_ns: int
    prompt: tuple
    generated: tuple


def requests(batches: list[E.DecodeBatch]) -> tuple[list[E.DecodeBatch], list[Request]]:
    """(the batches before the first request: the server's warmup, the requests in arrival order). A
    request is a sequence's rows from its first position or a position it held before (a new request in
    that slot); its prompt runs to its first output row."""
    warm = [batches[0]] if batches and (batches[0].positions is None or batches[0].seqs is None) else []
    reqs: list[Request] = []
    cur: dict[int, dict] = {}
    next_pos: dict[int, int] = {}
    for b in batches[len(warm):]:
        pos, seqs, out = _rows(b, next_pos)
        for tok, p, q, o in zip(b.tokens, pos, seqs, out):
            r = cur.get(q)
            if r is None or p < next_pos.get(q, 0):
                r = cur[q] = {"t": b.t_ns, "prompt": [], "gen": [], "reading": True}
                reqs.append(r)
            (r["prompt"] if r["reading"] else r["gen"]).append(tok)
            if o:
                r["reading"] = False
            next_pos[q] = p + 1
    out_reqs = [Request(r["t"], tuple(r["prompt"]), tuple(r["gen"])) for r in reqs]
    return warm, sorted(out_reqs, key=lambda r: r.t_ns)


def decode_time(batches: list[E.DecodeBatch]) -> tuple[float, float]:
    """(a ns, b ns per token): least squares over the trace's batches, neither below 0."""
    xs = [len(b.tokens) for b in batches]
    ys = [b.duration_ns for b in batches]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var, 0.0) if var else 0.0
    return max(my - slope * mx, 0.0), slope


def reschedule(batches: list[E.DecodeBatch], slots: int, n_batch: int = N_BATCH) -> list[E.DecodeBatch]:
    """The trace's requests served by `slots` slots, as llama_decode batches (see the module docstring)."""
    warm, waiting = requests(batches)
    return warm + serve(waiting, slots, decode_time(batches), batches[0].ctx, n_batch)


def serve(waiting: list[Request], slots: int, timing: tuple[float, float], ctx: int = 0,
          n_batch: int = N_BATCH, t_ns: int | None = None) -> list[E.DecodeBatch]:
    """llama-server's loop over `slots` slots for the requests (by arrival), as its llama_decode batches;
    `timing`: (a ns, b ns per token) of a batch; the clock starts at `t_ns` (default: the first arrival)."""
    waiting = list(waiting)
    a, per_token = timing
    t = t_ns if t_ns is not None else waiting[0].t_ns if waiting else 0
    out: list[E.DecodeBatch] = []
    busy: list[dict | None] = [None] * slots
    while waiting or any(busy):
        for i in range(slots):
            if busy[i] is None and waiting and waiting[0].t_ns <= t:
                r = waiting.pop(0)
                busy[i] = {"prompt": r.prompt, "gen": r.generated, "done": 0, "made": 0}
        if not any(busy):
            t = max(t, waiting[0].t_ns)
            continue
        rows = _iteration(busy, n_batch)
        toks, pos, seqs, outs = zip(*rows)
        dur = int(a + per_token * len(toks))
        out.append(E.DecodeBatch(step=-1, t_ns=t, ctx=ctx, n_tokens=len(toks), tokens=tuple(toks),
                                 positions=tuple(pos), seqs=tuple((q,) for q in seqs),
                                 outputs=tuple(i for i, o in enumerate(outs) if o), duration_ns=dur))
        t += dur + 1
        for i, s in enumerate(busy):
            if s is not None and s["done"] == len(s["prompt"]) and s["made"] >= len(s["gen"]):
                busy[i] = None
    return out


def _iteration(busy: list, n_batch: int) -> list[tuple[int, int, int, bool]]:
    """One llama-server iteration's rows (token, position, sequence, output): sampled tokens first."""
    rows = []
    for i, s in enumerate(busy):
        if s is not None and s["done"] == len(s["prompt"]) and s["made"] < len(s["gen"]):
            rows.append((s["gen"][s["made"]], s["done"] + s["made"], i, True))
            s["made"] += 1
    for i, s in enumerate(busy):
        while s is not None and s["done"] < len(s["prompt"]) and len(rows) < n_batch:
            s["done"] += 1
            rows.append((s["prompt"][s["done"] - 1], s["done"] - 1, i, s["done"] == len(s["prompt"])))
    return rows

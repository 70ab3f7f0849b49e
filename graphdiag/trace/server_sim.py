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
  an output; a request whose tokens are all decoded frees its slot. An iteration's time is fitted to the
  trace (decode_time: its llama_decode, a + b x tokens, and the server loop's gap before the next); with no
  slot busy, the clock waits for the next arrival (a request the recorded server had queued arrived with
  the one before it: requests). A request waits for a free slot: with fewer slots the same requests take
  more, narrower batches. The server's startup warmup batch (before any request) stays first. At the
  trace's own slot count, the recorded batches come back (the H100 trace: all 1263, size for size).
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


HANDOFF_BATCHES = 2   # a request starting this close behind its slot's previous one was queued for that slot


def requests(batches: list[E.DecodeBatch]) -> tuple[list[E.DecodeBatch], list[Request]]:
    """(the batches before the first request: the server's warmup, the requests in arrival order). A
    request is a sequence's rows from its first position or a position it held before (a new request in
    that slot); its prompt runs to its first output row. Its arrival is when the server started it, except
    for a request that took its slot at most HANDOFF_BATCHES batches after the slot's previous request
    ended: every slot was busy and it waited in the queue, since a time the trace does not show (a client
    sends before the server has a slot for it); it is taken as having arrived with the request before it,
    so it is served as soon as a slot frees, in the same order. (With arrivals at their recorded starts, 8
    clients on -np 4 served again with 4 slots made 2703 batches of mostly one or two tokens where the
    server made 1263 of four: every queued request then waited for the moment the recorded run freed its
    slot.)"""
    warm = [batches[0]] if batches and (batches[0].positions is None or batches[0].seqs is None) else []
    reqs: list[dict] = []
    cur: dict[int, dict] = {}
    next_pos: dict[int, int] = {}
    last_batch: dict[int, int] = {}
    for i, b in enumerate(batches[len(warm):]):
        pos, seqs, out = _rows(b, next_pos)
        for tok, p, q, o in zip(b.tokens, pos, seqs, out):
            r = cur.get(q)
            if r is None or p < next_pos.get(q, 0):
                queued = r is not None and bool(r["gen"]) and i - last_batch[q] <= HANDOFF_BATCHES
                r = cur[q] = {"t": b.t_ns, "prompt": [], "gen": [], "reading": True, "queued": queued}
                reqs.append(r)
            (r["prompt"] if r["reading"] else r["gen"]).append(tok)
            if o:
                r["reading"] = False
            next_pos[q], last_batch[q] = p + 1, i
    reqs.sort(key=lambda r: r["t"])
    out_reqs: list[Request] = []
    for r in reqs:
        t = out_reqs[-1].t_ns if r["queued"] and out_reqs else r["t"]
        out_reqs.append(Request(t, tuple(r["prompt"]), tuple(r["gen"])))
    return warm, out_reqs


SMALL_BATCH = 16    # tokens: a batch this small costs the launch-bound decode time, not per token


def decode_time(batches: list[E.DecodeBatch]) -> tuple[float, float, float]:
    """(a ns, b ns per token, gap ns) of one llama-server iteration, from the trace: a batch's llama_decode
    takes a + b x its tokens (a: the median of the batches of at most SMALL_BATCH tokens; b: least squares
    of the larger ones over a, at least 0), and the server's loop adds `gap` before its next llama_decode
    (sampling, streaming the tokens out: the median time from a batch's end to the next one's start where
    the next carries on a sequence of this one, so no idle wait is counted). Fitted on one line through
    every batch, the big prompts made a = 245 us where a one-token decode took 177 us, and without the
    gap (539 us median) the served requests ran 2.5 times faster than the recorded ones (H100 trace)."""
    small = sorted(b.duration_ns for b in batches if len(b.tokens) <= SMALL_BATCH)
    a = float(small[len(small) // 2]) if small else 0.0
    big = [(len(b.tokens), b.duration_ns - a) for b in batches if len(b.tokens) > SMALL_BATCH]
    sxx = sum(x * x for x, _ in big)
    per_token = max(sum(x * y for x, y in big) / sxx, 0.0) if sxx else 0.0
    if not small:                   # prompts only: a line through them
        a, per_token = 0.0, max(sum(y / x for x, y in big) / len(big), 0.0) if big else 0.0
    gaps = sorted(n.t_ns - (b.t_ns + b.duration_ns) for b, n in zip(batches, batches[1:])
                  if _continues(b, n) and n.t_ns >= b.t_ns + b.duration_ns)
    return a, per_token, float(gaps[len(gaps) // 2]) if gaps else 0.0


def _continues(b: E.DecodeBatch, n: E.DecodeBatch) -> bool:
    """Whether batch n carries on a sequence batch b decoded (its next position): the server was busy."""
    if b.positions is None or n.positions is None or b.seqs is None or n.seqs is None:
        return False
    last = {}
    for p, s in zip(b.positions, b.seqs):
        for q in s:
            last[q] = max(last.get(q, -1), p)
    return any(last.get(q) == p - 1 for p, s in zip(n.positions, n.seqs) for q in s)


def reschedule(batches: list[E.DecodeBatch], slots: int, n_batch: int = N_BATCH) -> list[E.DecodeBatch]:
    """The trace's requests served by `slots` slots, as llama_decode batches (see the module docstring)."""
    warm, waiting = requests(batches)
    return warm + serve(waiting, slots, decode_time(batches), batches[0].ctx, n_batch)


def serve(waiting: list[Request], slots: int, timing: tuple[float, float, float], ctx: int = 0,
          n_batch: int = N_BATCH, t_ns: int | None = None) -> list[E.DecodeBatch]:
    """llama-server's loop over `slots` slots for the requests (by arrival), as its llama_decode batches;
    `timing`: (a ns, b ns per token, the loop's gap ns) of an iteration (decode_time); the clock starts at
    `t_ns` (default: the first arrival)."""
    waiting = list(waiting)
    a, per_token, gap = timing
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
        t += dur + int(gap) + 1
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

"""Write a SYNTHETIC llama-server-like raw trace (tests/data/trace/server-np4.raw.jsonl): not a recording.

    PYTHONPATH=. python tools/synth_server_trace.py tiny.gguf tests/data/trace/server-np4.raw.jsonl

The requests are drawn (seed 48) and served as llama-server 0c1e57098 serves them with 4 slots (-np 4 -kvu,
n_batch 2048, n_ubatch 512; graphdiag/trace/server_sim.serve): its warmup decode first (positions,
sequences and logits left NULL), then requests arriving at drawn times into free slots, each iteration one
sampled token per generating slot (an output) and then prompt tokens of slots still processing theirs, up to
n_batch, the prompt's last token an output; a slot whose request ends is idle until the next request takes
it (its sequence then placed again from position 0: the server's seq_rm; its cells cleared already where
another request started meanwhile: the server's idle-slot clear, inferred by the replay); one pause of 12 s
(ggml's idle sweep evicts). The graph calls are graphdiag's
decisions for those batches on the given GGUF (its replay, simulated driver), written as llama.cpp's
CUDA backend makes them (ggml-cuda.cu: uid and warmup log lines, BeginCapture … EndCapture, Instantiate for
a new entry, ExecUpdate on every capture, a refusal's ExecDestroy and new Instantiate, Launch, and the idle
sweep's ExecDestroy) with one difference llama.cpp has: a captured graph holding the token embedding has one
node fewer (llama.cpp keeps that GET_ROWS on the CPU; known.py's graph-nodes). So a replay of this file
compares equal by construction, the known difference excused: it holds the replay's pipeline, not
graphdiag's fidelity, which only a real recording (the lead's, from the H100) can.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from graphdiag import events as E
from graphdiag.backends.drivers.base import UpdateResult
from graphdiag.report.analysis.known import embedding_captures
from graphdiag.trace.server_sim import Request, serve

CMD = ["llama-server", "-m", "tiny.gguf", "-np", "4", "-kvu", "-ngl", "99", "-v"]
PID, TID, STREAM, SLOTS, N_BATCH, CTX = 4100, 4101, 13, 4, 2048, 0x5A5A000
LOG = "ggml_backend_cuda_graph_compute: "


def drawn_requests(rng: random.Random, vocab: int) -> list[Request]:
    """The requests by arrival (ns from 0); one long prompt (two ubatches), one 12 s pause before the 8th."""
    out, t = [], 0.05
    for i in range(11):
        t += rng.choice((0.0, 0.001, 0.002, 0.004, 0.02))
        if i == 7:
            t += 12.0                                  # a pause: the idle sweep evicts
        prompt = 700 if i == 3 else rng.randint(4, 90)
        n_gen = rng.randint(10, 50)
        out.append(Request(int(t * 1e9), tuple(rng.randint(3, vocab - 1) for _ in range(prompt)),
                           tuple(rng.randint(3, vocab - 1) for _ in range(n_gen))))
    return out


def batches(rng: random.Random, vocab: int) -> list[dict]:
    """The batch lines (t0/t1 in ns) of the whole run, starting with llama-server's warmup decode, the
    requests then served by server_sim.serve (llama-server's loop) with 4 slots."""
    t0 = 1_000_000_000
    warm = E.DecodeBatch(step=-1, t_ns=t0, ctx=CTX, n_tokens=2, tokens=(1, 2), duration_ns=404_000)
    reqs = [Request(r.t_ns + t0 + 500_000, r.prompt, r.generated) for r in drawn_requests(rng, vocab)]
    served = [warm] + serve(reqs, SLOTS, (400_000, 2_000), CTX, N_BATCH)
    return [{"ev": "batch", "pid": PID, "tid": TID, "ctx": b.ctx, "t0_ns": b.t_ns, "t1_ns": b.t_ns + b.duration_ns,
             "ret": 0, "n_tokens": b.n_tokens, "tokens": list(b.tokens),
             "pos": None if b.positions is None else list(b.positions),
             "seq": None if b.seqs is None else [list(q) for q in b.seqs],
             "out": None if b.outputs is None else list(b.outputs)} for b in served]


class Writer:
    """graphdiag's replay events -> the raw api/log lines llama.cpp's CUDA backend would have made."""

    def __init__(self):
        self.lines: list[dict] = []
        self.ids = 100
        self.exec_of: dict[int, int] = {}              # key -> live exec
        self.graph: int = 0

    def _id(self) -> int:
        self.ids += 1
        return self.ids

    def api(self, t: int, fn: str, **kw) -> None:
        self.lines.append({"ev": "api", "fn": fn, "api": "runtime", "pid": PID, "tid": TID, "device": 0, "t0_ns": t,
                           "t1_ns": t + kw.pop("dur", 4_000), "ret": kw.pop("ret", 0), **kw})

    def log(self, t: int, text: str) -> None:
        self.lines.append({"ev": "log", "t_ns": t, "text": LOG + text})

    def step(self, evs: list[E.Event], t: int, embedding: list[bool]) -> None:
        """One graphdiag step's decisions between t and the batch's end."""
        caps = iter(embedding)
        for ev in evs:
            t += 10_000
            if isinstance(ev, E.Evicted) and ev.key in self.exec_of:
                self.api(t, "cudaGraphExecDestroy", exec=self.exec_of.pop(ev.key))
            elif isinstance(ev, E.UidHit):
                self.lines.append({"ev": "log", "t_ns": t, "text": f"CUDA Graph id {ev.uid} reused"})
            elif isinstance(ev, E.WarmupTransition):
                self.log(t, "CUDA graph warmup " + ("complete" if ev.to_state == "warm" else "reset"))
            elif isinstance(ev, E.ChunkCaptured):
                self.graph = self._id()
                nodes = ev.n_graph_nodes - (1 if next(caps, False) else 0)
                self.api(t, "cudaStreamBeginCapture", stream=STREAM)
                self.api(t + 5_000, "cudaStreamEndCapture", stream=STREAM, dur=40_000, graph=self.graph, nodes=nodes,
                         kernel_nodes=nodes)
            elif isinstance(ev, E.ChunkInstantiated):
                x = self.exec_of[ev.key] = self._id()
                self.api(t, "cudaGraphInstantiate", dur=300_000, graph=self.graph, exec=x,
                         mem_free_before=80 << 30, mem_free_after=(80 << 30) - (2 << 20))
            elif isinstance(ev, E.ChunkUpdated):
                self.api(t, "cudaGraphExecUpdate", graph=self.graph, exec=self.exec_of[ev.key], update_result=0,
                         error_node=False)
            elif isinstance(ev, E.UpdateRefused):
                x = self.exec_of[ev.key]
                self.api(t, "cudaGraphExecUpdate", ret=910, graph=self.graph, exec=x,
                         update_result=int(UpdateResult[ev.reason]), error_node=False)
                self.api(t + 6_000, "cudaGraphExecDestroy", exec=x)
            elif isinstance(ev, (E.CaptureRun, E.ReplayLaunched)):
                self.api(t, "cudaGraphLaunch", stream=STREAM, exec=self.exec_of[ev.key])
                self.api(t + 6_000, "cudaStreamSynchronize", stream=STREAM)


def write(model: str, out: Path, seed: int = 48) -> None:
    from graphdiag.model.source import model_config
    from graphdiag.trace.replay import run_replay
    rng = random.Random(seed)
    head = {"raw": "graphdiag-trace", "version": 1, "cmd": CMD, "started": "2026-12-06T12:00:00",
            "synthetic": "SYNTHETIC, not a recording: tools/synth_server_trace.py (seed 48) drew llama-server's "
                         "batches and wrote graphdiag's own decisions for them as llama.cpp's graph calls; a replay "
                         "of it compares equal by construction"}
    blines = batches(rng, model_config(model).n_vocab)
    raw = [head, {"ev": "start", "pid": PID, "t0_ns": 999_000_000, "text": "libcupti.so"}, *blines,
           {"ev": "end", "t_ns": blines[-1]["t1_ns"] + 1_000_000, "status": "complete", "code": 0}]
    tmp = out.with_suffix(".batches.tmp")
    tmp.write_text("".join(json.dumps(x) + "\n" for x in raw))
    try:
        rp = run_replay(tmp, model, "sim")
    finally:
        tmp.unlink()
    events = rp.ours[1]
    emb = embedding_captures(events)
    w = Writer()
    for b_line, (first, count) in zip(blines, rp.plan.step_range):
        span = (b_line["t1_ns"] - b_line["t0_ns"]) // max(count, 1)
        for k in range(count):
            s = first + k
            w.step([e for e in events if e.step == s], b_line["t0_ns"] + k * span, emb.get(s, []))
    t_end = raw[-1]["t_ns"] - 500_000
    for x in sorted(w.exec_of.values()):
        w.api(t_end, "cudaGraphExecDestroy", exec=x)
    raw[-1:-1] = w.lines
    out.write_text("".join(json.dumps(x) + "\n" for x in raw))
    print(f"wrote {out}: {len(blines)} batches, {rp.plan.step_range[-1][0] + rp.plan.step_range[-1][1]} ubatches, "
          f"{sum(x['ev'] == 'api' for x in w.lines)} graph calls")


if __name__ == "__main__":
    write(sys.argv[1], Path(sys.argv[2]))

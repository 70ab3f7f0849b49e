"""whatif --pad-batches and --slots on a server trace (the CPU, simulated driver): padding makes the decode batches
of a bucket one shape at the cost of padded tokens; the same requests under N slots make narrower or wider
batches; each run's captures, refusals and graph memory per 1000 tokens; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.trace.replay_plan import replay_plan
from graphdiag.trace.server_sim import pad_batches, requests, reschedule

DATA = Path(__file__).resolve().parents[1] / "data" / "trace"
TRACE = DATA / "server-np4.raw.jsonl"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    assert main(["export-gguf", "--model", "tiny", str(p)]) == 0
    return str(p)


def _b(tokens, pos, seqs, out, t=0, dur=100) -> E.DecodeBatch:
    return E.DecodeBatch(step=-1, t_ns=t, ctx=1, n_tokens=len(tokens), tokens=tuple(tokens), positions=tuple(pos),
                         seqs=tuple((q,) for q in seqs), outputs=tuple(out), duration_ns=dur)


def test_decode_batches_pad_to_their_bucket():
    dec = _b([5, 6, 7], [9, 4, 2], [0, 1, 2], [0, 1, 2])
    mixed = _b([5, 6, 7], [10, 0, 1], [0, 3, 3], [0, 2])                 # a prompt beside a decode: as it is
    wide = _b([1] * 9, list(range(9)), list(range(9)), list(range(9)))  # past the largest bucket: as it is
    out, n, rows = pad_batches([dec, mixed, wide], [1, 2, 4, 8])
    assert (n, rows) == (1, 1) and out[1:] == [mixed, wide]
    p = out[0]
    assert p.tokens == (5, 6, 7, 0) and p.positions == (9, 4, 2, 0) and p.outputs == (0, 1, 2, 3)
    assert p.seqs == ((0,), (1,), (2,), (9,))                            # a padding sequence of its own
    again = replay_plan([p, p], 4096).steps[1]
    assert (9, 0) in again.removes                                       # its cell taken again, not a new one


def test_requests_under_one_slot_are_served_one_at_a_time():
    bs = [_b([1, 2, 3, 4], [0, 1, 0, 1], [0, 0, 1, 1], [1, 3], t=0),
          _b([7, 8], [2, 2], [0, 1], [0, 1], t=1000), _b([9], [3], [0], [0], t=2000),
          _b([5, 6], [0, 1], [1, 1], [1], t=3000)]                      # seq 1 again from 0: a new request
    _, reqs = requests(bs)
    assert [(r.prompt, r.generated) for r in reqs] == [((1, 2), (7, 9)), ((3, 4), (8,)), ((5, 6), ())]
    one = reschedule(bs, 1)
    assert all(len({s for (s,) in b.seqs}) == 1 for b in one)
    assert sum(b.n_tokens for b in one) == sum(b.n_tokens for b in bs)
    assert [b.tokens for b in one][:3] == [(1, 2), (7,), (9,)]
    two = reschedule(bs, 2)
    assert two[0].tokens == (1, 2, 3, 4) and two[0].outputs == (1, 3)


def test_the_recorded_servers_own_slots_serve_its_requests_in_its_own_batches():
    """llama-server -np 4 under 8 clients (H100 trace, 1263 batches): served again by 4 slots, the same batch
    sizes in the same order, so whatif's -np 4 column is the recorded one. Its timing carries the server
    loop's gap between decodes, and a request that took a slot right behind the slot's previous one was
    queued: with the recorded starts as arrivals and no gap, 2703 narrower batches."""
    from graphdiag.trace.replay import load_trace
    from graphdiag.trace.replay_plan import trace_batches
    from graphdiag.trace.server_sim import decode_time
    _, events = load_trace(DATA / "server-e2e-h100.raw.jsonl")
    bs = [b for b in trace_batches(events) if b.ret == 0]
    again = reschedule(bs, 4)
    assert [b.n_tokens for b in again] == [b.n_tokens for b in bs]
    a, per_token, gap = decode_time(bs)
    assert 150_000 < a < 200_000 and 400_000 < gap < 700_000     # one-token decode 177 us, the loop 539 us
    assert len(reschedule(bs, 8)) < len(bs) < len(reschedule(bs, 2))


def test_pad_batches_cli(tiny, capsys):
    assert main(["whatif", str(TRACE), "--pad-batches", "1,2,4,8", "--model", tiny, "--backend", "sim",
                 "--json"]) == 0
    w = json.loads(capsys.readouterr().out)
    base, pad = w["outcomes"]
    assert w["padded_batches"] > 0 and pad["padded_tokens"] > 0
    assert pad["tokens"] == base["tokens"] + pad["padded_tokens"] and base["batches"] == pad["batches"]
    assert base["captures"] >= 1 and "captures_per_1000_tokens" in pad
    assert main(["whatif", str(TRACE), "--pad-batches", "1,2,4,8", "--model", tiny, "--backend", "sim"]) == 0
    out = capsys.readouterr().out
    assert "padded 1,2,4,8" in out and "padded tokens computed" in out and "saved:" in out


def test_slots_cli_on_a_replay_record(tiny, tmp_path, capsys):
    rec = tmp_path / "r.jsonl"
    assert main(["replay", str(TRACE), "--model", tiny, "--backend", "sim", "--events", str(rec)]) == 0
    capsys.readouterr()
    assert main(["whatif", str(rec), "--slots", "1,2,4,8", "--backend", "sim", "--json"]) == 0   # its model
    w = json.loads(capsys.readouterr().out)
    labels = [o["label"] for o in w["outcomes"]]
    assert labels == ["as recorded", "-np 1", "-np 2", "-np 4", "-np 8"] and w["requests"] == 11
    assert len({o["tokens"] for o in w["outcomes"]}) == 1                # the same requests, the same tokens
    batches = [o["batches"] for o in w["outcomes"][1:]]
    assert batches[0] > batches[1] >= batches[2] >= batches[3]           # more slots, fewer wider batches
    assert all("refusals_per_1000_tokens" in o and "graph_bytes_per_1000_tokens" in o for o in w["outcomes"])


def test_bad_input_is_one_line(tiny, tmp_path, capsys):
    cases = [
        (["whatif", str(TRACE), "--slots", "1,2"], "give --model FILE.gguf"),
        (["whatif", str(TRACE), "--slots", "1", "--key", "first-node"], "give one of --key"),
        (["whatif", str(TRACE)], "give one of --key"),
        (["whatif", str(DATA / "llama-batch.raw.jsonl"), "--pad-batches", "1,2", "--model", tiny],
         "no llama_decode batches in this trace"),
        (["whatif", str(TRACE), "--pad-batches", "0,2", "--model", tiny], "batch sizes >= 1"),
    ]
    for argv, want in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert want in err and "\n" not in err, (argv, err)


def _speculative(tmp_path: Path) -> tuple[Path, list[int]]:
    """A llama-server run with a draft model, as its batches, shaped as llama.cpp 0c1e57098's and b11434's
    server-context.cpp and common/speculative.cpp (draft-simple) make them: each context's warmup; the
    target's prompt and the draft's copy of it; then per draft step of k drafts, k one-row draft batches
    (the last sampled token, then each drafted one; every row an output), the target's verify batch of
    k + 1 rows (every row an output), and the draft's re-evaluation of it (the same rows, the last an
    output). Each step accepts nothing: the next one starts one position further."""
    head = {"raw": "graphdiag-trace", "version": 1, "cmd": ["llama-server", "-m", "t.gguf", "-md", "d.gguf"],
            "synthetic": "hand-made for the test"}
    lines, t = [], 1000

    def batch(ctx, toks, pos=None, seqs=None, out=None):
        nonlocal t
        lines.append({"ev": "batch", "pid": 1, "tid": 1, "ctx": ctx, "t0_ns": t, "t1_ns": t + 500, "ret": 0,
                      "n_tokens": len(toks), "tokens": toks, "pos": pos, "seq": seqs, "out": out})
        t += 1000
    batch(0xA, [1, 2])
    batch(0xB, [1, 2])
    prompt = list(range(3, 23))
    batch(0xA, prompt, list(range(20)), [[0]] * 20, [19])
    batch(0xB, prompt, list(range(20)), [[0]] * 20, [19])
    n, sizes = 20, []
    for k in (3, 3, 2, 3, 3, 1, 3):
        rows = [7, 8, 9, 10][:k + 1]
        for j in range(k):
            batch(0xB, [rows[j]], [n + j], [[0]], [0])
        verify = (rows, list(range(n, n + k + 1)), [[0]] * (k + 1))
        batch(0xA, *verify, list(range(k + 1)))
        batch(0xB, *verify, [k])
        sizes.append(k + 1)
        n += 1
    p = tmp_path / "spec.raw.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in [head, *lines]))
    return p, sizes


def test_draft_model_warmup_cycle(tiny, tmp_path, capsys):
    p, sizes = _speculative(tmp_path)
    assert main(["whatif", str(p), "--model", tiny, "--model-draft", tiny, "--backend", "sim", "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["draft_steps"] == len(sizes) and c["verify_sizes"] == {"4": 5, "3": 1, "2": 1}
    assert c["target"].get("eager (warmup reset)", 0) >= 2      # the verify width changes: warmup resets
    assert sum(c["target"].values()) == len(sizes)             # one compute per verify batch
    assert sum(c["draft"].values()) == sum(s - 1 for s in sizes)
    assert sum(c["reeval"].values()) == len(sizes)             # the draft's copy of each verify batch
    assert main(["whatif", str(p), "--model", tiny, "--model-draft", tiny, "--backend", "sim"]) == 0
    out = capsys.readouterr().out
    assert "draft steps: 7" in out and "target verifying, computes per draft step:" in out
    assert "→ target verifies 4" in out and "→ draft re-evaluates 4" in out
    assert main(["whatif", str(TRACE), "--model", tiny, "--model-draft", tiny, "--backend", "sim"]) == 2
    assert "no draft model's batches" in capsys.readouterr().err


SPEC_CPU = DATA / "cpu-server-spec-0c1e.raw.jsonl.xz"


@pytest.mark.parametrize("name", ["cpu-server-spec-0c1e.raw.jsonl.xz", "cpu-server-spec-b11434.raw.jsonl.xz"])
def test_a_real_speculative_server_trace_recaptures_the_draft_every_step(tmp_path, capsys, name):
    """llama-server 0c1e57098 and b11434 (CPU builds, no CUDA: the batches alone were recorded, graphdiag
    trace's library preloaded) with tiny F16 as target and draft, --spec-type draft-simple, -np 4 -kvu, under
    graphdiag load (8 clients, 16 requests, prompts 16-600 tokens). Replayed on the simulated driver: the
    draft context alternates one row per slot (drafting) with the verify batch's width (re-evaluating it,
    upstream's TAG_SPEC_AVOID_DRAFT_REEVAL), so its warmup is reset and its graph captured again in nearly
    every step."""
    gguf = tmp_path / "tiny-f16.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", "f16", str(gguf)]) == 0
    capsys.readouterr()
    argv = ["whatif", str(DATA / name), "--model", str(gguf), "--model-draft", str(gguf), "--backend", "sim"]
    assert main([*argv, "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    steps = c["draft_steps"]
    assert steps >= 300 and max(c["verify_sizes"], key=c["verify_sizes"].get) == "16"   # 4 slots x (3 + 1)
    assert c["reeval"]["eager (warmup reset)"] >= 0.9 * steps
    assert c["draft"]["capture"] >= 0.9 * steps
    assert c["target"]["replay"] >= 0.7 * steps               # the target's verify graph is reused
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "draft context recaptured its graph" in out and "TAG_SPEC_AVOID_DRAFT_REEVAL" in out
    assert "→ draft re-evaluates 16 [eager (warmup reset)]" in out


def test_a_trace_without_cuda_is_reported_and_not_compared(tmp_path, capsys):
    """A CPU build's trace has batches and no graph calls: report says so; replay refuses to compare (one
    line, exit 2) and names what replays them."""
    assert main(["report", str(SPEC_CPU)]) == 0
    out = capsys.readouterr().out
    assert "no CUDA: " in out and "never initialised CUDA" in out and "llama_decode batches were recorded" in out
    assert main(["replay", str(SPEC_CPU), "--model", str(tmp_path / "x.gguf"), "--backend", "sim"]) == 2
    err = capsys.readouterr().err.strip()
    assert "never initialised CUDA" in err and "whatif" in err and "\n" not in err


def test_a_draft_context_that_drafted_nothing_says_so(tiny, tmp_path, capsys):
    """llama-server b11434 with -md and no --spec-type loads the draft model, warms its context up once and
    never drafts (H100, 2026-12-07: 1264 target batches, 1 draft batch): one line, exit 2, naming the flag."""
    p, _ = _speculative(tmp_path)
    lines = p.read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if '"ctx": 11' in ln)
    kept = [ln for i, ln in enumerate(lines) if '"ctx": 11' not in ln or i == first]   # 0xB's warmup alone
    assert len(kept) < len(lines)
    p.write_text("\n".join(kept) + "\n")
    assert main(["whatif", str(p), "--model", tiny, "--model-draft", tiny, "--backend", "sim"]) == 2
    err = capsys.readouterr().err.strip()
    assert "decoded 1 batch and drafted nothing" in err and "--spec-type draft-simple" in err and "\n" not in err


"""Renders an operator what-if (trace/operator.py): the runs side by side, counts and per 1000 tokens."""

from __future__ import annotations

from typing import TextIO

ROWS = (("batches", "llama_decode batches"), ("tokens", "tokens computed"), ("padded_tokens", "padded tokens"),
        ("captures", "captures"), ("recaptures", "recaptures"), ("refusals", "update refusals"),
        ("eager", "eager computes"), ("warmup_resets", "warmup resets"), ("replays", "replays"),
        ("graph_bytes", "graph memory instantiated"), ("peak_graph_bytes", "graph memory peak"))
PER_1000 = (("captures", "captures / 1000 tokens"), ("recaptures", "recaptures / 1000 tokens"),
            ("refusals", "refusals / 1000 tokens"), ("graph_bytes", "graph KiB / 1000 tokens"))


def render_server_whatif(w, out: TextIO) -> None:
    out.write(f"whatif {w.source}: {w.question}\n")
    out.write(f"graphdiag's runtime on {w.model} ({w.device})" + (f"; {w.requests} requests" if w.requests else "")
              + "\n")
    names = [o.label for o in w.outcomes]
    width = max(12, *(len(n) + 2 for n in names))
    out.write(f"{'':28}" + "".join(f"{n:>{width}}" for n in names) + "\n")
    for attr, label in ROWS:
        out.write(f"{label:28}" + "".join(f"{getattr(o, attr):>{width},}" for o in w.outcomes) + "\n")
    for attr, label in PER_1000:
        scale = 1024 if attr == "graph_bytes" else 1
        out.write(f"{label:28}" + "".join(f"{o.per_1000(attr) / scale:>{width}.2f}" for o in w.outcomes) + "\n")
    if w.padded_batches:
        base, pad = w.outcomes[0], w.outcomes[1]
        out.write(f"padding: {w.padded_batches} decode batches padded, {pad.padded_tokens} padded tokens computed "
                  f"({100 * pad.padded_tokens / max(pad.tokens, 1):.1f} % of the tokens); saved: "
                  f"{base.captures - pad.captures} captures, {base.recaptures - pad.recaptures} recaptures, "
                  f"{base.refusals - pad.refusals} refusals, {base.eager - pad.eager} eager computes\n")

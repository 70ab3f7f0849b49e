"""Each step of graphdiag's plan as a llama_batch's contents: tokens, positions, sequence ids, logits flags.

The same steps as `graphdiag run` walks (plan.py): one llama_decode per step, so decode index i is
graphdiag's step i. A prefill ubatch puts its part of its sequence's prompt at the next positions and asks
for the last token's logits when it is the prompt's last ubatch (graphdiag's prefill has one output, the
ubatches before it none, plan.py); a decode step gives each of sequences 0..batch-1 one
token at its next position, every token an output. Prompt tokens are drawn as graphdiag's Stepper draws
them (default_rng(seed + 1), ids 1..n_vocab-1) unless --prompt-ids gives them; a decode feeds each
sequence its greedy token from the step before (1 + seq before it has one). A sequence that joins later
starts at position 0, as in graphdiag's context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import StepPlan


@dataclass(frozen=True)
class StepBatch:
    """One llama_decode's batch. outputs: batch indices whose logits are read (greedy tokens)."""

    kind: str
    tokens: tuple[int, ...]
    pos: tuple[int, ...]
    seqs: tuple[int, ...]
    logits: tuple[bool, ...]
    idle_s: float = 0.0

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_seqs(self) -> int:
        return len(set(self.seqs))

    @property
    def outputs(self) -> list[int]:
        return [i for i, f in enumerate(self.logits) if f]

    def to_dict(self) -> dict:
        """The raw header's plan entry (tokens left out: the record carries what was decoded, not the ids)."""
        return {"kind": self.kind, "n_tokens": self.n_tokens, "seqs": sorted(set(self.seqs)),
                "pos0": min(self.pos), "idle_s": self.idle_s}


class Batcher:
    """Turns StepPlans into StepBatches, keeping each sequence's next position and next token."""

    def __init__(self, cfg, n_vocab: int):
        self.cfg, self.n_vocab = cfg, n_vocab
        self.rng = np.random.default_rng(cfg.seed + 1)
        self.next_pos: dict[int, int] = {}
        self.next_tok: dict[int, int] = {}
        self.step = 0

    def batch(self, p: StepPlan) -> StepBatch:
        """The batch of the plan's next step (positions advance as if it was decoded)."""
        if p.kind == "prefill":
            if self.cfg.prompt_ids and p.initial:
                toks = [int(t) for t in self.cfg.prompt_ids[p.offset:p.offset + p.n_tokens]]
            else:
                toks = self.rng.integers(1, self.n_vocab, p.n_tokens).tolist()
            seqs = [p.seq] * len(toks)
            flags = [False] * (len(toks) - 1) + [bool(p.n_outputs)]
        else:
            seqs = list(range(p.batch))
            toks = [self.next_tok.get(q, 1 + q) for q in seqs]
            flags = [True] * len(seqs)
        pos = []
        for q in seqs:
            pos.append(self.next_pos.get(q, 0))
            self.next_pos[q] = pos[-1] + 1
        self.step += 1
        return StepBatch(p.kind, tuple(toks), tuple(pos), tuple(seqs), tuple(flags), p.idle_s)

    def took(self, b: StepBatch, tokens: list[int]) -> None:
        """The greedy tokens the step produced, one per output, in output order."""
        for i, t in zip(b.outputs, tokens):
            self.next_tok[b.seqs[i]] = int(t)

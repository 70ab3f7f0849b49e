"""The requests of a run, drawn before any is sent: prompt and output lengths from the seeded ranges, the
prompt text (synthetic, or a prompts file's lines in turn), and how the prompt length is known.

Without a tokenizer the lengths are approximate: synthetic prompts are common short English words, about one
token a word in the BPE vocabularies llama.cpp models use; a file's prompt counts one token per 4 characters.
Where the server tokenizes (llama-server's /tokenize), `size_exactly` makes each synthetic prompt exactly its
drawn length (the completions endpoint is sent the token ids themselves) and counts a file's prompts exactly."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Callable, Sequence

# short words that are one token each in common BPE vocabularies (with their leading space)
WORDS = ("the", "time", "people", "year", "way", "day", "man", "thing", "woman", "life", "child", "world",
         "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place",
         "case", "week", "company", "system", "program", "question", "work", "number", "night", "point",
         "home", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study",
         "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service",
         "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "name",
         "team", "minute", "idea", "kid", "body", "back", "parent", "face", "others", "level", "office",
         "door", "health", "person", "art", "war", "history", "party", "result", "change", "morning",
         "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education", "green",
         "small", "large", "good", "new", "old", "great", "high", "long", "little", "own", "other", "big")


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send: `prompt` text (and `prompt_ids` where the server sized it in tokens),
    `prompt_tokens` (exact when `exact`, else approximate) and `max_tokens` for the output."""

    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int
    exact: bool = False
    prompt_ids: tuple[int, ...] | None = None
    synthetic: bool = True


def synthetic_text(n_words: int, rng: random.Random) -> str:
    """n_words words drawn from WORDS (a capitalised first word, no punctuation)."""
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize()


def approx_tokens(text: str) -> int:
    """A prompt file line's approximate token count: one a 4 characters, at least one."""
    return max(1, math.ceil(len(text) / 4))


def plan_requests(n: int, prompt_range: tuple[int, int], output_range: tuple[int, int], seed: int,
                  prompts: Sequence[str] | None = None) -> list[PlannedRequest]:
    """n requests: output lengths drawn from `output_range`; prompts drawn from `prompt_range` as synthetic
    text (one word a token, approximately) or, given `prompts`, the file's lines in turn. The same seed gives
    the same requests."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        max_tokens = rng.randint(*output_range)
        if prompts:
            text = prompts[i % len(prompts)]
            out.append(PlannedRequest(i, text, approx_tokens(text), max_tokens, synthetic=False))
        else:
            k = rng.randint(*prompt_range)
            out.append(PlannedRequest(i, synthetic_text(k, random.Random(rng.getrandbits(64))), k, max_tokens))
    return out


def size_exactly(plan: Sequence[PlannedRequest], tokenize: Callable[[str], list[int]],
                 detokenize: Callable[[list[int]], str] | None, seed: int) -> list[PlannedRequest]:
    """Each synthetic prompt made exactly its drawn length in the server's tokens: text tokenized, extended
    while short, cut to length (`prompt_ids`; with `detokenize`, the text rebuilt from the cut ids, for the
    chat endpoint which takes text only). A file's prompt is counted, not changed."""
    rng = random.Random(seed ^ 0x5EED)
    out = []
    for r in plan:
        if not r.synthetic:
            out.append(replace(r, prompt_tokens=len(tokenize(r.prompt)), exact=True))
            continue
        text, ids = r.prompt, tokenize(r.prompt)
        while len(ids) < r.prompt_tokens:          # words of more than one token are the usual case: rarely runs
            text += " " + synthetic_text(r.prompt_tokens - len(ids), rng).lower()
            ids = tokenize(text)
        ids = ids[:r.prompt_tokens]
        text = detokenize(ids) if detokenize else text
        out.append(replace(r, prompt=text, prompt_ids=tuple(ids), exact=True))
    return out

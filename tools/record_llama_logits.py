"""Record llama.cpp's own logits for a prompt (a fixture the oracle is held against).

    python tools/record_llama_logits.py MODEL.gguf --tokens 160 --rows 0,5,127,128,159 --out tests/data/NAME.npz

One llama_eval of `--tokens` prompt tokens (ids (37 i + 11) mod 4000 + 3, positions 0.., one sequence, every
token's logits) with flash attention on, n_ctx 4096 and llama-cpp-python's defaults otherwise (a full-size SWA
cache); the logits of `--rows` are written, float32, with the token ids (`tokens`, `rows`, `logits`). Runs on
the CPU build of llama-cpp-python 0.3.36 (llama.cpp 0c1e57098), put on PYTHONPATH for this tool only.
"""

from __future__ import annotations

import argparse

import numpy as np


def prompt(n: int) -> list[int]:
    """The recorded prompt: n ids spread over the vocabulary's first 4003 ids (none of the first three)."""
    return [(37 * i + 11) % 4000 + 3 for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--rows", default="0,5,127,128,159")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from llama_cpp import Llama
    llm = Llama(model_path=a.model, n_ctx=4096, flash_attn=True, logits_all=True, verbose=False)
    toks = prompt(a.tokens)
    llm.eval(toks)
    rows = np.array([int(r) for r in a.rows.split(",")])
    logits = np.array(llm.scores[: len(toks)], dtype=np.float32)[rows]
    np.savez_compressed(a.out, tokens=np.array(toks, np.int32), rows=rows, logits=logits)
    print(f"wrote {a.out}: rows {rows.tolist()} of {len(toks)} tokens")


if __name__ == "__main__":
    main()

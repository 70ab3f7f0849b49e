"""The known differences between graphdiag and real llama.cpp 0c1e57098, each an exact predicate on the one
pair of differing decisions it excuses (observed_diff.diff_observed's `excuse` hook).

A pair is excused only where the predicate holds for exactly that pair (graphdiag's decision, llama.cpp's,
at the same step and place); the comparison then goes on with the next decision of every kind, so a known
difference hides nothing after it. Each entry says what it claims and the evidence for it; the tests that
hold graphdiag against llama.cpp report an entry no pair met (`Excuser.unmet`), so the list stays honest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ... import events as E
from .observed_diff import Decision

# ggml_cuda_should_use_mmvf on Ampere and newer: an F32 mat-vec takes at most this many columns, then
# cuBLAS (MMF refuses F32 weights there); graphdiag's compat.mmvf_ok holds the same rule
F32_MMVF_MAX_COLS = 3
REFUSED_TOPOLOGY = "refused (TOPOLOGY_CHANGED), instantiated again"
_ROUTER = re.compile(r"^blk\.\d+\.ffn_gate_inp\.weight$")
_NODES = re.compile(r"^(\d+) graph nodes$")


@dataclass(frozen=True)
class ModelFacts:
    """What a predicate may ask of the model both sides ran: its label and the number of MoE layers whose
    router mat-mul (ffn_gate_inp) has F32 weights."""

    label: str
    f32_routers: int = 0


def model_facts(path: str | Path, label: str = "") -> ModelFacts:
    """The facts of a GGUF file graphdiag reads (UsageError where it cannot)."""
    from ...ir.dtypes import GGMLType
    from ...model.gguf_io import open_gguf
    m = open_gguf(str(path))
    routers = sum(1 for n, t in m.types.items() if _ROUTER.match(n) and t == GGMLType.F32)
    return ModelFacts(label or Path(path).stem, routers)


def preset_facts(name: str, wtype: str) -> ModelFacts:
    """The facts of a preset at a weight type, from the weights graphdiag builds for it (UsageError on an
    unknown preset or type)."""
    from ...ir.dtypes import GGMLType
    from ...model.presets import get_preset, weight_type
    from ...model.weights import create_model
    m = create_model(get_preset(name), weight_type(wtype), with_data=False)
    return ModelFacts(f"{name} {wtype}", sum(1 for lay in m.layers if lay.ffn_gate_inp is not None
                                             and lay.ffn_gate_inp.type == GGMLType.F32))


def record_facts(ours, theirs, model: str | None = None) -> tuple[ModelFacts, str]:
    """The model facts for comparing graphdiag's record header `ours` with llama.cpp's `theirs`, and a note
    ("" when found): `model` (a GGUF path) where given, else the first GGUF file either header names that
    exists here, else graphdiag's preset and weight type. Where none can be read, no MoE router is assumed,
    so an entry that needs one never excuses a pair (the note says so)."""
    from ...model.source import is_file
    if model:
        return model_facts(model), ""
    files = [str(m) for h in (ours, theirs) for m in (h.model_file.get("path"), h.model) if m and is_file(str(m))]
    found = next((f for f in files if Path(f).is_file()), None)
    if found:
        return model_facts(found), ""
    if ours.model and not is_file(ours.model):
        return preset_facts(ours.model, str(ours.settings.get("wtype", "f16"))), ""
    return (ModelFacts(Path(files[0]).stem if files else "?"),
            f"model file {files[0] if files else '(none named)'} not found here: its MoE routers' types unknown, "
            "so cublas-split-k excuses nothing (give --model FILE.gguf)")


@dataclass(frozen=True)
class Pair:
    """Two differing decisions at one place, with each side's decisions per step and the steps' tokens."""

    step: int
    index: int
    ours: Decision
    theirs: Decision
    our_steps: dict[int, list[Decision]]
    their_steps: dict[int, list[Decision]]
    tokens: dict[int, int]                  # step -> tokens in its batch (graphdiag's StepStarted)
    embedding: dict[int, list[bool]] = field(default_factory=dict)   # step -> per graphdiag capture, in order:
    #   whether its graph holds the token embedding's GET_ROWS (embedding_captures)
    cublas: dict[int, list[int]] = field(default_factory=dict)   # step -> per graphdiag capture, in order: the
    #   kernel nodes upstream's cuBLAS path adds to it (ChunkCaptured.cublas_extra)

    def our_capture(self) -> int:
        """Which of graphdiag's captures in this step the pair's decision is (0: the first)."""
        return sum(1 for d in self.our_steps.get(self.step, [])[:self.index] if d.what == "capture")

    def captures(self, side: str, entry: str) -> list[tuple[int, int]]:
        """(step, graph nodes) of each capture of `entry` up to this step, on one side ("ours" | "theirs")."""
        steps = self.our_steps if side == "ours" else self.their_steps
        return [(s, _nodes(d)) for s in sorted(steps) if s <= self.step
                for d in steps[s] if d.what == "capture" and d.entry == entry]


def _nodes(d: Decision) -> int:
    m = _NODES.match(d.outcome)
    return int(m.group(1)) if m else -1


@dataclass(frozen=True)
class Known:
    name: str
    claim: str                              # the predicate, in words
    evidence: str
    holds: Callable[[Pair, ModelFacts], bool] = field(repr=False)


def embedding_captures(events: list[E.Event]) -> dict[int, list[bool]]:
    """Per step, for each graph graphdiag captured in order: whether it holds the token embedding's GET_ROWS,
    the graph's first node: the first chunk of the first split, where that split runs on a GPU (the latest
    GraphSplit names the splits' backends)."""
    out: dict[int, list[bool]] = {}
    first_on_gpu = True
    for ev in events:
        if isinstance(ev, E.GraphSplit) and ev.backends:
            first_on_gpu = (ev.devices[0] >= 0) if ev.devices else ev.backends[0] != "CPU"
        elif isinstance(ev, E.ChunkCaptured):
            out.setdefault(ev.step, []).append(first_on_gpu and ev.split == 0 and ev.chunk == 0)
    return out


def cublas_captures(events: list[E.Event]) -> dict[int, list[int]]:
    """Per step, for each graph graphdiag captured in order: the kernel nodes upstream's cuBLAS path would add
    to it (ChunkCaptured.cublas_extra)."""
    out: dict[int, list[int]] = {}
    for ev in events:
        if isinstance(ev, E.ChunkCaptured):
            out.setdefault(ev.step, []).append(ev.cublas_extra)
    return out


def _cublas_conversions(p: Pair, facts: ModelFacts) -> bool:
    a, b = p.ours, p.theirs
    if not (a.what == b.what == "capture" and a.entry == b.entry and _nodes(a) >= 0 and _nodes(b) >= 0):
        return False
    k = p.our_capture()
    extra, holds = p.cublas.get(p.step, []), p.embedding.get(p.step, [])
    if k >= len(extra) or extra[k] <= 0:
        return False
    return _nodes(a) - (1 if k < len(holds) and holds[k] else 0) + extra[k] == _nodes(b)


def _embedding_node(p: Pair, facts: ModelFacts) -> bool:
    a, b = p.ours, p.theirs
    holds = p.embedding.get(p.step, [])
    k = p.our_capture()
    return (a.what == b.what == "capture" and a.entry == b.entry and _nodes(b) >= 0
            and _nodes(a) == _nodes(b) + 1 and k < len(holds) and holds[k])


def _cublas_inside(p: Pair, facts: ModelFacts) -> bool:
    a, b = p.ours, p.theirs
    if not (a.what == b.what == "executable" and a.entry == b.entry and a.outcome == "updated"
            and b.outcome == REFUSED_TOPOLOGY and facts.f32_routers > 0):
        return False
    ours, theirs = p.captures("ours", a.entry), p.captures("theirs", b.entry)
    if len(ours) < 2 or len(theirs) < 2 or ours[-1][0] != p.step or theirs[-1][0] != p.step:
        return False
    (before, n_before), (_, n_now) = theirs[-2], theirs[-1]
    cols = (p.tokens.get(before, 0), p.tokens.get(p.step, 0))
    return (min(cols) > F32_MMVF_MAX_COLS and cols[0] != cols[1]      # both captures on the cuBLAS path
            and n_before == n_now and ours[-2][1] == ours[-1][1]    # equal kernel counts on each side
            and ours[-1][1] == n_now + 1)


KNOWN: tuple[Known, ...] = (
    Known("graph-nodes",
          "a capture of the same entry where graphdiag's graph holds the token embedding's GET_ROWS (the first "
          "chunk of its first split, on a GPU) and has exactly 1 node more than llama.cpp's",
          "llama.cpp keeps the token embedding on the CPU (llama-model.cpp: the input layer always stays there), "
          "so its GET_ROWS is in a CPU split, where graphdiag keeps it on the GPU. Named by the kernel names of "
          "each captured graph (cuGraphKernelNodeGetParams + cuFuncGetName on both sides, H200 2026-12-02: tiny "
          "F16 58 vs 57 kernels at 1 token, 73 vs 72 at 2; tests/integration/test_captured_kernels.py)",
          _embedding_node),
    Known("cublas-split-k",
          "graphdiag updates an entry's executable where llama.cpp refuses it (TOPOLOGY_CHANGED), on a model "
          "with F32 MoE router weights, both this capture and the entry's previous one at more than "
          f"{F32_MMVF_MAX_COLS} tokens (so both on cuBLAS's path) with different token counts, each side's two "
          "captures of equal node count and graphdiag's exactly llama.cpp's + 1",
          "llama.cpp's MoE router mat-mul (ffn_gate_inp, F32 weights) leaves its float mat-vec above 3 columns "
          "(ggml_cuda_should_use_mmvf on Ampere+) for cuBLAS, which ran it as a split-K GEMM (cutlass s1688gemm "
          "+ cublasLt splitKreduce_kernel, tests/data/llama/kernels-moe-f16-fusion-boundary.json: 4 of each "
          "at 8 and 9 tokens, 88 kernels in both captures, H200 2026-12-04); the graph captured at 9 tokens did "
          "not update the one captured at 8: what cuBLAS changed between them is inside cuBLAS. graphdiag's "
          "stand-in (compat.cublas_split_k_parts: mul_mat_f32 split over k + mul_mat_fixup_f32) has the same "
          "kernel count and updates in place",
          _cublas_inside),
    Known("cublas-conversions",
          "a capture of the same entry holding mat-muls upstream hands to cuBLAS with BF16 or quantized "
          "weights (or F16 weights computed in F32), where llama.cpp's graph has exactly graphdiag's kernel "
          "nodes (less the token embedding's GET_ROWS where graphdiag's graph holds it) plus the conversions "
          "cuBLAS's path launches around each GEMM that graphdiag's kernels do without (ChunkCaptured."
          "cublas_extra, gpu/compat.cublas_launches less the launches of graphdiag's lowering)",
          "ggml_cuda_mul_mat_cublas converts src1 to the GEMM's compute type (and an F16 result back to F32) in "
          "kernels of their own (convert_unary). For F16 weights computed in F16, the path every F16 file takes "
          "past 16 columns on NVIDIA since Pascal, graphdiag launches the same three (x's F16 copy, the GEMM "
          "into an F16 result, its conversion to F32; four where cuBLAS splits K: lowering._cublas_f16), so no "
          "kernel is excused there: named by the kernel names of llama-server's captured graph (graphdiag "
          "trace, H100 2026-12-07, tiny F16, a prefill ubatch past 16 tokens: 25 convert_unary<float, half> + "
          "25 cutlass h16816gemm / sm90 xmma GEMMs + 25 convert_unary<half, float> + 36 others) and of the "
          "differential test's (tests/data/llama/kernels-tiny-f16-gen-716079883.json: 122 kernels, graphdiag's "
          "123 with GET_ROWS), which graphdiag's now match position for position. Before it did (2026-12-07, "
          "seed 1212029658), graphdiag updated an executable llama.cpp had to re-instantiate: a 26-token "
          "capture of 73 nodes against 122, then 2 tokens at 73 against 72. BF16 weights: x is converted to "
          "BF16 (convert_unary<float, __nv_bfloat16>) before a GEMM writing F32, where graphdiag's mul_mat_bf16 "
          "reads F32 x: one kernel each",
          _cublas_conversions),
)


def step_tokens(events: list[E.Event]) -> dict[int, int]:
    return {e.step: e.n_tokens for e in events if isinstance(e, E.StepStarted)}


class Excuser:
    """The `excuse` hook of diff_observed for one comparison: graphdiag's events give the steps' tokens."""

    def __init__(self, facts: ModelFacts, our_events: list[E.Event], known: tuple[Known, ...] = KNOWN):
        self.facts, self.known, self.tokens = facts, known, step_tokens(our_events)
        self.embedding, self.cublas = embedding_captures(our_events), cublas_captures(our_events)

    def __call__(self, step: int, index: int, ours: Decision, theirs: Decision, a: dict, b: dict) -> str | None:
        p = Pair(step, index, ours, theirs, a, b, self.tokens, self.embedding, self.cublas)
        return next((k.name for k in self.known if k.holds(p, self.facts)), None)


class _Swapped:
    """An Excuser for a comparison with llama.cpp's record as the control: each pair handed over as (graphdiag's,
    llama.cpp's)."""

    def __init__(self, excuser: Excuser):
        self.excuser = excuser

    def __call__(self, step: int, index: int, x: Decision, y: Decision, a: dict, b: dict) -> str | None:
        return self.excuser(step, index, y, x, b, a)


def diff_known(ours: tuple, theirs: tuple, facts: ModelFacts, known: tuple[Known, ...] = KNOWN,
               names: tuple[str, str] = ("graphdiag", "llama.cpp"), ours_first: bool = True):
    """diff_observed of a graphdiag record (header, events) against a llama.cpp one, the known differences
    excused pair by pair (the ObservedDiff's `excused` names each, `known` gives each met entry's claim and
    evidence). ours_first=False: llama.cpp's record is the control (`names` in that order too)."""
    from .observed_diff import diff_observed
    ex = Excuser(facts, ours[1], known)
    control, test = (ours, theirs) if ours_first else (theirs, ours)
    d = diff_observed(control, test, names, excuse=ex if ours_first else _Swapped(ex))
    met = {x["name"] for x in d.excused}
    d.known = {k.name: {"claim": k.claim, "evidence": k.evidence} for k in known if k.name in met}
    return d


def diff_records(a: tuple, b: tuple, names: tuple[str, str], apply_known: bool = True, model: str | None = None):
    """`graphdiag diff` of two records of which one at least was observed (llama.cpp or a traced program):
    where one is graphdiag's own and the other a `graphdiag llama` record, the known differences are excused
    pair by pair (apply_known), else every difference is one. The ObservedDiff's known_note says which."""
    from .observed_diff import diff_observed
    own = [not (h.llama or h.trace) for h, _ in (a, b)]
    llama = [bool(h.llama) for h, _ in (a, b)]
    if own[0] + own[1] != 1 or llama[0] + llama[1] != 1:
        d = diff_observed(a, b, names)
        if any(own):
            d.known_note = "known differences are held against `graphdiag llama` records only: none excused"
        return d
    if not apply_known:
        d = diff_observed(a, b, names)
        d.known_note = "known differences not applied (--no-known): each is shown as a difference"
        return d
    ours, theirs = (a, b) if own[0] else (b, a)
    facts, note = record_facts(ours[0], theirs[0], model)
    d = diff_known(ours, theirs, facts, names=names, ours_first=own[0])
    d.known_note = note
    return d


def unmet(met: set[str], known: tuple[Known, ...] = KNOWN) -> list[str]:
    """The entries no excused pair named."""
    return [k.name for k in known if k.name not in met]

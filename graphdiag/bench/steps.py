"""`bench steps`: decode step times per preset and weight type — replay (graphs on) and eager (graphs off),
median and p90 after warm-up, GPU time, kernels per step, the host share of a replayed step — against the
HBM roofline from a copy measured in the same run and, where PyTorch can run, the same step in PyTorch."""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass, field
from types import SimpleNamespace

from .. import events as E
from ..config import resolve
from ..errors import UsageError
from ..model.build import padded_n_kv
from ..model.presets import get_preset
from ..model.source import build_model, is_file, model_config
from ..model.weights import LOAD_PROGRESS
from ..report.analysis.measured import gpu_time_source
from . import roofline as R
from .timing import host_reference_us, percentile

OWN_TYPES = "own types"        # the weight type column of a GGUF file's row (its tensors keep their types)
WARMUP = 2                     # decode steps of each mode dropped before the statistics
PREFILL_REPS = 3               # timed prefills after the first (each at the next positions)


@dataclass(frozen=True)
class StepsOptions:
    models: tuple[str, ...] = ("tiny",)
    wtypes: tuple[str, ...] = ("f16",)
    backend: str | None = None
    steps: int = 64
    prompt_tokens: int | None = None
    chunk_size: int | None = None
    prefill: int = 0            # also time prefills of this many tokens (0: none)
    torch: bool = True          # the PyTorch peer, where torch and a CUDA device are there (F16 rows only)
    llama: bool = False         # the llama.cpp peer (llama_peer.py): real llama.cpp on the same GGUF
    rounds: int = 1             # decode rows (and their llama.cpp peer) measured this many times, interleaved
    settings: dict = field(default_factory=dict)   # further RunConfig settings


class Progress:
    """What the benchmark tells its progress display (the CLI draws it; this one shows nothing)."""

    def start(self, label: str, total: int) -> None:
        """A new phase: `total` steps to come."""

    def note(self, text: str) -> None:
        """A passing remark on the current phase (weights loading)."""

    def advance(self, n: int = 1) -> None: ...


def step_times(events) -> dict:
    """Medians of synchronised step wall times and GPU times by the step's mode, and per-chunk update vs
    instantiate times, from a run's events (first step of each mode excluded when there are more)."""
    by_mode: dict[str, list] = {}
    for e in events:
        if isinstance(e, E.StepFinished):
            by_mode.setdefault(e.mode, []).append((e.duration_ns, e.gpu_ns))
    out = {}
    for mode, xs in by_mode.items():
        xs = xs[1:] if len(xs) > 2 else xs
        out[mode] = {"steps": len(xs), "wall_ms": statistics.median(x[0] for x in xs) / 1e6,
                     "gpu_ms": statistics.median(x[1] for x in xs) / 1e6}
    for name, cls in (("update", E.ChunkUpdated), ("instantiate", E.ChunkInstantiated), ("refused", E.UpdateRefused)):
        xs = [e.duration_ns for e in events if isinstance(e, cls)]
        if xs:
            out[f"chunk_{name}_ms"] = {"count": len(xs), "median": statistics.median(xs) / 1e6}
    return out


def decode_stats(events, mode: str) -> dict:
    """Wall/GPU/host figures (ms) and kernels per step of the decode steps in `mode`, after WARMUP.
    `to_launch_ms` (replayed steps): host time from the step's start (StepStarted) to its last executable
    launched (ReplayLaunched), the part of the host time that comes before the GPU has the step (on the
    simulated driver, whose kernels run inside the launch call, it holds them too)."""
    phase, launches, started, launched, rows = {}, {}, {}, {}, []
    for e in events:
        if isinstance(e, E.StepStarted):
            phase[e.step] = (e.phase, e.n_kv)
            started[e.step] = e.t_ns
        elif isinstance(e, (E.EagerRun, E.CaptureRun)):
            launches[e.step] = launches.get(e.step, 0) + e.n_launches
        elif isinstance(e, E.ReplayLaunched):
            launched[e.step] = e.t_ns
        elif isinstance(e, E.StepFinished) and e.mode == mode and phase.get(e.step, ("",))[0] == "decode":
            to_launch = (launched[e.step] - started[e.step]) / 1e6 if e.step in launched else None
            rows.append((e.duration_ns / 1e6, e.gpu_ns / 1e6, launches.get(e.step), phase[e.step][1], to_launch))
    rows = rows[WARMUP:] if len(rows) > WARMUP + 2 else rows
    if not rows:
        return {}
    wall = [r[0] for r in rows]
    kernels = [r[2] for r in rows if r[2] is not None]
    to_launch = [r[4] for r in rows if r[4] is not None]
    return {"ms": statistics.median(wall), "p90_ms": percentile(wall, 90),
            "gpu_ms": statistics.median(r[1] for r in rows),
            "host_ms": statistics.median(max(r[0] - r[1], 0.0) for r in rows),
            "to_launch_ms": statistics.median(to_launch) if to_launch else None,
            "kernels": int(statistics.median(kernels)) if kernels else None,
            "n_kv": int(statistics.median(r[3] for r in rows)), "steps": len(rows)}


def prefill_ms(events, skip_first: bool = True) -> list[float]:
    """Wall times (ms) of the prefill steps, the first (cold) one dropped."""
    kinds = {e.step: e.phase for e in events if isinstance(e, E.StepStarted)}
    xs = [e.duration_ns / 1e6 for e in events if isinstance(e, E.StepFinished) and kinds.get(e.step) == "prefill"]
    return xs[1:] if skip_first and len(xs) > 1 else xs


class _StepSink:
    def __init__(self, progress: Progress):
        self.progress = progress

    def __call__(self, ev) -> None:
        if isinstance(ev, E.StepFinished):
            self.progress.advance()


def _run(settings: dict, progress: Progress, label: str, scenario=None):
    from ..runner import run
    cfg = resolve({**settings, "nvtx": False})
    # each measured run starts from a collected heap: what earlier runs left to the collector made a 1b
    # prefill of 512 read 30.4 ms after a decode row against 23.5 ms in a fresh process (26.4 once collected)
    gc.collect()
    progress.start(label, cfg.batch + cfg.steps)
    token = LOAD_PROGRESS.set(lambda done, total: progress.note(f"weights {done / 1e9:.2f}/{total / 1e9:.2f} GB"))
    try:
        return run(cfg, scenario, sinks=[_StepSink(progress)])
    finally:
        LOAD_PROGRESS.reset(token)


def measure_bandwidth(backend: str | None, progress: Progress) -> tuple[float, bool, str]:
    """(copy bytes/s, simulated, device) through the driver the runs get (1 GiB on a GPU, 32 MiB simulated)."""
    from ..runner import open_driver
    cfg = resolve({"backend": backend, "nvtx": False})
    progress.start("device-to-device copy", 1)
    driver, _ = open_driver(cfg)
    if driver is None:
        return float("nan"), True, "CPU (numpy)"
    try:
        nbytes = (32 << 20) if driver.simulated else (1 << 30)
        bw = R.copy_bandwidth(driver, nbytes)
        return bw, driver.simulated, driver.info.name
    finally:
        progress.advance()
        driver.close()


def _ratio(a, b):
    return a / b if a and b else None


INSTR_ROUNDS = 10              # alternating rounds of bare and instrumented replayed steps
INSTR_STEPS = 12               # replayed steps per round
INSTR_WARMUP = 3               # decode steps after the prompt before the first round
INSTR_DECODE = INSTR_WARMUP + 2 * INSTR_ROUNDS * INSTR_STEPS   # decode steps one instrumentation session takes


def instrumentation_share(settings: dict, label: str, progress: Progress) -> dict:
    """The instrumentation's share of a replayed step: one session's replayed steps with the sinks a
    recorded run attaches (the JSON-lines event record, the counters, NVTX ranges when a tool listens)
    against the same steps on a bare bus, in alternating rounds, so both see one graph, one placement and
    the same clocks. Each round's median step wall time (StepFinished, as replay_ms); the share is the median
    over rounds of an instrumented round against the bare round before it, so a drift across the rounds (the
    KV cache growing past a padding boundary, the host slowing down) enters one pair, not the whole split."""
    import os

    from ..counters import Counters
    from ..plan import StepPlan
    from ..report.sinks.nvtx_sink import NvtxSink
    from ..report.record.write import JsonlWriter
    from ..runner import RunResult, Session, Stepper
    cfg = resolve({**settings, "nvtx": False})
    bus = E.EventBus()
    walls: dict[str, list[list[int]]] = {"bare": [], "on": []}     # per round, the replayed steps' walls
    mode = ["warm-up"]

    def on_event(ev: E.StepFinished) -> None:            # subscribed for StepFinished only
        progress.advance()
        if ev.mode == "replay" and mode[0] in walls:
            walls[mode[0]][-1].append(ev.duration_ns)

    bus.subscribe(on_event, internal=True, kinds=(E.StepFinished,))
    progress.start(f"{label} instrumentation", INSTR_DECODE + 1)
    session = Session(cfg, bus)
    try:
        stepper = Stepper(session, RunResult({}, [], Counters()))
        decode = [StepPlan("decode", batch=1)] * INSTR_STEPS
        stepper.run([StepPlan("prefill", n_tokens=cfg.prompt_tokens)] + decode[:INSTR_WARMUP])
        nvtx = NvtxSink()
        with JsonlWriter(os.devnull, {"schema": "bench"}) as record:
            sinks = [record, Counters()]
            for _ in range(INSTR_ROUNDS):
                mode[0] = "bare"
                walls["bare"].append([])
                stepper.run(decode)
                mode[0] = "on"
                walls["on"].append([])
                for k in sinks:
                    bus.subscribe(k)
                if nvtx.enabled:
                    bus.subscribe(nvtx, spans=True)
                stepper.run(decode)
                for k in sinks + ([nvtx] if nvtx.enabled else []):
                    bus.unsubscribe(k)
    finally:
        session.close()
    return {**instrumentation_figures(walls["bare"], walls["on"]), "instr_nvtx_live": nvtx.enabled}


def instrumentation_figures(bare: list[list[int]], on: list[list[int]]) -> dict:
    """From the rounds' replayed-step walls (ns; round k of `on` follows round k of `bare`): the medians of
    all bare and all instrumented steps (ms), and the share, the median over rounds with steps on both sides
    of (instrumented round's median / bare round's median - 1), in percent."""
    flat = lambda rounds: [x for r in rounds for x in r]
    pairs = [(statistics.median(b), statistics.median(o)) for b, o in zip(bare, on) if b and o]
    b_all, o_all = flat(bare), flat(on)
    return {"instr_bare_ms": statistics.median(b_all) / 1e6 if b_all else None,
            "instr_on_ms": statistics.median(o_all) / 1e6 if o_all else None,
            "instr_share_pct": statistics.median(100 * (o - b) / b for b, o in pairs) if pairs else None,
            "instr_rounds": len(pairs)}


def runs_of(opts: StepsOptions) -> list[tuple[str, str | None]]:
    """(model, weight type) of each decode row: a preset in each of opts.wtypes, a GGUF file once in its own
    types (None: --wtype does not apply to it)."""
    return [(m, w) for m in opts.models for w in ((None,) if is_file(m) else opts.wtypes)]


def _decode_settings(opts: StepsOptions, model: str, wtype: str | None) -> dict:
    return {"backend": opts.backend, "model": model, "wtype": wtype, "steps": opts.steps,
            "prompt_tokens": opts.prompt_tokens, "chunk_size": opts.chunk_size, **opts.settings}


def _prefill_run(opts: StepsOptions, model: str, wtype: str) -> tuple[dict, SimpleNamespace]:
    """The settings and the timeline (as a scenario) of a prefill row's run."""
    from ..scenario import TimelineChange
    p = opts.prefill
    timeline = [TimelineChange(at_step=k, prefill=p) for k in range(1, PREFILL_REPS + 1)]
    settings = {"backend": opts.backend, "model": model, "wtype": wtype, "steps": PREFILL_REPS,
                "prompt_tokens": p, "chunk_size": opts.chunk_size, **opts.settings}
    return settings, SimpleNamespace(name=None, path="bench steps --prefill", timeline=timeline)


def check_steps(opts: StepsOptions) -> None:
    """Every run the benchmark makes, checked as `graphdiag run` checks its own before anything is built
    (config.validate_run: the KV cells each run's plan needs, ...): an impossible --steps, --prompt-tokens
    or --prefill is one line (UsageError) at once, not an error after minutes of other rows. The decode
    row's instrumentation rounds decode more steps than --steps: they are checked too."""
    from ..config import validate_run
    if opts.rounds < 1:
        raise UsageError(f"rounds {opts.rounds}: each row is measured at least once (1 or more)")
    instr_steps = INSTR_DECODE
    for model, wtype in runs_of(opts):
        n_ctx = model_config(model).n_ctx
        if opts.prefill and (PREFILL_REPS + 1) * opts.prefill > n_ctx:
            raise UsageError(f"--prefill {opts.prefill}: the prefill row runs {PREFILL_REPS + 1} prefills of that "
                             f"many tokens in one sequence, {(PREFILL_REPS + 1) * opts.prefill} KV cells, and model "
                             f"{model} has {n_ctx} (n_ctx): at most --prefill {n_ctx // (PREFILL_REPS + 1)}")
        base = _decode_settings(opts, model, wtype)
        cfg = resolve({**base, "nvtx": False})
        validate_run(cfg)
        if cfg.prompt_tokens + instr_steps > n_ctx:     # one sequence: a prefill, then decode steps
            raise UsageError(f"--prompt-tokens {cfg.prompt_tokens}: the decode row's instrumentation rounds "
                             f"decode {instr_steps} steps after the prompt, {cfg.prompt_tokens + instr_steps} "
                             f"KV cells, and model {model} has {n_ctx} (n_ctx): at most --prompt-tokens "
                             f"{n_ctx - instr_steps}")
        if opts.prefill:
            settings, sc = _prefill_run(opts, model, wtype)
            validate_run(resolve({**settings, "nvtx": False}), sc)


def _row_names(model: str, wtype: str | None) -> dict:
    """How a row names its model: a preset and its weight type, or a file's name (the full path apart, in
    `model_path`) and OWN_TYPES (the types per tensor are the run header's, in `model_types`)."""
    if wtype is not None:
        return {"model": model, "wtype": wtype}
    from pathlib import Path
    return {"model": Path(model).name, "model_path": model, "wtype": OWN_TYPES}


def decode_row(opts: StepsOptions, model: str, wtype: str | None, bandwidth: float, progress: Progress) -> dict:
    """graphdiag's replayed and eager decode step of one (model, weight type): one run graphs on, one off."""
    base = _decode_settings(opts, model, wtype)
    names = _row_names(model, wtype)
    label = f"{names['model']} {names['wtype']}"
    host_ref = host_reference_us()
    on = _run(base, progress, f"{label} graphs on")
    off = _run({**base, "graphs_disabled": True}, progress, f"{label} graphs off")
    rep, eag = decode_stats(on.events, "replay"), decode_stats(off.events, "eager")
    cfg = model_config(model)
    n_kv = rep.get("n_kv") or eag.get("n_kv") or padded_n_kv(resolve(base).prompt_tokens, cfg.n_ctx)
    m = build_model(model, wtype or "f16", with_data=False)
    wb, kvb = R.weight_bytes_read(m), R.kv_bytes_read(cfg, n_kv)
    roof = R.roofline_ms(wb, kvb, bandwidth) if bandwidth == bandwidth else None
    row = {"kind": "decode", **names, "backend": on.header.get("backend"),
           "device": on.header.get("device"), "simulated": bool(on.header.get("simulated")), "n_kv": n_kv,
           "launcher": off.header.get("launcher", ""),           # how the eager step's launches went out
           "devices": on.header.get("settings", {}).get("devices", 1),
           "gpu_time_source": gpu_time_source(on.header),     # what replay_gpu_ms / eager_gpu_ms measured
           "replay_ms": rep.get("ms"), "replay_p90_ms": rep.get("p90_ms"), "replay_gpu_ms": rep.get("gpu_ms"),
           "replay_host_ms": rep.get("host_ms"), "replay_to_launch_ms": rep.get("to_launch_ms"),
           "eager_ms": eag.get("ms"), "eager_p90_ms": eag.get("p90_ms"),
           "eager_gpu_ms": eag.get("gpu_ms"), "kernels_per_step": eag.get("kernels"),
           "replay_steps": rep.get("steps", 0), "eager_steps": eag.get("steps", 0),
           "weight_bytes": wb, "kv_bytes": kvb, "copy_GBps": bandwidth / 1e9 if roof else None,
           "roofline_ms": roof, "host_ref_us": host_ref}
    if on.header.get("model_file"):
        row["model_types"] = on.header["model_file"].get("types")
    row["graph_speedup"] = _ratio(row["eager_ms"], row["replay_ms"])
    row["replay_over_roofline"] = _ratio(row["replay_ms"], roof)
    return _decisions_only(row, on.header)


def _decisions_only(row: dict, header: dict) -> dict:
    """A row the simulator ran decisions-only (a big model's default: kernels modelled, not computed) has no
    timings to give: its host times measure bookkeeping, not kernels, and are dropped (shown as —, the
    instrumentation share not measured); its decisions (kernels a step) stay. `decisions_only` says so."""
    if header.get("sim_mode") != "decisions":
        return row
    for key in (*ROUND_TIMES, *ROUND_RATIOS, "prefill_ms"):
        if key in row and key != "host_ref_us":
            row[key] = None
    row["decisions_only"] = True
    return row


# the timings a row of several rounds gives as their median, and the ratios it gives as the median of the
# per-round ratios (each round's two sides measured minutes apart at most) with their range
ROUND_TIMES = ("replay_ms", "replay_p90_ms", "replay_gpu_ms", "replay_host_ms", "replay_to_launch_ms", "eager_ms",
               "eager_p90_ms", "eager_gpu_ms", "host_ref_us", "llama_replay_ms", "llama_replay_p90_ms",
               "llama_eager_ms", "llama_eager_p90_ms", "llama_host_ref_us")
ROUND_RATIOS = ("graph_speedup", "replay_over_roofline", "replay_vs_llama", "eager_vs_llama", "llama_graph_speedup")
ROUND_COUNTS = ("replay_steps", "eager_steps", "llama_replay_steps", "llama_eager_steps")
# ratio -> (graphdiag's timing, llama.cpp's): with several rounds, `<ratio>_fastest` compares each side's fastest
# round. The lent hosts switch between two speeds within seconds (2026-12-07, H100: host references ~190 and
# ~380 µs), more often than a round's two sides can be timed together, so a round's ratio can compare the fast
# host with the slow one even where the references taken before each side agree; each side's fastest round is
# its time at the fast host's speed (9 rounds of tiny F16 eager: round ratios 0.68-1.35, fastest 277 against
# 312 µs).
FASTEST_PAIRS = {"replay_vs_llama": ("replay_ms", "llama_replay_ms"),
                 "eager_vs_llama": ("eager_ms", "llama_eager_ms")}
# graphdiag's and llama.cpp's host references further apart than this: the round's ratios compare two host
# speeds (the lent H200 hosts switched between ~175 and ~350-400 µs within seconds, 2026-12-04)
HOST_SPEED_TOLERANCE = 1.3


def host_speed_differed(row: dict) -> bool:
    """Whether the host ran graphdiag's side and llama.cpp's at speeds further apart than the tolerance (by
    the host reference taken right before each)."""
    a, b = row.get("host_ref_us"), row.get("llama_host_ref_us")
    return bool(a and b) and max(a, b) / min(a, b) > HOST_SPEED_TOLERANCE


def combine_rounds(rounds: list[dict]) -> dict:
    """One row from the rounds of a decode row: the first round's row with each timing the median over the
    rounds, each ratio the median of the rounds' ratios and its [min, max] under `<ratio>_range`, the
    llama.cpp ratios also as each side's fastest round compared (`<ratio>_fastest`, FASTEST_PAIRS), the step
    counts summed, and `per_round` keeping every round's timings and ratios. A host whose speed drifts moves
    both sides of a round together, so the ratios hold where one run's absolute times do not."""
    if len(rounds) == 1:
        rounds[0]["rounds"] = 1
        return rounds[0]
    row = dict(rounds[0])

    def values(k):
        return [r[k] for r in rounds if r.get(k) is not None]
    for k in ROUND_TIMES:
        if any(k in r for r in rounds):
            xs = values(k)
            row[k] = statistics.median(xs) if xs else None
    for k in ROUND_RATIOS:
        if any(k in r for r in rounds):
            xs = values(k)
            row[k] = statistics.median(xs) if xs else None
            row[f"{k}_range"] = [min(xs), max(xs)] if xs else None
    for k in ROUND_COUNTS:
        if any(k in r for r in rounds):
            row[k] = sum(values(k))
    for k, (ours, theirs) in FASTEST_PAIRS.items():
        a, b = values(ours), values(theirs)
        if a and b and min(b) > 0:
            row[f"{k}_fastest"] = min(a) / min(b)
    if any("host_speed_differed" in r for r in rounds):
        row["host_speed_differed"] = sum(bool(r.get("host_speed_differed")) for r in rounds)
    row["rounds"] = len(rounds)
    row["per_round"] = [{k: r.get(k) for k in ROUND_TIMES + ROUND_RATIOS + ("host_speed_differed",) if k in r}
                        for r in rounds]
    return row


def _llama_figures(opts: StepsOptions, model: str, wtype: str | None, folder, progress: Progress) -> dict:
    from .llama_peer import llama_peer_figures
    prompt = resolve(_decode_settings(opts, model, wtype)).prompt_tokens
    return llama_peer_figures(_row_names(model, wtype), opts.steps, prompt, folder, progress, decode_stats)


def _wants_peer(opts: StepsOptions, row: dict) -> bool:
    """PyTorch's peer runs plain F16 ops on a preset's llama shapes: never next to a quantised row, whose
    work it does not do, nor next to a file (maybe of another architecture)."""
    return (opts.torch and not row["simulated"] and "model_path" not in row
            and not get_preset(row["model"]).is_moe and row.get("wtype") == "f16")


def add_torch_peer(row: dict, progress: Progress) -> None:
    """The PyTorch peer of a measured row (decode or prefill), on the row's shapes, with the ratios, and the
    host reference taken right before it (`torch_host_ref_us`): the peers run after every graphdiag row, so
    minutes can separate the two sides, and the lent hosts change speed over minutes."""
    cfg = get_preset(row["model"])
    host_ref = host_reference_us()
    if row["kind"] == "decode":
        from .torch_peer import torch_decode
        progress.start(f"{row['model']} PyTorch peer", 1)
        n_kv = row["n_kv"]
        peer = torch_decode(cfg, n_kv, pos=n_kv // 2)
        progress.advance()
        row.update(peer)
        row["replay_vs_torch_graph"] = _ratio(row["replay_ms"], peer.get("torch_graph_ms"))
        row["eager_vs_torch_eager"] = _ratio(row["eager_ms"], peer.get("torch_eager_ms"))
    else:
        from .torch_peer import torch_prefill
        p = row["n_tokens"]
        progress.start(f"{row['model']} PyTorch prefill", 1)
        row.update(torch_prefill(cfg, p, [k * p for k in range(1, PREFILL_REPS + 1)]))
        progress.advance()
        row["prefill_vs_torch"] = _ratio(row["prefill_ms"], row.get("torch_prefill_ms"))
    if row.get("torch_prefill_ms") is not None or row.get("torch_graph_ms") is not None:
        row["torch_host_ref_us"] = host_ref


def prefill_row(opts: StepsOptions, model: str, wtype: str | None, progress: Progress) -> dict:
    """Prefills of opts.prefill tokens, one after another in one sequence (positions 0, P, 2P, ...); the
    first is dropped as warm-up, so both sides time prefills at positions P .. PREFILL_REPS * P."""
    p = opts.prefill
    host_ref = host_reference_us()
    settings, sc = _prefill_run(opts, model, wtype)
    names = _row_names(model, wtype)
    r = _run(settings, progress, f"{names['model']} {names['wtype']} prefill {p}", sc)
    xs = prefill_ms(r.events)
    row = {"kind": "prefill", **names, "backend": r.header.get("backend"),
           "device": r.header.get("device"), "simulated": bool(r.header.get("simulated")), "n_tokens": p,
           "prefill_ms": statistics.median(xs) if xs else None, "prefill_reps": len(xs), "host_ref_us": host_ref}
    return _decisions_only(row, r.header)


def bench_steps(opts: StepsOptions, progress: Progress | None = None) -> list[dict]:
    """One decode row per (model, weight type), and a prefill row each when opts.prefill is set. A decode
    row's llama.cpp peer runs right after graphdiag's runs of it, in child processes; with opts.rounds > 1
    the pair is measured that many times in turn (combine_rounds). The PyTorch peers run after every
    graphdiag row, so torch's import, its CUDA allocator and its threads are not in the process while
    graphdiag is timed (a 1b prefill measured 25 ms without them, 29-32 ms after a peer ran)."""
    progress = progress or Progress()
    check_steps(opts)
    if opts.llama:
        from .llama_peer import check_llama_peer
        check_llama_peer(opts.backend)
    bandwidth, _, _ = measure_bandwidth(opts.backend, progress)
    folder = None
    if opts.llama:                    # every GGUF the peer runs, written before anything is timed
        from .llama_peer import add_llama_ratios, export_row_model, llama_folder
        folder = llama_folder()
        for model, wtype in runs_of(opts):
            export_row_model(_row_names(model, wtype), folder)
    rows = []
    for model, wtype in runs_of(opts):
        rounds = []
        for k in range(opts.rounds):
            # graphdiag's two runs and llama.cpp's two (child processes), in turn: graphdiag first in even
            # rounds, llama.cpp first in odd ones, so a steady drift of the host does not favour one side
            peer_first = opts.llama and k % 2 == 1
            peer = _llama_figures(opts, model, wtype, folder, progress) if peer_first else None
            row = decode_row(opts, model, wtype, bandwidth, progress)
            if opts.llama and not row["simulated"]:
                row.update(peer or _llama_figures(opts, model, wtype, folder, progress))
                add_llama_ratios(row)
                row["host_speed_differed"] = host_speed_differed(row)
            rounds.append(row)
        row = combine_rounds(rounds)
        if row.get("replay_ms") is not None:      # the instrumentation's share: once, after the rounds
            row.update(instrumentation_share(_decode_settings(opts, model, wtype),
                                             f"{row['model']} {row['wtype']}", progress))
        rows.append(row)
        if opts.prefill:
            rows.append(prefill_row(opts, model, wtype, progress))
    for row in rows:
        if _wants_peer(opts, row):
            add_torch_peer(row, progress)
    return rows

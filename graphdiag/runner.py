"""One run: settings (and an optional scenario) in, events out.

Builds the driver (CUDA, or the simulated one where there is no GPU), the backends, the model, the scheduler
and the context; walks the step plan (prefills, decode steps, batch changes, idle time); optional checks per
step: --verify (replayed steps recomputed eagerly) and --oracle (the independent numpy forward).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import time
from dataclasses import dataclass, field

import numpy as np

from . import __version__
from . import events as E
from .backends.cpu import CpuBackend
from .backends.gpu.backend import GpuBackend
from .backends.gpu.entry import Clock
from .backends.gpu.runtime import RuntimeOptions
from .config import RunConfig, kernel_cache_dir
from .counters import Counters
from .backends.drivers.faults import FaultInjector, calls_of, recoverable
from .errors import CudaError, GraphdiagError, NoDeviceError, OutOfDeviceMemory, RunInterrupted, Terminated
from .interrupts import interrupt_came, raise_if_swallowed, shielded
from .ir.dtypes import GGMLType
from .quants import q8_1_activations
from .model.source import build_model, model_config
from .model.reference import Reference
from .model.fallbacks import fallback_note, mix_summary
from .plan import StepPlan, max_sequences, plan_steps
from .release import releasing
from .sched.context import make_context

from .backends.gpu.compat import MMF_MAX_COLUMNS
from .events.checks import ORACLE_BOUND, ORACLE_F16_GEMM_BOUND, ORACLE_FLOAT_JITTERS, ORACLE_JITTERS
from .oracle_check import failure_line, judge
from .oracle_router import Probe, RouterFollow, guesses, near_ties, refusal_line
from .backends.sim_router_tap import RouterTap


@dataclass
class RunResult:
    header: dict
    events: list
    counters: Counters
    tokens: list[list[int]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _wall_less_own_work(session: "Session"):
    """ggml_time_us for the eviction sweep: the monotonic clock less graphdiag's own work that llama.cpp never
    does: the time every driver of the session has spent loading kernels (nothing on the CPU backend, which
    has no driver) and the session's checks (--verify's recompute, --oracle's numpy forward: Session.own_ns).
    A 1b oracle step of seconds on a loaded host must not age an entry toward ggml's 10 s idle rule."""
    def now_us() -> int:
        loads = sum(d.kernel_load_ns for d in (session.driver, *session.extra_drivers) if d is not None)
        return (time.monotonic_ns() - loads - getattr(session, "own_ns", 0)) // 1000
    return now_us


def open_driver(cfg: RunConfig):
    """(driver or None for the CPU backend, note) — cuda when asked or available, else simulated."""
    if cfg.backend == "cpu":
        return None, ""
    if cfg.backend in ("auto", "cuda"):
        try:
            from .backends.drivers.cuda import CudaDriver
            return CudaDriver.open(cache_dir=kernel_cache_dir()), ""
        except NoDeviceError as e:
            if cfg.backend == "cuda":
                raise
            note = f"no GPU ({e}); using the SIMULATED driver"
    else:
        note = ""
    from .backends.drivers.sim import SimDriver
    from .sim_mode import sim_mode
    return SimDriver(compute_capability=cfg.cc_tuple, compute=sim_mode(cfg) == "compute"), note


class Session:
    """Everything one run holds; `close()` releases it in reverse order."""

    def __init__(self, cfg: RunConfig, bus: E.EventBus, clock: Clock | None = None, warn=None,
                 n_seq_max: int | None = None, n_outputs_max: int | None = None):
        """`warn(line)` hears, before the model is built, what computing a big model on the simulated
        driver will cost."""
        self.cfg, self.bus = cfg, bus
        if cfg.devices > 1 and cfg.backend != "cpu":   # a layer split: one driver per device
            from .backends.device_set import open_drivers
            drivers, self.note = open_drivers(cfg, cache_dir=kernel_cache_dir())
            self.driver, self.extra_drivers = drivers[0], drivers[1:]
        else:
            self.driver, self.note = open_driver(cfg)
            self.extra_drivers = []
        # the eviction clock: wall time on CUDA (ggml_time_us) less graphdiag's own kernel loading (a
        # first step that compiles kernels for 10 s must not make ggml's idle sweep evict what it just
        # stamped); on the simulated driver its modelled time, so a run's decisions never depend on the
        # host's speed or load
        sim = self.driver is not None and self.driver.simulated
        if sim and self.driver.computes and warn is not None:
            from .sim_mode import compute_cost_line
            line = compute_cost_line(cfg)
            if line:
                warn(line)
        self.own_ns = 0                # host ns of graphdiag's own checks (verify, oracle): off the eviction clock
        self.clock = clock or (Clock(self.driver.now_us) if sim else Clock(_wall_less_own_work(self)))
        self.cpu, self.gpu, self.ctx, self.devices, self.split = None, None, None, None, None
        self.reference, self.reference_noise, self.router_tap = None, [], None
        self.faults = FaultInjector([self.driver, *self.extra_drivers], self._fault_fired)
        self.fault_fired = ""          # the kind of the fault that fired in the current step ("" none)
        try:
            if self.driver is not None:
                for d in self.extra_drivers:
                    d.preload()
                self.driver.preload()
            self.cpu = CpuBackend()
            if self.driver is not None:
                opts = RuntimeOptions(cfg.chunk_size, cfg.fusion, cfg.concurrent_streams, cfg.graphs_disabled,
                                      cfg.pdl, cfg.upstream, cfg.pool_invalidation)
                make = lambda d, name=None: GpuBackend(d, bus, opts, self.clock, cfg.pool_cap, cfg.pool_max_buffers, name)
                self._open_gpus(make)
            self.model = build_model(cfg.model, cfg.wtype, seed=cfg.seed, swa_full=cfg.swa_full,
                                     n_seq_max=n_seq_max or cfg.batch, upstream=cfg.upstream,
                                     n_ubatch=cfg.ubatch_size, n_ctx=cfg.n_ctx)
            gpus = self.devices.gpus if self.devices is not None else [self.gpu] if self.gpu is not None else []
            t0 = time.perf_counter_ns()
            self.ctx = make_context(self.model, [*gpus, self.cpu], bus, cfg.n_cpu_moe, cfg.reuse_disabled,
                                    self.split, self.devices.copy if self.devices is not None else None,
                                    arenas_by_output=cfg.upstream != "d99724f2", upstream=cfg.upstream,
                                    n_ubatch=cfg.ubatch_size, n_seq_max=n_seq_max or cfg.batch,
                                    n_outputs_max=n_outputs_max)
            # the weights' upload, nearly all of it (the worst-case graphs' reserve is a few ms)
            self.load_ns = time.perf_counter_ns() - t0
            self.reference = Reference(self.model, q8_1_activations=self.gpu is not None) if cfg.oracle else None
            # the Q8_1 noise twins: the same reference with its activations jittered before each Q8_1 rounding
            # (ORACLE_JITTERS); how far they land from the reference calibrates the bound of a Q8_1 run
            q8_1 = self.reference is not None and self.gpu is not None and any(
                q8_1_activations(t.type) for t in self.model.tensors())
            # a float MoE run on a GPU: twins jittered before every product (ORACLE_FLOAT_JITTERS), whose router
            # logits say how far the kernels' F16 / TF32 rounding of x moves the experts' near-ties
            floats = (not q8_1 and self.reference is not None and self.gpu is not None
                      and self.model.cfg.is_moe)
            jitters = ORACLE_JITTERS if q8_1 else ORACLE_FLOAT_JITTERS if floats else ()
            self.reference_noise = [Reference(self.model, True, jitter=j, weights_of=self.reference,
                                              jitter_floats=floats) for j in jitters]
            self.router_tap = self._tap_router()
        except BaseException:
            # a half-built session (bad preset, weights that do not fit) releases the device; its own error
            # is the one to report, not a release's after it
            with contextlib.suppress(Exception):
                self.close()
            raise

    def _tap_router(self) -> RouterTap | None:
        """Where the oracle has twins and the model experts, the simulated drivers' record of the run's expert
        choices (oracle_router: a near-tie's choice is taken from the run); None elsewhere."""
        drivers = [d for d in (self.driver, *self.extra_drivers) if d is not None]
        if not (self.reference_noise and self.model.cfg.is_moe and drivers
                and all(d.simulated and d.computes for d in drivers)):
            return None
        tap = RouterTap(self.model.cfg.n_expert_used)
        for d in drivers:
            d.kernel_observer = tap
        return tap

    def _fault_fired(self, kind: str, call: str, error: str) -> None:
        self.fault_fired = kind
        step = self.ctx.step if self.ctx is not None else -1
        self.bus.emit(E.FaultInjected(step=step, t_ns=self.bus.clock(), fault=kind, call=call, error=error))

    def _open_gpus(self, make) -> None:
        """One GPU backend, or with --devices N one per device and the layer split over them."""
        if not self.extra_drivers:
            self.gpu = make(self.driver)
            return
        from .backends.device_set import DeviceSet, GpuGroup
        from .sched.devices import LayerSplit
        self.devices = DeviceSet([self.driver, *self.extra_drivers], make)
        n_layer = model_config(self.cfg.model).n_layer
        self.split = LayerSplit.chosen(n_layer, self.cfg.tensor_split, self.devices.free_memory)
        self.gpu = GpuGroup(self.devices.gpus)

    def announce(self) -> None:
        """Events a run states before its first step (after its header): the devices' layout and links, a
        model file's upload (its bytes and time)."""
        if self.devices is not None:
            self.devices.announce(self.bus, self.split)
        g = self.model.file
        if g is not None:
            self.bus.emit(E.WeightsUploaded(t_ns=self.bus.clock(), source=g.path.name, n_bytes=g.n_bytes,
                                            duration_ns=self.load_ns))

    @property
    def backend_name(self) -> str:
        return "cpu" if self.driver is None else ("sim" if self.driver.simulated else "cuda")

    @property
    def computes(self) -> bool:
        """Whether results (logits) are computed: False on the simulated driver's decisions-only mode."""
        return self.driver is None or self.driver.computes

    @property
    def sim_mode(self) -> str:
        """"compute" | "decisions" on the simulated driver, "" elsewhere."""
        if self.driver is None or not self.driver.simulated:
            return ""
        return "compute" if self.driver.computes else "decisions"

    @property
    def device(self) -> str:
        if self.driver is None:
            return "CPU (numpy)"
        names = []
        for d in (self.driver, *self.extra_drivers):
            major, minor = d.info.compute_capability
            names.append(f"{d.info.name} (cc {major}.{minor})")
        return ", ".join(names)

    def close(self) -> None:
        """Release the scheduler's buffers, the backends, the drivers: each tried, the first error raised.
        The oracle's float64 weights (8 bytes a parameter: 2 GB for Gemma 3 270M) are let go here too: the
        session sits in reference cycles (bound methods its parts hold), which only a full garbage collection
        frees, and a process that runs again (a test suite, bench) would hold every past run's copy till then."""
        self.reference, self.reference_noise, self.router_tap = None, [], None
        with releasing() as release:
            if self.ctx is not None:
                release(self.ctx.sched.close)
            if self.devices is not None:
                release(self.devices.close)        # every device's backend, then its driver
            elif self.gpu is not None:
                release(self.gpu.close)
            if self.cpu is not None:
                release(self.cpu.close)
            if self.devices is None:
                for d in (self.driver, *self.extra_drivers):
                    if d is not None:
                        release(d.close)


def _model_file(model) -> dict:
    """What a GGUF model's header says of its file ({} for a preset)."""
    g = model.file
    if g is None:
        return {}
    types: dict[str, int] = {}
    for t in g.types.values():
        types[t.name] = types.get(t.name, 0) + 1
    return {"path": str(g.path), "arch": g.arch, "tensors": len(g.types), "types": types, "bytes": g.n_bytes}


def make_header(cfg: RunConfig, s: Session, scenario: str | None) -> dict:
    """The record's first line (report.record.RunHeader). On the simulated driver the settings show the
    mode it ran in (sim_mode, with why); `blas` is what numpy's BLAS was told (config.blas_threads)."""
    from .config import blas_threads
    from .sim_mode import mode_reason
    settings = cfg.settings()
    if s.sim_mode:
        settings["sim_mode"] = s.sim_mode
    mf = _model_file(s.model)
    if mf:                                      # a file's weights have their own types: --wtype did not apply
        quant = sorted(((n, c) for n, c in mf["types"].items() if n != "F32"), key=lambda x: (-x[1], x[0]))
        settings["wtype"] = "file: " + (", ".join(f"{n} ×{c}" for n, c in quant) or "F32")
    elif mix_summary(s.model):                  # a llama.cpp mix: the types its weights took, counted
        settings["wtype"] = mix_summary(s.model)
    return {
        "schema": "graphdiag-events", "version": E.SCHEMA_VERSION, "graphdiag_version": __version__,
        "backend": s.backend_name, "device": s.device, "simulated": s.driver is not None and s.driver.simulated,
        "model": cfg.model, "upstream": cfg.upstream, "rules": cfg.rules(s.driver is not None),
        "article": cfg.article_rules(s.driver is not None),
        "settings": settings, "sources": dict(cfg.sources),
        "sim_mode": s.sim_mode, "sim_mode_reason": mode_reason(cfg) if s.sim_mode else "",
        "blas": blas_threads().to_dict(), "model_file": mf,
        "launcher": s.driver.launcher if s.driver is not None and not s.driver.simulated else "",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "scenario": scenario, "note": "; ".join(n for n in (s.note, fallback_note(s.model)) if n),
    }


def run(cfg: RunConfig, scenario=None, sinks=(), span_sinks=(), on_header=None, device_sinks=(),
        cupti: bool = False, warn=None, essential=(), plan=None, n_seq_max: int | None = None,
        n_outputs_max: int | None = None) -> RunResult:
    """Run the plan; every event reaches `sinks` live. Returns the header, the events and the counters.
    Each step's device records (modelled on the simulated driver; CUPTI's on CUDA when `cupti`) go to
    `device_sinks`; `warn(line)` hears why there are none where they were asked for, and of a sink that
    failed and was cut off (the others still get every event). The sinks in `essential` (the record) end
    the run when they fail instead. `plan`: the steps to walk (a replayed trace's, trace/replay_plan.py)
    instead of the ones cfg and the scenario make; `n_seq_max`: the context's sequences when more than the
    plan uses (a replayed server's slots); `n_outputs_max`: the context's output rows, which size its
    worst-case reserve (a replayed llama-server's; None: llama.cpp's default, n_batch)."""
    if cfg.prompt is not None and cfg.prompt_ids is None:    # a caller that skipped validate_run
        from .config import tokenize_prompt
        tokenize_prompt(cfg, scenario)
    bus = E.EventBus()
    rec, counters = E.Recorder(), Counters()
    for s in (rec, counters):
        bus.subscribe(s, essential=True)
    for s in sinks:
        bus.subscribe(s, essential=any(s is x for x in essential))
    for s in span_sinks:
        bus.subscribe(s, spans=True)
    if warn is not None:
        bus.on_sink_error = lambda f: warn(f"{f.sink} failed at step {f.step} ({f.error}): cut off, "
                                           f"every other output still gets every event")
    plan = plan if plan is not None else plan_steps(cfg, scenario)
    session = Session(cfg, bus, warn=warn, n_seq_max=max(max_sequences(plan), n_seq_max or 1),
                      n_outputs_max=n_outputs_max)
    try:
        session.device_source, session.device_sinks = _open_device(session, cupti, warn), list(device_sinks)
        header = make_header(cfg, session, getattr(scenario, "name", None))
        result = RunResult(header, rec.events, counters)

        def start() -> None:                # the run starts: the outputs open (on_header), then it is announced
            if on_header is not None:       # a signal meanwhile comes once every output has its header
                with shielded():            # (a writer cut between its header and its start loses the rest)
                    on_header(header)
            session.announce()
        walk_recorded(session, result, plan, start)
    except BaseException:
        with contextlib.suppress(Exception):   # the run's error is the one to report, not a release's echo
            _close_session(session)
        raise
    _close_session(session)
    return result


def _close_session(session: Session) -> None:
    with releasing() as release:
        if session.device_source is not None:
            release(session.device_source.close)
        release(session.close)


def _open_device(session: Session, cupti: bool, warn):
    """The session's device activity source, or None (with a warning when CUPTI was asked for)."""
    from .report.sources import DeviceSourceUnavailable, open_device_source
    try:
        return open_device_source(session.driver, cupti, session.extra_drivers)
    except DeviceSourceUnavailable as e:
        if warn is not None:
            warn(f"no device activity: {e}")
        return None


def walk_recorded(session: "Session", result: RunResult, plan, start=None) -> None:
    """`start()` (the outputs opened with the header, the run announced), then walk the plan, and end the
    record with a RunEnded event however the run ends (complete, Ctrl-C, an error, a closed stdout), from
    the moment `start` begins: a record that has its header always ends with its RunEnded. The exception,
    if any, goes on to the caller."""
    status, reason = "complete", ""
    try:
        if start is not None:
            start()
        Stepper(session, result).run(plan)
    except KeyboardInterrupt as e:
        status, reason = "interrupted", "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        raise
    except BrokenPipeError:
        status, reason = "interrupted", "output closed (broken pipe)"
        raise
    except GraphdiagError as e:
        status, reason = "failed", f"{type(e).__name__}: {e}"
        raise
    except BaseException as e:
        came = interrupt_came()             # a signal inside a C extension's import comes out as its ImportError
        status, reason = (("interrupted", "SIGTERM" if isinstance(came, Terminated) else "Ctrl-C") if came else
                          ("failed", f"internal error: {type(e).__name__}: {e}"))
        raise
    finally:
        step = session.ctx.step if session.ctx is not None else 0
        ended = E.RunEnded(step=step, status=status, steps_done=len(result.tokens), reason=reason)
        try:
            with shielded():      # a signal now comes after the record's last line, not instead of it
                try:
                    session.bus.release_all()   # what is still queued first (a hold a signal left unmatched)
                finally:
                    session.bus.emit(ended)
        except (GraphdiagError, OSError):
            pass                  # a sink that failed (full disk, closed pipe) already reported why


GC_YOUNG = 20_000   # allocations between young-generation collections during a walk (CPython's default: 700)


@contextlib.contextmanager
def steady_gc():
    """Garbage collection while a plan is walked: the objects built before the walk (model, weights,
    graphs) are frozen out of later collections, and the young generation is collected every GC_YOUNG
    allocations instead of every 700. A replayed step allocates short-lived objects (events, views, lists)
    that reference counting frees; at CPython's threshold young collections land inside timed steps (about
    8 µs each, measured on a CPU twice as fast as the GPU host's), and the older generations' walk
    everything the run keeps. Cycles made during the walk are still collected, those made before it once it
    ends; the previous threshold and the frozen set are restored."""
    gc.freeze()
    old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


class Stepper:
    """Walks the step plan: prefill, decode, idle; checks each step when asked."""

    def __init__(self, s: Session, result: RunResult):
        self.s, self.r = s, result
        self.rng = np.random.default_rng(s.cfg.seed + 1)
        self.next_tok: dict[int, int] = {}
        self.phases: set[str] = set()          # phases the GPU splits took in the current step
        self._next: StepPlan | None = None     # the plan's next decode step, prepared during this one
        self._gpu_time = None                  # the last step's GpuTime, read during the next step
        for be in s.ctx.sched.backends:         # the GPU runtimes add each phase they decide
            if be.is_gpu:
                be.runtime.phases = self.phases
        s.ctx.before_read = self._prepare_next
        s.ctx.logits_in_place = True           # a step's logits are used before the next read (or copied)

    def run(self, plan: list[StepPlan]) -> None:
        """Walk the plan. The bus holds the sinks' events for the whole walk: a step's events reach them
        at the next step's flush (while that step's GPU work runs), the last ones when the walk ends,
        however it ends — so the record and the terminal trail the run by at most one step. Garbage
        collection is steadied for the walk (steady_gc)."""
        with steady_gc():
            self._walk(plan)

    def _walk(self, plan: list[StepPlan]) -> None:
        self.s.bus.hold()
        try:
            steps = iter(plan)
            p = next(steps, None)
            while p is not None:
                raise_if_swallowed()       # a signal whose exception a weakref callback dropped ends it here
                nxt = next(steps, None)
                if p.idle_s:
                    self.s.clock.advance(p.idle_s)
                self._place_graph(p.arena_slot)
                self._next = nxt if nxt is not None and nxt.kind == "decode" else None
                try:
                    self.step(p)
                except CudaError as e:
                    if not recoverable(e):
                        raise
                    # reported (StepFailed) and rolled back: the walk goes on as a caller of llama_decode
                    # that gets -2/-3 back and submits its next batch
                p = nxt
        except BaseException:
            self._gpu_time = None          # a failed walk reads no more timers: its error goes out as it is
            raise
        finally:
            self._next = None
            self.s.bus.release()
            self._read_gpu_time()

    def _read_gpu_time(self) -> None:
        t, self._gpu_time = self._gpu_time, None
        if t is not None:
            t.read()

    def _prepare_next(self) -> None:
        """Between a step's launch and its read-back: the previous step's GPU time is read (its events are
        long done) and the next decode step's token-independent host work done (Context.prepare_decode),
        so both run while the GPU computes instead of between a read-back and the next launch."""
        self._read_gpu_time()
        nxt, self._next = self._next, None
        if nxt is not None:
            self.s.ctx.prepare_decode(range(nxt.batch))

    def _place_graph(self, slot: int) -> None:
        """A timeline that moves the graph's structs (new_arena_every, separate_arena_batch): the next graph
        is built there, so the kept one is dropped (reuse would keep the old pointers)."""
        arena = self.s.model.arena
        if arena.skip != slot:
            arena.skip = slot
            self.s.ctx.invalidate()

    def step(self, p: StepPlan) -> None:
        s, bus = self.s, self.s.bus
        step = s.ctx.step
        self.phases.clear()
        device = getattr(s, "device_source", None)
        if device is not None:
            device.begin_step()
        # the sinks get the step's events once its work is queued; a step on its own delivers everything
        # before it returns (in a run, the run's own hold keeps them until the next step's flush)
        bus.hold()
        try:
            self._step(p, step, device)
        except BaseException as e:
            self._failed(p, step, e, device)
            raise
        finally:
            bus.release()

    def _failed(self, p: StepPlan, step: int, e: BaseException, device) -> None:
        """A step that raised: its GPU timers are given back unread and its device records dropped; unless
        the run is being stopped (Ctrl-C, a closed pipe), the failure is reported (StepFailed). The context
        has rolled the step back already (Context._roll_back); a real (not injected) failure the run goes
        on from is one of the run's failures."""
        s = self.s
        fault, s.fault_fired = s.fault_fired, ""
        if s.gpu is not None:
            s.gpu.take_gpu_time().discard()
        if device is not None:
            with contextlib.suppress(GraphdiagError):
                device.end_step()
        if isinstance(e, (KeyboardInterrupt, BrokenPipeError)):
            return
        rec = recoverable(e)
        s.bus.emit(E.StepFailed(step=step, t_ns=s.bus.clock(), error=f"{type(e).__name__}: {e}", fault=fault,
                                status=-2 if isinstance(e, OutOfDeviceMemory) else -3, recoverable=rec,
                                phase=p.kind))
        if rec and not fault:
            self.r.failures.append(f"step {step} failed: {e} (rolled back; the run went on)")

    def _step(self, p: StepPlan, step: int, device) -> None:
        s, bus = self.s, self.s.bus
        t0 = time.perf_counter_ns()
        if p.fault:
            s.faults.arm(p.fault)
        if s.router_tap is not None:
            s.router_tap.clear()                   # this step's choices only
        try:
            with bus.span("step", "run/step", step, step):
                if p.kind == "prefill":
                    if s.cfg.prompt_ids and p.initial:     # a sequence's prompt (the plan's first steps)
                        toks = list(s.cfg.prompt_ids[p.offset:p.offset + p.n_tokens])
                    else:
                        toks = self.rng.integers(1, s.model.cfg.n_vocab, p.n_tokens).tolist()
                    logits = s.ctx.prefill(toks, seq=p.seq, n_outputs=p.n_outputs)
                    batch = {p.seq: toks}
                elif p.kind == "ubatch":                   # a replayed caller's ubatch, as it gave it
                    logits = s.ctx.caller_ubatch(p.token_ids, p.positions, p.seq_ids, p.n_outputs, p.removes)
                    batch = {}                         # its tokens are the caller's: nothing is fed back
                else:
                    batch = {q: self.next_tok.get(q, 1 + q) for q in range(p.batch)}
                    logits = s.ctx.decode(batch)
        finally:
            if p.fault and not s.faults.disarm():
                bus.emit(E.FaultMissed(step=step, t_ns=bus.clock(), fault=p.fault, calls=calls_of(p.fault)))
        s.fault_fired = ""
        dt = time.perf_counter_ns() - t0
        # the GPU time is read later (GpuTime.fill, when the sinks get the event: after the next launch)
        if self._gpu_time is not None:         # the previous step's, unread (no step ran in between)
            self._read_gpu_time()
        gpu_time = self._gpu_time = s.gpu.take_gpu_time() if s.gpu is not None else None
        if device is not None:
            self._device_time(step, device)
        seqs = list(batch)
        # decisions-only: the logits are not computed, so neither are tokens (the next step feeds the same
        # placeholders; no decision depends on token values)
        out = logits.argmax(axis=1).tolist() if s.computes else []
        for q, t in zip(seqs[len(seqs) - len(out):], out):
            self.next_tok[q] = t
        ph = self.phases
        mode = "eager" if "eager" in ph else "capture" if "capture" in ph else "replay" if "replay" in ph else "cpu"
        # posted: step, split, key, uid, t_ns, device, duration_ns, gpu_ns (filled in), tokens, mode
        bus.post(E.StepFinished, step, -1, 0, 0, bus.clock(), 0, dt, 0, tuple(out), mode,
                 complete=None if gpu_time is None else gpu_time.fill)
        self.r.tokens.append(out)
        checks = time.monotonic_ns()
        if s.cfg.verify and mode == "replay":
            logits = logits.copy()             # in the read buffer, which the recompute's read reuses
            self._verify(step, logits)
        if s.reference is not None and p.kind != "ubatch":   # the oracle follows graphdiag's own plans only
            self._oracle(step, p, batch, logits)
        s.own_ns += time.monotonic_ns() - checks   # llama.cpp checks nothing: off the eviction clock

    def _device_time(self, step: int, device) -> None:
        from .report.sources.attribution import device_time
        records = device.end_step()
        self.s.bus.emit(device_time(step, device.source, records))
        for sink in self.s.device_sinks:
            self.s.bus.guarded(sink, step, records)   # cut off with its owner when it raises

    def _verify(self, step: int, logits: np.ndarray) -> None:
        ctx = self.s.ctx
        with self.s.gpu.verifying():
            ctx.recompute()
        eager = ctx._logits()
        diff = float(np.max(np.abs(eager - logits))) if eager.size else 0.0
        ok = diff == 0.0
        self.s.bus.emit(E.VerifyResult(step=step, ok=ok, max_abs_diff=diff))
        if not ok:
            self.r.failures.append(f"step {step}: replay differs from eager (max |diff| {diff:.3g})")

    def _oracle(self, step: int, p: StepPlan, batch: dict, logits: np.ndarray) -> None:
        def forward(ref: Reference, hook=None) -> np.ndarray:
            ref.router = hook
            try:
                return ref.prefill(batch[p.seq], seq=p.seq) if p.kind == "prefill" else ref.decode(batch)
            finally:
                ref.router = None

        s, follow, probe = self.s, None, None
        n = len(batch[p.seq]) if p.kind == "prefill" else len(batch)     # the step's tokens
        if s.router_tap is not None:           # twins first: their router logits are the near-tie rule's noise
            follow = RouterFollow()
            outputs = (n - 1,) if p.kind == "prefill" else ()   # a prefill's logits are its last row's, and its
            follow.start(s.router_tap.take(n, outputs))           # last layer's MoE runs on that row alone
        elif s.reference_noise and s.model.cfg.is_moe:   # a CUDA run: its choices guessed where it fails
            probe = Probe()
        hook, saved = follow if follow is not None else probe, None
        if hook is not None:                   # the twins' states, and the oracle's where it may guess
            saved = ([twin.snapshot() for twin in s.reference_noise],
                     s.reference.snapshot() if probe is not None else None)
            noisy, want = self._references(forward, hook, saved)
        else:
            noisy = [forward(twin) for twin in s.reference_noise]
            want = forward(s.reference)
        if not logits.size:                    # a ubatch with no outputs: the reference's cache kept up only
            return
        bound = ORACLE_BOUND.get(s.cfg.wtype, ORACLE_BOUND["f16"])   # the CPU backend: f32 vs f64
        if s.cfg.backend != "cpu" and s.cfg.wtype == "f16" and n > MMF_MAX_COLUMNS:
            bound = ORACLE_F16_GEMM_BOUND      # the cuBLAS path's F16 GEMM results (events/checks.py)
        ev = judge(step, logits, want, noisy, bound,    # noisy: the twins (Q8_1, or a float MoE run's)
                   *((len(follow.followed), len(follow.refused)) if follow is not None else ()))
        if probe is not None and not ev.ok:
            for run in guesses(probe, near_ties(probe)):
                guess = RouterFollow()
                guess.start(run)
                noisy_g, want_g = self._references(forward, guess, saved, restore=True)
                ev_g = judge(step, logits, want_g, noisy_g, bound, len(guess.followed), len(guess.refused))
                if ev_g.ok:
                    ev = ev_g
                    break
            else:                             # none within the bound: the oracle's own choices, as judged
                self._references(forward, Probe(), saved, restore=True)
        s.bus.emit(ev)
        line = failure_line(ev)
        if line is not None:
            self.r.failures.append(line)
        self.r.failures.extend(refusal_line(step, d) for d in (follow.refused if follow is not None else ()))

    def _references(self, forward, follow: RouterFollow, saved: tuple, restore: bool = False):
        """(the twins' logits, the oracle's) of one step with `follow` as the router hook: the twins record their
        router logits, the oracle decides, and where it followed a choice the twins run again taking it. From
        the states in `saved` ((twins', oracle's) snapshots) when `restore`."""
        s = self.s
        if restore:
            for twin, state in zip(s.reference_noise, saved[0]):
                twin.restore(state)
            s.reference.restore(saved[1])
        noisy = [forward(twin, follow.record) for twin in s.reference_noise]
        want = forward(s.reference, follow.decide)
        floats = any(twin.jitter_floats for twin in s.reference_noise)
        if follow.followed or floats:          # the twins again, taking the experts the oracle took (a float
            for twin, state in zip(s.reference_noise, saved[0]):   # run's: all of them, RouterFollow.force_all)
                twin.restore(state)
            noisy = [forward(twin, follow.force_all if floats else follow.force) for twin in s.reference_noise]
        return noisy, want


def run_cli(settings: dict, scenario: str | None = None, events_path: str | None = None, as_json: bool = False,
            verbosity: int = 0, out=None, err=None, timeline_path: str | None = None, cupti: bool = False, strict: bool = False) -> int:
    """`graphdiag run`: resolve settings (CLI > scenario > env), validate everything before anything is
    built, run with live sinks, render the summary.

    Exit status: 0, or 1 when a check failed (--verify, --oracle, a scenario's expectations). Ctrl-C (or
    SIGTERM) prints the summary so far and raises RunInterrupted (130; 143); the record ends with a
    RunEnded event either way. `--events -` writes the record to `out` (stdout) and everything else the
    run prints to `err`, so stdout holds only JSON lines."""
    import os
    import sys

    from .config import resolve, validate_run
    from .scenario import load_scenario

    out, err = out or sys.stdout, err or sys.stderr
    _distinct_outputs(events_path, timeline_path)
    record_stream = None
    if events_path == "-":
        record_stream, out = out, err
    sc = load_scenario(scenario) if scenario else None
    environ = sc.environ(os.environ) if sc else os.environ
    cfg = resolve(settings, sc.run if sc else None, environ=environ, env_origins=sc.env_origins() if sc else None)
    for w in validate_run(cfg, sc, as_json=as_json, verbosity=verbosity):
        err.write(f"graphdiag: warning: {w}\n")
    header, events = {}, E.Recorder()
    try:                                    # SIGTERM is an interrupt here: cli.main's terminate_as_interrupt
        result = _run_with_sinks(cfg, sc, events_path, as_json, verbosity, out, header, events,
                                 timeline_path=timeline_path, cupti=cupti, err=err,
                                 record_stream=record_stream)
    except Exception:                       # a signal inside a C extension's import comes out as its ImportError
        came = interrupt_came()
        if came is None or not header:
            raise
        _interrupted_summary(header, events, sc, as_json, out, strict, came)
    except KeyboardInterrupt as e:
        if not header:                      # before the run started: nothing ran, no record; main says so
            raise
        _interrupted_summary(header, events, sc, as_json, out, strict, e)
    return _render_result(result, sc, as_json, out, strict)


def _interrupted_summary(header: dict, events, sc, as_json: bool, out, strict: bool, came: BaseException):
    """The summary of the steps an interrupted run did, then RunInterrupted (main's one line and status)."""
    _render_result(RunResult(header, events.events, Counters()), sc, as_json, out, strict)
    ended = next((ev for ev in reversed(events.events) if isinstance(ev, E.RunEnded)), None)
    step = ended.step if ended is not None else 0
    if not as_json:
        out.write(f"interrupted at step {step} (summary of the steps so far)\n")
    raise RunInterrupted(step, terminated=isinstance(came, Terminated)) from None


def _distinct_outputs(events_path: str | None, timeline_path: str | None) -> None:
    """--events and --timeline naming one file (by path, link or hard link) is bad input."""
    import os

    from .errors import UsageError
    if not events_path or not timeline_path or "-" in (events_path, timeline_path):
        return
    same = os.path.realpath(events_path) == os.path.realpath(timeline_path)
    if not same and os.path.exists(events_path) and os.path.exists(timeline_path):
        same = os.path.samefile(events_path, timeline_path)
    if same:
        raise UsageError(f"--events and --timeline name the same file ({events_path}): give each its own")


def _run_with_sinks(cfg: RunConfig, sc, events_path, as_json: bool, verbosity: int, out, header: dict,
                    recorder, timeline_path=None, cupti: bool = False, err=None, record_stream=None) -> RunResult:
    """Show the record and the timeline writable (before any model is built: a path that cannot be written
    fails first; they are opened once the run starts, so a refused run leaves them as they were), wire the
    console, the record and NVTX, run, close every one however the run ends (each close
    tried, a second Ctrl-C or a SIGTERM held back until the files are written). `header` and `recorder`
    keep what an interrupted run leaves. The record is essential (its failure ends the run); the console,
    the timeline and NVTX are cut off alone when they fail."""
    import sys

    from .report.sinks.console import ConsoleReporter
    from .report.record.write import JsonlWriter

    err = err or sys.stderr
    outputs = []                             # what the finally closes, in order
    try:
        writer = None
        if record_stream is not None:
            writer = JsonlWriter("<stdout>", stream=record_stream)
        elif events_path:
            writer = JsonlWriter(events_path)
        timeline = None
        if timeline_path:                    # the trace-event timeline: every event, spans and device records
            from .report.sinks.timeline import TimelineWriter
            timeline = TimelineWriter(timeline_path)
        outputs = [o for o in (timeline, writer) if o is not None]
        console = ConsoleReporter(None, verbosity, file=out, total_steps=len(plan_steps(cfg, sc)),
                                  progress=None if not as_json else False)
        outputs.insert(0, console)
        sinks, starts = [recorder], [header.update]
        if writer is not None:               # the record first: it must get every event, whatever the console does
            sinks.append(writer)
            starts.append(writer.start)
        if not as_json:
            sinks.append(console)
            starts.append(console.start)
        span_sinks, device_sinks = [], []
        if timeline is not None:
            span_sinks.append(timeline)
            device_sinks.append(timeline.add_device)
            starts.append(timeline.start)
        if cfg.nvtx:
            from .report.sinks.nvtx_sink import NvtxSink
            nv = NvtxSink()
            if nv.enabled:
                span_sinks.append(nv)
                outputs.append(nv)
        return run(cfg, sc, sinks, span_sinks, on_header=lambda h: [f(h) for f in starts], device_sinks=device_sinks,
                   cupti=cupti or timeline is not None,
                   warn=lambda w: err.write(f"graphdiag: warning: {w}\n"), essential=[recorder, writer])
    finally:
        with shielded(), releasing() as release:
            for o in outputs:
                if o is not timeline or header:     # a run refused before it started leaves the file as it was
                    release(o.close)


def _render_result(result: RunResult, sc, as_json: bool, out, strict: bool = False) -> int:
    """The summary (tables or JSON), the steps table, failures and the scenario's verdict; 1 if any failed."""
    import json

    from .report.views.console import render_summary
    from .report.analysis.summary import summarize
    from .scenario import check_expectations

    summary = summarize(result.header, result.events)
    failures = list(result.failures)
    if sc is not None and summary.ended is not None and summary.ended.status == "complete":
        failures += [f"scenario {sc.name}: {f}" for f in check_expectations(sc, summary)]
    if strict and summary.ended is not None and summary.ended.status == "complete":
        failures += [f"strict: {f}" for f in summary.strict]     # --strict: each cause fails the run
    if as_json:
        d = json.loads(summary.to_json())
        d["failures"] = failures
        if sc is not None and getattr(sc, "cause", ""):
            d["cause"] = sc.cause
        out.write(json.dumps(d, indent=2) + "\n")
    else:
        from .report.views.steps import render_steps
        render_summary(summary, file=out)
        from .report.analysis.measured import simulated_timings
        mf = result.header.get("model_file") or {}
        if mf:
            from .model.gguf_io import detokenizer
        render_steps(result.events, file=out, simulated=simulated_timings(result.header),
                     tokens_computed=result.header.get("sim_mode") != "decisions",
                     text=detokenizer(mf["path"]) if mf else None)
        for f in failures:
            out.write(f"FAILED: {f}\n")
        if sc is not None and not failures and summary.ended is not None and summary.ended.status == "complete":
            # a scenario without [expect] checked nothing: say so rather than claim anything held
            out.write(f"scenario {sc.name}: {'every expectation holds' if sc.expect else 'no expectations to check'}\n")
        if sc is not None and getattr(sc, "cause", ""):
            out.write(f"cause: {sc.cause}\n")
    return 1 if failures else 0

"""Failed steps and injected faults (pure analysis over events: events in, data out).

For each failed step: what failed (the driver call and its result, the fault behind it if one was
injected), what was released (an unfinished capture, executables, the ubatch's KV cells) and how the run
went on — the next step that finished, and when each released key replayed again. A failure is recovered
when a later step finished; a failure that ended the run, or came at its last step, is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import events as E


@dataclass
class StepFailure:
    step: int
    phase: str                     # "prefill" | "decode"
    error: str
    fault: str = ""                # the injected fault's kind ("" for a real failure)
    call: str = ""                 # the driver call the fault failed
    result: str = ""               # and the result it returned
    status: int = -3               # what llama_decode returns (-2 allocation failed, -3 compute failed)
    recoverable: bool = False
    released: list[str] = field(default_factory=list)
    recovered_at: int = -1         # the next step that finished (-1: none did)
    went_on: str = ""              # how the run went on, one line

    @property
    def recovered(self) -> bool:
        return self.recoverable and self.recovered_at >= 0

    def line(self) -> str:
        what = f"fault {self.fault!r} injected: {self.call} returned {self.result}" if self.fault else self.error
        released = "; ".join(self.released) or "nothing held"
        return f"step {self.step} ({self.phase}) failed: {what} · released: {released} · {self.went_on}"


@dataclass
class Faults:
    failures: list[StepFailure] = field(default_factory=list)
    injected: int = 0
    missed: list[str] = field(default_factory=list)      # "step 12: 'update' never fired (no cuGraphExecUpdate)"
    absorbed: list[str] = field(default_factory=list)    # faults that fired in a step that still finished

    @property
    def unrecovered(self) -> list[StepFailure]:
        return [f for f in self.failures if not f.recovered]


def faults(events) -> Faults:
    """Every failed step with what it released and how the run went on; faults that missed or were absorbed."""
    out = Faults()
    released: dict[int, list[str]] = {}                   # step -> what it released (before its StepFailed)
    fired: dict[int, E.FaultInjected] = {}
    finished: list[tuple[int, str]] = []                  # (step, mode) of every finished step
    released_keys: dict[int, list[int]] = {}              # failed step -> keys whose graphs were released
    replays: dict[int, list[int]] = {}                    # key -> steps it replayed at
    for ev in events:
        match ev:
            case E.FaultInjected():
                out.injected += 1
                fired[ev.step] = ev
            case E.FaultMissed():
                out.missed.append(f"step {ev.step}: fault {ev.fault!r} never fired (the step made no {ev.calls})")
            case E.StepFailed():
                f = fired.get(ev.step)
                out.failures.append(StepFailure(ev.step, ev.phase, ev.error, ev.fault, f.call if f else "",
                                                f.error if f else "", ev.status, ev.recoverable))
            case E.EntryReset():
                ended = ", capture ended" if ev.capture_ended else ""
                released.setdefault(ev.step, []).append(f"key {ev.key:#x}: {ev.n_executables} executable(s){ended}")
                released_keys.setdefault(ev.step, []).append(ev.key)
            case E.CellsRemoved():
                released.setdefault(ev.step, []).append(f"KV seq {ev.seq} pos [{ev.pos_min}, +inf): {ev.n_cells} cell(s)")
            case E.StepFinished():
                finished.append((ev.step, ev.mode))
                if ev.step in fired:
                    x = fired[ev.step]
                    out.absorbed.append(f"step {ev.step}: fault {x.fault!r} ({x.call} {x.error}) was absorbed: "
                                        f"the step finished ({ev.mode})")
            case E.ReplayLaunched():
                replays.setdefault(ev.key, []).append(ev.step)
    for sf in out.failures:
        sf.released = released.get(sf.step, [])
        _went_on(sf, finished, released_keys.get(sf.step, []), replays)
    return out


def _went_on(sf: StepFailure, finished: list[tuple[int, str]], keys: list[int], replays: dict) -> None:
    if not sf.recoverable:
        sf.went_on = "the run ended (not recoverable)"
        return
    nxt = next(((s, m) for s, m in finished if s > sf.step), None)
    if nxt is None:
        sf.went_on = "NOT RECOVERED: no step finished after it"
        return
    sf.recovered_at = nxt[0]
    again = [f"key {k:#x} replays again from step {r}" for k in keys
             for r in [next((s for s in replays.get(k, []) if s > sf.step), -1)] if r >= 0]
    sf.went_on = f"recovered: step {nxt[0]} finished ({nxt[1]})" + (f"; {'; '.join(again)}" if again else "")

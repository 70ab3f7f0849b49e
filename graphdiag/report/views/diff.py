"""Text rendering of a RunDiff or a StepDiff (control / test / delta vocabulary)."""

from __future__ import annotations

from typing import TextIO

from .tables import SIMULATED_TIMES, make_console, table
from ..analysis.diff import Change, Delta, RunDiff, StepDiff, TimingDelta
from ..analysis.measured import timing_name
from ..analysis.eventlog import fmt_ns
from ..analysis.node_diff import CaptureNodeDiff, CaptureRef

MOST_FIELDS = 20     # differing fields rendered per capture; the JSON output keeps all of them


def render_run_diff(d: RunDiff, file: TextIO | None = None) -> None:
    """Settings, result line, counters and timings that differ, capture facts, node rows of captured
    graphs (the first MOST_FIELDS differing fields per capture), first divergent step, tokens."""
    con = make_console(file)
    con.print(f"graphdiag diff · control: {d.control} · test: {d.test}", markup=False)
    con.print(_verdict(d), markup=False)
    if d.simulated[0] != d.simulated[1]:
        con.print(f"note: {timing_note(d)}", markup=False)
    for t in (_settings_table(d), _counter_table(d), _device_table(d), _timing_table(d), _ledger_table(d)):
        if t is not None:
            con.print("")
            con.print(t)
    render_node_diffs(con, d.nodes, "Captured graphs: node rows that differ (LedgerCaptured; key by first-seen "
                                    "order, captures numbered per phase)")
    if d.first_divergence is not None:
        con.print("")
        con.print(f"First divergent step: {d.first_divergence.step_control}", markup=False)
        for line in change_lines(d.first_divergence.changes):
            con.print(line, markup=False)
    con.print("")
    tokens = ("identical at every common step" if d.tokens_differ_at is None
              else f"first differ at step {d.tokens_differ_at}")
    if d.tokens_not_computed:
        tokens = f"not computed in {' and '.join(d.tokens_not_computed)} (decisions-only simulator)"
    con.print(f"Tokens: {tokens}", markup=False)


def render_step_diff(d: StepDiff, source: str, file: TextIO | None = None) -> None:
    """Two steps of one run: the result line, then each decision removed, added or changed."""
    con = make_console(file)
    con.print(f"graphdiag diff · {source} · step {d.step_control} (control) vs step {d.step_test} (test)",
              markup=False)
    con.print(_step_verdict(d), markup=False)
    for line in change_lines(d.changes):
        con.print(line, markup=False)
    render_node_diffs(con, d.nodes, f"Captured graphs in force at step {d.step_control} (control) and step "
                                    f"{d.step_test} (test): node rows that differ")


def _step_verdict(d: StepDiff) -> str:
    if d.equal:
        return "result: EQUAL (same decisions, same captured graphs in force)"
    parts = [f"{len(d.changes)} decisions differ"] if d.changes else []
    if d.nodes:
        parts.append(f"{len(d.nodes)} captured graphs in force differ")
    return f"result: DIFFERENT ({'; '.join(parts)})"


def render_node_diffs(con, diffs: list[CaptureNodeDiff], title: str, most: int = MOST_FIELDS) -> None:
    """Per pair of captures a headline (key, which captures, how many fields differ), then a table of the
    first `most` differing fields and a '… N more' line for the rest."""
    if not diffs:
        return
    con.print("")
    con.print(title, markup=False)
    for c in diffs:
        con.print(_capture_headline(c), markup=False)
        if not c.changes:
            continue
        t = table("", "node", "field", "control", "test", "change", left=("node", "control", "test"))
        for ch in c.changes[:most]:
            t.add_row(f"{ch.node} {ch.name}", ch.field, _value(ch.control), _value(ch.test), ch.change)
        con.print(t)
        if len(c.changes) > most:
            con.print(f"  … {len(c.changes) - most} more (every field is in --json)", markup=False)


def _capture_headline(c: CaptureNodeDiff) -> str:
    def side(ref: CaptureRef | None) -> str:
        return "none" if ref is None else f"{ref.label} at step {ref.step}, {ref.n_nodes} nodes"
    if c.control is None or c.test is None:
        what = "test only" if c.control is None else "control only"
    else:
        what = f"{len(c.changes)} field{'s' if len(c.changes) != 1 else ''} differ"
    return f"{c.key} · control: {side(c.control)} · test: {side(c.test)} · {what}"


def _value(v) -> str:
    return "-" if v is None else str(v)


def change_lines(changes: list[Change]) -> list[str]:
    """'  changed  control: …' / '           test:    …' lines."""
    lines = []
    for c in changes:
        label = f"  {c.change:<8} "
        if c.control is not None:
            lines.append(f"{label}control: {c.control}")
            label = " " * len(label)
        if c.test is not None:
            lines.append(f"{label}test:    {c.test}")
    return lines


def _verdict(d: RunDiff) -> str:
    if d.equal:
        return "result: EQUAL (same decisions at every step, same counters, same capture ledgers)"
    parts = []
    if d.first_divergence is not None:
        parts.append(f"decisions diverge at step {d.first_divergence.step_control}")
    n = sum(1 for c in d.counters if c.delta)
    if n:
        parts.append(f"{n} counters differ")
    if d.ledger:
        parts.append(f"{len(d.ledger)} capture ledger facts differ")
    if d.nodes:
        n = sum(len(c.changes) for c in d.nodes)
        parts.append(f"{n} node fields differ in {len(d.nodes)} captures")
    return f"result: DIFFERENT ({'; '.join(parts)})"


def _settings_table(d: RunDiff):
    if not d.settings:
        return None
    t = table("Settings that differ", "setting", "control", "test", left=("control", "test"))
    for s in d.settings:
        t.add_row(s.name, _with_source(s.control, s.control_source), _with_source(s.test, s.test_source))
    return t


def _with_source(value, source: str) -> str:
    return str(value) if source == "default" else f"{value} [{source}]"


def _counter_table(d: RunDiff):
    changed = [c for c in d.counters if c.delta]
    if not changed:
        return None
    t = table(f"Counters that differ ({len(d.counters) - len(changed)} equal)", "counter", "control", "test",
              "delta")
    for c in changed:
        t.add_row(c.name, str(c.control), str(c.test), f"{c.delta:+d}")
    return t


def _device_table(d: RunDiff):
    """Per-device outcomes (split calls), when either run was on several devices: every row, equal or not."""
    if not d.devices:
        return None
    t = table("Per device (split calls; a one-device run is all dev0)", "counter", "control", "test", "delta")
    for c in d.devices:
        t.add_row(c.name, "-" if c.control is None else str(c.control), "-" if c.test is None else str(c.test),
                  "-" if c.delta is None else f"{c.delta:+d}")
    return t


def timing_note(d: RunDiff) -> str:
    """What the timing comparison is worth when a simulated run is involved ("" when both are real)."""
    a, b = d.simulated
    if a and b:
        return SIMULATED_TIMES
    if a or b:
        sim, real = ("control", "test") if a else ("test", "control")
        return f"{sim} is SIMULATED (host times), {real} ran on a GPU: these timings do not compare"
    return ""


def _timing_table(d: RunDiff):
    """Medians of both runs, the delta, the runs' combined spread (± MAD of control + of test) and the
    change: a percentage, "noise" within the spread, "(1 sample)" where a side has one sample only."""
    if not d.timings:
        return None
    note = timing_note(d)
    sim = any(d.simulated)
    t = table(f"Timing (medians) — {note}" if note else "Timing (medians)", "what", "control", "test", "delta",
              "spread", "change")
    for m in d.timings:
        spread = "-" if m.delta is None else "±" + fmt_ns(m.control_spread + m.test_spread)
        t.add_row(timing_name(m.name, sim), _ns(m.control), _ns(m.test), _signed_ns(m), spread, _change(m))
    t.caption = "change within the spread (median absolute deviations of both runs' samples) reads noise"
    t.caption_justify = "left"
    return t


def _change(m: TimingDelta) -> str:
    verdict = m.verdict
    if verdict == "1 sample":
        return "(1 sample)"
    return "noise" if verdict == "noise" else _percent(m)


def _ns(v: int | None) -> str:
    return "-" if v is None else fmt_ns(v)


def _signed_ns(m: Delta) -> str:
    if m.delta is None:
        return "-"
    return ("+" if m.delta >= 0 else "-") + fmt_ns(abs(m.delta))


def _percent(m: Delta) -> str:
    if m.delta is None or not m.control:
        return "-"
    return f"{100 * m.delta / m.control:+.0f}%"


def _ledger_table(d: RunDiff):
    if not d.ledger:
        return None
    t = table("Captured graphs: facts that differ (key by first-seen order, captures numbered per phase)", "key",
              "capture", "node", "field", "control", "test", "change", left=("capture", "control", "test"))
    for c in d.ledger:
        t.add_row(c.key, f"{c.phase} #{c.capture}".lstrip(), c.node, c.field, c.control or "-", c.test or "-",
                  c.change)
    return t

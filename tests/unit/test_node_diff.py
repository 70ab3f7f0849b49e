"""Node-level ledger comparison (LedgerCaptured rows), its event-log lines, and what the summary ignores."""

from __future__ import annotations

from graphdiag import events as E
from graphdiag.report.analysis.eventlog import EventLog
from graphdiag.report.analysis.node_diff import captures_by_key, compare_rows, row_fields
from graphdiag.report.analysis.summary import summarize
from support import synth

ROW = (3, "inp_embd", "GET_ROWS", "F32", (512, 1, 1, 1), (4, 2048, 2048, 2048), "c3cce9a0", 16, "b1+0x800",
       ((0, (512, 4096, 1, 1), (2, 1024, 4194304, 4194304), "b0+0x0"), (1, (1, 1, 1, 1), (4, 4, 4, 4), "b1+0x0")))


def _changes(a, b):
    return [(c.node, c.name, c.field, c.control, c.test, c.change) for c in compare_rows(a, b)]


def test_row_fields_are_the_paths_a_diff_names():
    f = row_fields(ROW)
    assert list(f)[:6] == ["name", "op", "type", "ne[0]", "ne[1]", "ne[2]"]
    assert (f["ne[1]"], f["nb[3]"], f["op_params"], f["flags"], f["data"]) == (1, 2048, "c3cce9a0", 16, "b1+0x800")
    assert (f["src[0].ne[1]"], f["src[1].nb[0]"], f["src[1].data"]) == (4096, 4, "b1+0x0")


def test_compare_rows_names_node_field_control_and_test():
    assert _changes((ROW,), (ROW,)) == []
    b = synth.edit_ledger((None, [E.LedgerCaptured(nodes=(ROW,))]), 3, "ne[1]", 2)[1][0].nodes
    b = synth.edit_ledger((None, [E.LedgerCaptured(nodes=b)]), 3, "src[0].data", "b0+0x40")[1][0].nodes
    assert _changes((ROW,), b) == [(3, "inp_embd", "ne[1]", 1, 2, "changed"),
                                   (3, "inp_embd", "src[0].data", "b0+0x0", "b0+0x40", "changed")]


def test_compare_rows_added_and_removed_nodes_and_sources():
    second = (4, "norm-0", "RMS_NORM", "F32", (512, 1, 1, 1), (4, 2048, 2048, 2048), "7a512cb2", 16,
              "b1+0x1000", ((0, (512, 1, 1, 1), (4, 2048, 2048, 2048), "b1+0x800"),))
    assert _changes((ROW,), (ROW, second)) == [
        (1, "norm-0", "node", None, "norm-0 (RMS_NORM) ne [512, 1, 1, 1] @ b1+0x1000", "added")]
    assert _changes((ROW, second), (ROW,))[0][-1] == "removed"
    one_src = ROW[:9] + (ROW[9][:1],)
    assert _changes((ROW,), (one_src,)) == [(3, "inp_embd", "src[1]", "ne [1, 1, 1, 1] @ b1+0x0", None, "removed")]


def test_captures_are_numbered_per_key_and_phase():
    events = [E.StepStarted(step=0, phase="prefill"), E.LedgerCaptured(step=0, key=7, nodes=(ROW,)),
              E.StepStarted(step=1, phase="decode"), E.LedgerCaptured(step=1, key=7, nodes=(ROW,)),
              E.StepStarted(step=2, phase="decode"), E.LedgerCaptured(step=2, key=7, nodes=()),
              E.LedgerCaptured(step=2, key=9, nodes=(ROW,))]
    caps = captures_by_key(events, lambda k: f"key{k}")
    assert [(c.ref.label, c.ref.step, c.ref.n_nodes) for c in caps["key7"]] == \
        [("prefill #0", 0, 1), ("decode #0", 1, 1), ("decode #1", 2, 0)]
    assert [c.ref.label for c in caps["key9"]] == ["decode #0"]


def _lines(events, level):
    log = EventLog()
    return [line for ev in events for lvl, line in log.feed(ev) if lvl <= level]


def test_eventlog_property_diff_names_other_changed_nodes_at_v_only():
    diff = E.PropertyDiff(step=5, split=0, key=0x10, node=3, node_name="inp_embd", field="ne[1]", old="1",
                          new="2", n_changed_nodes=12, changed=tuple(range(3, 15)))
    events = [diff, E.PhaseDecided(step=5, split=0, key=0x10, phase="eager", why="properties changed")]
    v = _lines(events, 1)
    assert "step 5 · split 0 · key 0x10 · node 3 inp_embd ne[1] 1→2 (+11 more nodes: 4, 5, 6, 7, 8, 9, 10, 11, …)" in v
    (default,) = _lines(events, 0)
    assert default.endswith("node 3 inp_embd ne[1] 1→2 (+11 more nodes)")
    few = E.PropertyDiff(step=5, key=0x10, node=3, node_name="x", field="data", old="a", new="b",
                         n_changed_nodes=3, changed=(3, 40, 41))
    assert _lines([few], 1)[0].endswith("(+2 more nodes: 40, 41)")
    old_record = E.PropertyDiff(step=5, key=0x10, node=3, node_name="x", field="data", old="a", new="b",
                                n_changed_nodes=3)
    assert _lines([old_record], 1)[0].endswith("(+2 more nodes)")


def test_eventlog_ledger_captured_only_at_vv():
    ev = E.LedgerCaptured(step=2, split=0, key=0x10, nodes=(ROW, ROW))
    assert _lines([ev], 1) == []
    assert _lines([ev], 2) == ["step 2 · split 0 · key 0x10 · ledger: 2 nodes recorded"]


def test_summary_ignores_ledger_captured():
    header, events = synth.steady_decode()
    without = [e for e in events if not isinstance(e, E.LedgerCaptured)]
    assert len(without) < len(events)
    assert summarize(header, events) == summarize(header, without)

"""A layer split over two simulated devices (issue 13): layer assignment, cross-device copies, one graph
cache per device, determinism, logits against the one-device run, bad input, old records."""

import json

import numpy as np
import pytest
from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.ir.tensor import Tensor
from graphdiag.report.record import read_record
from graphdiag.report.analysis.summary import summarize
from graphdiag.runner import ORACLE_BOUND, Session
from graphdiag.sched.devices import LayerSplit, split_points
from support.decisions import decision_stream, first_difference
from support.simrun import of, run_sim


# -- layer assignment (pure) ----------------------------------------------------------------------------
@pytest.mark.parametrize("n_layer, shares, want", [
    (4, (1, 1), (0, 0, 0, 1, 1)),          # 5 offloadable layers (4 + output) over points 0.5, 1
    (4, (1, 3), (0, 0, 1, 1, 1)),          # uneven: 0.25 -> layers 0-1 on device 0
    (4, (3, 1), (0, 0, 0, 0, 1)),          # device 1 holds only the output layer
    (4, (0, 1), (1, 1, 1, 1, 1)),          # a zero share: no layer there
    (8, (1, 1, 2), (0, 0, 0, 1, 1, 2, 2, 2, 2)),   # points 0.25, 0.5, 1 over il / 9
])
def test_layers_follow_cumulative_split_points(n_layer, shares, want):
    assert LayerSplit.of(n_layer, shares).layers == want


@pytest.mark.parametrize("given, free_read", [(None, True), ((0, 0), True), ((0.0, 0.0, 0.0), True),
                                               ((0, 1), False), ((3, 1), False)])
def test_no_shares_or_all_zero_shares_split_by_free_memory(given, free_read):
    read = []
    free = lambda: read.append(1) or [3 << 30, 1 << 30]       # noqa: E731
    s = LayerSplit.chosen(4, given if given is None or len(given) == 2 else given[:2], free)
    assert bool(read) == free_read
    assert s.shares_from == ("free memory" if free_read else "--tensor-split")
    if free_read:
        assert s.layers == LayerSplit.of(4, (3, 1)).layers


def test_split_points_are_float32_cumulative_shares():
    pts = split_points((1, 1, 1))
    assert pts[-1] == 1.0 and pts[0] == float(np.float32(1) / np.float32(3))


def test_tensors_and_norms_follow_their_layer():
    s = LayerSplit.of(4, (1, 1))
    assert s.tensor_device("blk.3.attn_q.weight") == 1 and s.tensor_device("blk.2.ffn_up.weight") == 0
    assert s.tensor_device("cache_k_l3") == 1 and s.tensor_device("cache_v_l0") == 0
    assert s.tensor_device("output.weight") == 1 and s.tensor_device("output_norm.weight") == 1
    assert s.tensor_device("token_embd.weight") == 0
    assert s.node_device("norm-3") == 1 and s.node_device("norm") is None and s.node_device("attn_norm-3") is None


# -- the scheduler's cut and the copies ----------------------------------------------------------------
def _session(**kw):
    cfg = resolve({"backend": "sim", "prompt_tokens": 8, "steps": 1, **kw}, environ={})
    return Session(cfg, E.EventBus())


def _names(sched, sp):
    return [Tensor(sched.arena, int(i)).name for i in sched.graph.nodes[sp.i_start:sp.i_end]]


@pytest.mark.parametrize("split, last0", [("1,1", 2), ("1,3", 1)])
def test_graph_cut_per_device_with_copies_as_split_inputs(split, last0):
    s = _session(devices=2, tensor_split=split)
    try:
        s.ctx.decode([1])
        sched = s.ctx.sched
        assert [sp.backend for sp in sched.splits] == [0, 1]
        first, second = sched.splits
        assert first.inputs == [] and _names(sched, first)[-1] == f"l_out-{last0}"
        copied = [Tensor(sched.arena, c).name for c, _, _ in second.inputs]
        assert copied[0] == f"SIM1#l_out-{last0}#0"                # the one activation crossing
        assert {"SIM1#inp_pos#0", "SIM1#k_idxs#0", "SIM1#v_idxs#0"} <= set(copied)   # graph inputs, per device
        assert _names(sched, second)[len(copied)] == f"norm-{last0 + 1}"   # the norm pinned to its layer
        assert _names(sched, second)[-1] == "result_output"
        d1 = s.devices.drivers[1]
        assert d1.space.owns(s.model.layers[-1].wq.data) and d1.space.owns(s.model.output.data)
        assert s.devices.drivers[0].space.owns(s.model.layers[0].k_cache.data)
    finally:
        s.close()


def test_peer_copies_or_through_the_host_both_give_the_same_logits():
    got = []
    for peer in (True, False):
        s = _session(devices=2)
        try:
            for d in s.devices.drivers:
                d.peer = peer
            s.devices.links = s.devices._link()
            assert {m for m, _ in s.devices.links.values()} == {"peer" if peer else "host"}
            got.append(s.ctx.decode([1]))
        finally:
            s.close()
    assert np.array_equal(*got)


# -- runs ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two():
    return run_sim(devices=2, steps=6, oracle=True, verify=True)


def test_every_decision_names_its_device_and_each_cache_holds_its_own_keys(two):
    split = of(two, E.GraphSplit)[-1]
    assert split.devices == (0, 1) and split.backends == ("SIM0", "SIM1")
    phases = of(two, E.PhaseDecided)
    assert {(e.split, e.device) for e in phases} == {(0, 0), (1, 1)}
    keys = {e.device: e.key for e in of(two, E.KeyLookup)}
    assert len(keys) == 2 and keys[0] != keys[1]
    s = summarize(two.header, two.events)
    assert [k.device for k in s.keys] == [0, 1]
    assert [(d.layers, d.output_layer, d.keys, d.replay > 0) for d in s.devices.devices] == \
        [(3, False, 1, True), (1, True, 1, True)]
    assert [link[2] for link in s.devices.links] == ["peer", "peer"]
    assert not two.failures and s.oracle_checks == 7 and s.verify_checks > 0


def test_per_device_caches_decide_independently():
    s = _session(devices=2)
    bus_events = []
    s.bus.subscribe(bus_events.append)
    try:
        for i in range(4):
            s.ctx.decode([1 + i])
        s.devices.gpus[0].runtime.invalidate_all("test", 0)      # device 0's cache only
        bus_events.clear()
        s.ctx.decode([7])
        phase = {e.device: e.phase for e in bus_events if isinstance(e, E.PhaseDecided)}
        assert phase == {0: "eager", 1: "replay"}
        assert len(s.devices.gpus[1].runtime.cache.entries) == 1
    finally:
        s.close()


def test_decisions_identical_run_to_run(two):
    again = run_sim(devices=2, steps=6, oracle=True, verify=True)
    a, b = decision_stream(two.events), decision_stream(again.events)
    assert a == b, first_difference(a, b)


def test_logits_match_the_one_device_run_within_the_oracle_bound():
    logits = []
    for kw in ({}, {"devices": 2}, {"devices": 2, "tensor_split": "1,3"}):
        s = _session(**kw)
        try:
            s.ctx.prefill([5, 9, 2, 7])
            logits.append([s.ctx.decode([t]) for t in (3, 11, 4, 8)])
        finally:
            s.close()
    for other in logits[1:]:
        for a, b in zip(logits[0], other):
            assert np.max(np.abs(a - b)) / np.max(np.abs(a)) <= ORACLE_BOUND["f16"]


def test_concurrent_streams_per_device_at_0c1e57098_and_off_with_two_visible_at_d99724f2():
    one = run_sim(steps=3, concurrent_streams=True)
    assert of(one, E.ConcurrentRegion)
    # 0c1e57098 (#28198): each device's backend optimises its own splits (tiny: layers 0-2 | 3; the KQ mask
    # is an input, no cast node in layer 0's range)
    two = run_sim(steps=3, concurrent_streams=True, devices=2)
    formed = {(e.device, e.fork_name) for e in of(two, E.ConcurrentRegion)}
    assert formed == {(0, "attn_norm-0"), (0, "attn_norm-1"), (0, "attn_norm-2"), (1, "attn_norm-3")}
    assert not [e for e in of(two, E.ConcurrentRefused) if e.fork_node < 0]
    # d99724f2: refused while more than one CUDA device is visible, as an event for each split it saw
    old = run_sim(steps=3, concurrent_streams=True, devices=2, upstream="d99724f2")
    assert not of(old, E.ConcurrentRegion)
    off = of(old, E.ConcurrentRefused)
    assert off and all(e.fork_node == -1 and e.reason.startswith("2 CUDA devices visible") for e in off)
    assert {e.device for e in off} == {0, 1}


def _cli(capsys, *args):
    """(exit status, stdout, stderr) of `graphdiag ARGS`."""
    rc = main(list(args))
    got = capsys.readouterr()
    return rc, got.out, got.err


# -- bad input -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--devices", "9"], "at most 8"),
    (["--devices", "0"], "devices must be >= 1"),
    (["--tensor-split", "1,1"], "needs devices 2 or more"),
    (["--devices", "2", "--tensor-split", "1,2,3"], "3 values for devices 2"),
    (["--devices", "2", "--tensor-split", "1,-1"], "must not be negative"),
    (["--devices", "2", "--tensor-split", "a,b"], "not a list of numbers"),
])
def test_bad_device_options_are_one_line_errors(capsys, args, says):
    rc, out, err = _cli(capsys, "run", "--backend", "sim", "--steps", "2", *args)
    assert rc == 2 and out == "", out
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in err


def test_tensor_split_of_zeros_splits_by_free_memory_as_llama_cpp(capsys):
    # load_tensors: every share 0 is the default split (each device's free memory), not an error
    rc, out, err = _cli(capsys, "run", "--backend", "sim", "--steps", "2", "--devices", "2", "--tensor-split",
                        "0,0", "--json")
    assert rc == 0, err
    d = json.loads(out)
    _, out2, _ = _cli(capsys, "run", "--backend", "sim", "--steps", "2", "--devices", "2", "--json")
    assert d["devices"] == json.loads(out2)["devices"]


def test_devices_on_the_cpu_backend_is_refused(capsys):
    rc, _, err = _cli(capsys, "run", "--backend", "cpu", "--devices", "2")
    assert rc == 2 and "--backend cpu" in err


def test_scenario_run_table_takes_devices_and_tensor_split(capsys, tmp_path):
    p = tmp_path / "split.toml"
    p.write_text('name = "split"\ndescription = "two devices"\n[run]\nsteps = 3\ndevices = 2\n'
                 'tensor_split = [1, 3]\n')
    rc, out, err = _cli(capsys, "run", "--backend", "sim", "--scenario", str(p), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["header"]["settings"]["tensor_split"] == "1,3"
    assert [x["layers"] for x in d["devices"]["devices"]] == [2, 2]


# -- records ---------------------------------------------------------------------------------------------
def test_device_is_written_only_when_not_zero_and_old_records_load(two):
    ev = next(e for e in two.events if isinstance(e, E.PhaseDecided) and e.device == 1)
    assert ev.to_dict()["device"] == 1
    zero = next(e for e in two.events if isinstance(e, E.PhaseDecided) and e.device == 0)
    assert "device" not in zero.to_dict()
    old = {k: v for k, v in ev.to_dict().items() if k != "device"}
    assert E.Event.from_dict(old).device == 0
    split = {k: v for k, v in of(two, E.GraphSplit)[0].to_dict().items() if k != "devices"}
    assert E.Event.from_dict(split).devices == ()


def _write(result, path, strip=False):
    lines = [json.dumps(result.header)]
    for e in result.events:
        d = e.to_dict()
        if strip:                       # as a record written before devices existed
            d.pop("device", None)
            d.pop("devices", None)
        lines.append(json.dumps(d))
    if strip:
        h = json.loads(lines[0])
        for k in ("devices", "tensor_split"):
            h["settings"].pop(k)
            h["sources"].pop(k)
        lines[0] = json.dumps(h)
    path.write_text("\n".join(lines) + "\n")


def test_diff_of_an_old_record_against_a_new_one(capsys, tmp_path):
    res = run_sim(steps=4)
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    _write(res, old, strip=True)
    _write(res, new)
    header, events = read_record(old)
    assert all(e.device == 0 for e in events)
    rc, out, err = _cli(capsys, "diff", str(old), str(new))
    assert rc == 0, err
    assert "devices" not in out and "tensor_split" not in out


def test_diff_and_whatif_show_devices(capsys, tmp_path, two):
    one, split = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    _write(run_sim(steps=6, oracle=True, verify=True), one)
    _write(two, split)
    _, out, err = _cli(capsys, "diff", str(one), str(split))
    assert "dev1" in out and "devices" in out, out + err
    rc, out, err = _cli(capsys, "whatif", str(split), "--key", "first-node", "--json")
    assert rc == 0, err
    got = json.loads(out)
    first = next(p for p in got["policies"] if p["policy"] == "first-node")
    assert set(first["devices"]) == {"0", "1"} and first["replays"] == got["baseline"]["replays"]


def test_timeline_has_a_track_set_per_device(capsys, tmp_path):
    path = tmp_path / "t.json"
    rc, _, err = _cli(capsys, "run", "--backend", "sim", "--devices", "2", "--steps", "3", "--prompt-tokens", "4",
                      "--timeline", str(path))
    assert rc == 0, err
    meta = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs[2].startswith("device 0") and procs[3].startswith("device 1")
    assert any(e["args"]["name"] == "decisions (device 1)" for e in meta if e["name"] == "thread_name")


def test_bench_steps_takes_devices(capsys):
    rc, out, err = _cli(capsys, "bench", "steps", "--backend", "sim", "--devices", "2", "--steps", "8",
                        "--prompt-tokens", "4", "--no-torch", "--json")
    assert rc == 0, err
    row = json.loads(out.splitlines()[0])
    assert row["devices"] == 2 and row["replay_steps"] > 0
    rc, _, err = _cli(capsys, "bench", "steps", "--backend", "sim", "--tensor-split", "1,1")
    assert rc == 2 and "needs devices 2 or more" in err

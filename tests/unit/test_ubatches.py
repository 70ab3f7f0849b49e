"""Ubatches as llama.cpp makes them (issue 29): a prompt longer than n_ubatch is split as split_simple splits
it, only the last ubatch has an output, and under 0c1e57098 the no-output ubatches build in their own graph
arena (llama.cpp #28549), so their CUDA-graph key differs from the decode graph's."""

import numpy as np
import pytest

from graphdiag import runner
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.errors import UsageError
from graphdiag.model.build import DECODE
from graphdiag.plan import N_BATCH, plan_steps, ubatch_sizes
from graphdiag.report.analysis.summary import summarize
from graphdiag.report.record import RunHeader
from graphdiag.scenario import check_expectations, load_scenario


def test_ubatch_sizes_follow_split_simple_within_n_batch():
    assert ubatch_sizes(1100, 512) == [512, 512, 76]
    assert ubatch_sizes(512, 512) == [512]
    assert ubatch_sizes(7, 512) == [7]
    # batches of n_batch first (the caller's), then ubatches of each: 2048 = 6 * 300 + 248
    assert ubatch_sizes(2500, 300) == [300] * 6 + [248, 300, 152]
    assert ubatch_sizes(10, 4096) == [10] and N_BATCH == 2048


def test_a_long_prompt_is_several_steps_only_the_last_with_an_output():
    cfg = resolve({"prompt_tokens": 1100, "steps": 2}, environ={})
    steps = list(plan_steps(cfg))
    assert len(steps) == len(plan_steps(cfg)) == 5
    assert [(p.kind, p.n_tokens, p.offset, p.n_outputs) for p in steps[:3]] == [
        ("prefill", 512, 0, 0), ("prefill", 512, 512, 0), ("prefill", 76, 1024, 1)]
    assert all(p.initial for p in steps[:3]) and [p.kind for p in steps[3:]] == ["decode", "decode"]


def test_a_timeline_prefill_takes_a_step_per_ubatch_and_later_items_keep_their_steps():
    sc = load_scenario("prompt-over-ubatch")
    cfg = resolve({}, scenario=sc.run, environ={})
    steps = list(plan_steps(cfg, sc))
    assert len(steps) == len(plan_steps(cfg, sc)) == 3 + cfg.steps
    for at in (0, 12, 24):
        assert [(p.kind, p.n_tokens, p.n_outputs) for p in steps[at:at + 3]] == [
            ("prefill", 16, 0), ("prefill", 16, 0), ("prefill", 1, 1)]
    assert steps[15].kind == "decode" and not steps[12].initial


@pytest.mark.parametrize("bad", [0, -1, 2049])
def test_a_bad_ubatch_size_is_refused_up_front(bad):
    with pytest.raises(UsageError, match="ubatch-size must be between 1 and n_batch"):
        resolve({"ubatch_size": bad}, environ={})


def test_a_bad_ubatch_size_is_one_line_and_exit_2(capsys):
    assert main(["run", "--backend", "sim", "--steps", "1", "--ubatch-size", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["graphdiag: error: ubatch-size must be between 1 and n_batch (2048), not 0"]


def _run(upstream, **cli):
    cfg = resolve({"backend": "sim", "sim_mode": "compute", "upstream": upstream, **cli}, environ={})
    return runner.run(cfg)


def _keys(result):
    """step -> the CUDA-graph key its GPU split ran under (the first event of the step naming one)."""
    keys = {}
    for e in (ev.to_dict() for ev in result.events):
        if e.get("key") and e.get("step", -1) >= 0:
            keys.setdefault(e["step"], e["key"])
    return keys


@pytest.mark.parametrize("upstream,separate", [("0c1e57098", True), ("d99724f2", False)])
def test_no_output_ubatches_key_apart_from_the_decode_graph_only_from_0c1e57098(upstream, separate):
    result = _run(upstream, prompt_tokens=40, ubatch_size=16, steps=3)
    keys = _keys(result)          # steps 0, 1: no outputs; 2: the prompt's last ubatch; 3..5: decode
    assert keys[2] == keys[3] == keys[5]
    assert (keys[0] != keys[3]) is separate and keys[0] == keys[1]


def test_a_split_prompt_gives_the_oracle_s_logits_and_the_prompt_ids_in_order():
    ids = ",".join(str(1 + i) for i in range(40))
    cfg = resolve({"backend": "sim", "sim_mode": "compute", "prompt_ids": ids, "ubatch_size": 16, "steps": 2,
                   "oracle": True}, environ={})
    result = runner.run(cfg)
    assert result.failures == []
    checks = [e for e in result.events if type(e).__name__ == "OracleCheck"]
    assert len(checks) == 3 and all(c.ok for c in checks)      # the last prompt ubatch and two decode steps
    whole = runner.run(resolve({"backend": "sim", "sim_mode": "compute", "prompt_ids": ids, "steps": 2, "ubatch_size": 64},
                               environ={}))
    assert result.tokens[:2] == [[], []]                        # 16 + 16 + 8: no outputs before the last
    assert result.tokens[2:] == whole.tokens                    # the same tokens as one 40-token ubatch


def _scenario_summary(**cli):
    sc = load_scenario("prompt-over-ubatch")
    cfg = resolve({"backend": "sim", "sim_mode": "decisions", **cli}, scenario=sc.run, environ={})
    result = runner.run(cfg, scenario=sc)
    return sc, summarize(RunHeader.from_dict(result.header), result.events)


def test_prompt_over_ubatch_two_keys_and_no_warmup_thrash():
    sc, summary = _scenario_summary()
    assert check_expectations(sc, summary) == []
    assert summary.distinct_keys == 2 and summary.counters["warmup_resets"] == 0


def test_prompt_over_ubatch_thrash_comes_back_under_d99724f2():
    sc, summary = _scenario_summary(upstream="d99724f2")
    assert summary.distinct_keys == 1 and summary.counters["warmup_resets"] >= 4
    assert len(summary.thrash) == 1
    assert {"distinct_keys", "thrash_keys", "warmup_resets"} <= {f.split()[2] for f in check_expectations(sc, summary)}


def test_a_decode_batch_over_ubatch_size_is_refused_up_front(capsys):
    assert main(["run", "--backend", "sim", "--steps", "1", "--batch", "4", "--prompt-tokens", "2",
                 "--ubatch-size", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decodes 4 sequences, more than --ubatch-size 2" in err[0]


def test_a_record_s_header_sizes_its_run_with_every_ubatch_a_step(tmp_path):
    """The reader counts the run's steps as the plan does (issue 46: it counted one step a prompt and refused
    the record of any prompt over n_ubatch); past that count a step is still refused."""
    from graphdiag import events as E
    from graphdiag.errors import EventFileError
    from graphdiag.plan import plan_length
    from graphdiag.report.record import read_record, write_record
    from graphdiag.report.record.read import MAX_STEP, planned_steps

    cfg = resolve({"batch": 2, "prompt_tokens": 1100, "steps": 3}, environ={})
    s = cfg.settings()
    assert planned_steps(s) == len(plan_steps(cfg)) == plan_length(2, 1100, 512, 3) == 2 * 3 + 3
    assert planned_steps(s | {"ubatch_size": 16, "prompt_tokens": 40}) == 2 * 3 + 3
    assert planned_steps(s | {"prompt_tokens": 4000}) == 2 * 8 + 3         # 2048 = 4 ubatches, 1952 = 4
    assert planned_steps({"batch": 1, "steps": 5, "prompt_tokens": None}) == 6   # a stream that did not say
    assert planned_steps({"batch": 1, "steps": "5"}) == MAX_STEP
    header = RunHeader(settings=s)
    write_record(tmp_path / "ok.jsonl", header, [E.RunEnded(step=9, status="complete", steps_done=9)])
    assert read_record(tmp_path / "ok.jsonl")[1][0].step == 9
    write_record(tmp_path / "bad.jsonl", header, [E.RunEnded(step=10, status="complete", steps_done=9)])
    with pytest.raises(EventFileError, match=r"step 10 is beyond the run's 9 steps \(6 prompt ubatches for "
                                             r"batch 2 \+ steps 3, from its header\)"):
        read_record(tmp_path / "bad.jsonl")

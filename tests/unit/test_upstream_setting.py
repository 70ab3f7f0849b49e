"""--upstream: which upstream commit's rules a run follows, validated, and named in every record's header."""

import json

import pytest

from graphdiag.cli.main import main
from graphdiag.config import UPSTREAMS, resolve
from graphdiag.errors import UsageError
from graphdiag.report.record.read import read_record


def test_the_default_is_the_newest_upstream():
    assert resolve({}).upstream == UPSTREAMS[0] == "0c1e57098"


def test_an_unknown_upstream_is_refused_naming_the_known_ones():
    with pytest.raises(UsageError, match="0c1e57098, d99724f2"):
        resolve({"upstream": "abc"})


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_the_record_header_names_the_upstream_it_followed(tmp_path, capsys, upstream):
    ev = tmp_path / "r.jsonl"
    assert main(["run", "--backend", "sim", "--steps", "2", "--upstream", upstream, "--events", str(ev)]) == 0
    header = json.loads(ev.read_text().splitlines()[0])
    assert header["upstream"] == upstream
    assert read_record(ev)[0].upstream == upstream
    assert header["rules"] == f"upstream {upstream}"
    assert (f"rules: upstream {upstream} · {'llama.cpp' if upstream == '0c1e57098' else 'ggml'} {upstream}"
            in capsys.readouterr().out)


@pytest.mark.parametrize("upstream,cast", [("0c1e57098", False), ("d99724f2", True)])
def test_the_runs_graphs_are_built_by_its_upstreams_rules(upstream, cast):
    """cfg.upstream reaches the model builder: a tiny decode step's graph casts its F32 KQ mask to F16
    under d99724f2 only (0c1e57098 makes the mask an F16 input)."""
    from graphdiag import events as E
    from graphdiag.counters import Counters
    from graphdiag.ir.dtypes import GGMLType
    from graphdiag.ir.ops import Op
    from graphdiag.plan import StepPlan
    from graphdiag.runner import RunResult, Session, Stepper
    s = Session(resolve({"backend": "sim", "steps": 0, "prompt_tokens": 4, "upstream": upstream}, environ={}),
                E.EventBus())
    try:
        Stepper(s, RunResult({}, [], Counters())).step(StepPlan("decode", batch=1))
        g, inp = s.ctx.res.graph, s.ctx.res.inputs
        assert s.model.upstream == upstream
        assert any(t.op == Op.CPY for t in g.iter_nodes()) == cast
        assert inp.kq_mask.type == (GGMLType.F32 if cast else GGMLType.F16)
    finally:
        s.close()

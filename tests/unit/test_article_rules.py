"""Which rules ran: upstream's alone by default (one graph per split, no graph invalidation on a pool
flush); the design article's chunked capture and pool invalidation only when asked for, and then named in
the header's rules, the run header, the terminal summary and the record."""

import json
from pathlib import Path

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.config import ARTICLE_RULES, resolve
from graphdiag.report.record.read import read_record
from tests.support.cli import one_line

CHUNKED = "chunked capture: the design article's rule, not in upstream llama.cpp"
INVALIDATION = "graph invalidation on a pool flush: the design article's rule, not in upstream llama.cpp"
SCENARIOS = Path(__file__).parents[2] / "scenarios"


@pytest.mark.parametrize("settings, environ, rules, article", [
    ({}, {}, "upstream 0c1e57098", []),
    ({"upstream": "d99724f2"}, {}, "upstream d99724f2", []),
    ({"chunk_size": 512}, {}, "upstream 0c1e57098 + article: chunked capture (512)", [CHUNKED]),
    ({}, {"GGML_CUDA_GRAPH_CHUNK_SIZE": "64"}, "upstream 0c1e57098 + article: chunked capture (64)", [CHUNKED]),
    ({}, {"GGML_CUDA_GRAPH_CHUNK_SIZE": "-3"}, "upstream 0c1e57098", []),    # atoi'd, only > 0 chunks
    ({"pool_invalidation": True}, {}, "upstream 0c1e57098 + article: graph invalidation on a pool flush",
     [INVALIDATION]),
    ({"chunk_size": 512, "pool_invalidation": True}, {},
     "upstream 0c1e57098 + article: chunked capture (512), graph invalidation on a pool flush",
     [CHUNKED, INVALIDATION]),
    ({"upstream": "d99724f2", "chunk_size": 64}, {}, "upstream d99724f2 + article: chunked capture (64)", [CHUNKED]),
])
def test_the_rules_name_exactly_what_runs(settings, environ, rules, article):
    cfg = resolve(settings, environ=environ)
    assert (cfg.rules(), cfg.article_rules()) == (rules, article)
    assert cfg.rules(gpu=False) == rules.split(" + ")[0] and cfg.article_rules(gpu=False) == []


def test_the_words_are_the_ones_the_issue_asks_for():
    assert list(ARTICLE_RULES.values()) == [CHUNKED, INVALIDATION]


def test_by_default_upstreams_rules_alone():
    cfg = resolve({}, environ={})
    assert cfg.chunk_size == 0 and cfg.pool_invalidation is False


def test_a_default_run_captures_one_graph_per_split_and_says_upstream_alone(tmp_path, capsys):
    ev = tmp_path / "r.jsonl"
    assert main(["run", "--backend", "sim", "--steps", "4", "--events", str(ev)]) == 0
    out = capsys.readouterr().out
    header, events = read_record(ev)
    assert header.rules == "upstream 0c1e57098" and header.article == []
    assert header.settings["chunk_size"] == 0 and header.settings["pool_invalidation"] is False
    captures = [e for e in events if isinstance(e, E.CaptureRun)]
    assert captures and all(e.n_chunks == 1 for e in captures)
    assert all(e.n_chunks == 1 for e in events if isinstance(e, E.ReplayLaunched))
    bounds = [e for e in events if isinstance(e, E.ChunkBoundary)]
    assert len(bounds) == len(captures) and all(e.chunk == 0 and e.start_node == 0 for e in bounds)
    assert "rules: upstream 0c1e57098 · llama.cpp 0c1e57098" in out
    assert "design article" not in out and "max 1 chunks per graph" in out


def test_chunked_capture_is_said_in_the_header_the_summary_and_the_record(tmp_path, capsys):
    ev = tmp_path / "r.jsonl"
    assert main(["run", "--backend", "sim", "--steps", "4", "--chunk-size", "64", "--events", str(ev)]) == 0
    out = capsys.readouterr().out.splitlines()
    head = json.loads(ev.read_text().splitlines()[0])
    assert head["rules"] == "upstream 0c1e57098 + article: chunked capture (64)" and head["article"] == [CHUNKED]
    rules = out.index(next(l for l in out if l.startswith("rules: ")))
    assert out[rules + 1] == CHUNKED                                  # the run header
    overview = next(i for i, l in enumerate(out) if "chunks per graph" in l)
    _, events = read_record(ev)
    most = max(e.n_chunks for e in events if isinstance(e, E.CaptureRun))
    assert most > 1 and f"max {most} chunks per graph" in out[overview] and out[overview + 1] == CHUNKED   # the summary


def _pool_pressure(tmp_path, invalidation: bool) -> Path:
    """The shipped pool-pressure scenario, its pool_invalidation line kept or dropped."""
    text = (SCENARIOS / "pool-pressure.toml").read_text()
    assert "pool_invalidation = true" in text
    if not invalidation:
        text = "\n".join(l for l in text.splitlines() if not l.startswith("pool_invalidation"))
        text = text.replace("invalidations_min = 1", "invalidations = 0")
    (tmp_path / "pool-pressure.toml").write_text(text)
    return tmp_path / "pool-pressure.toml"


@pytest.mark.parametrize("invalidation", [False, True])
def test_a_pool_flush_invalidates_graphs_only_under_the_articles_rule(tmp_path, capsys, invalidation):
    """Upstream's pool flushes (synchronise, free the cached buffers, retry) and leaves the graphs alone; the
    article's invalidates every graph, and the run says whose rule that is."""
    ev = tmp_path / "r.jsonl"
    assert main(["run", "--scenario", str(_pool_pressure(tmp_path, invalidation)), "--events", str(ev)]) == 0
    out = capsys.readouterr().out
    header, events = read_record(ev)
    flushed = [e for e in events if isinstance(e, E.PoolInvalidated)]
    assert bool(flushed) == invalidation
    assert header.article == ([INVALIDATION] if invalidation else [])
    assert (INVALIDATION in out) == invalidation
    assert header.rules == "upstream 0c1e57098" + (" + article: graph invalidation on a pool flush"
                                                   if invalidation else "")


def test_pool_invalidation_does_nothing_on_the_cpu_backend(capsys):
    assert "--pool-invalidation does nothing on --backend cpu" in one_line(
        capsys, ["run", "--backend", "cpu", "--pool-invalidation", "--steps", "2"])


def test_against_llama_under_another_upstream_is_refused_before_any_model(capsys, monkeypatch):
    """llama-cpp-python's llama.cpp is 0c1e57098: --upstream d99724f2 is refused in one line, before the
    model check (a preset here would be refused for not being a file) and before any run starts."""
    import graphdiag.runner as runner
    monkeypatch.setattr(runner, "run_cli", lambda *a, **k: pytest.fail("a run was started"))
    line = one_line(capsys, ["run", "--against-llama", "--model", "tiny", "--upstream", "d99724f2"])
    assert "--upstream d99724f2 with --against-llama" in line and "llama-cpp-python is 0c1e57098" in line


def test_against_llama_refuses_a_scenarios_other_upstream(tmp_path, capsys):
    sc = tmp_path / "old-rules.toml"
    sc.write_text('name = "old-rules"\ndescription = "d99724f2"\n\n[run]\nmodel = "tiny"\nupstream = "d99724f2"\n')
    line = one_line(capsys, ["run", "--against-llama", "--model", "tiny", "--scenario", str(sc)])
    assert f"upstream ({sc}:6) d99724f2 with --against-llama" in line


@pytest.mark.parametrize("settings, refused", [({"upstream": "d99724f2"}, "upstream d99724f2"),
                                               ({"pool_invalidation": True}, "pool-invalidation True"),
                                               ({"chunk_size": 512}, "chunk-size 512")])
def test_graphdiag_llama_refuses_what_upstream_0c1e57098_cannot_express(settings, refused):
    from graphdiag.errors import UsageError
    from graphdiag.llama.expressible import check_expressible
    with pytest.raises(UsageError, match=refused):
        check_expressible(resolve(settings, environ={}))


def test_upstreams_pool_frees_under_a_live_graph_and_the_device_says_illegal_address(capsys):
    """Upstream's pool, full (no cache slots), really frees the capture step's scratch buffers while the
    captured graph still points at them: launching it reads freed memory, which the simulated device reports
    as CUDA does (CUDA_ERROR_ILLEGAL_ADDRESS, sticky: the run ends), not as an internal error. The
    article's rule invalidates the graphs instead and the run goes on."""
    rc = main(["run", "--backend", "sim", "--steps", "4", "--pool-max-buffers", "0"])
    err = capsys.readouterr().err
    assert rc not in (0, 3) and "CUDA_ERROR_ILLEGAL_ADDRESS" in err and "internal error" not in err
    assert main(["run", "--backend", "sim", "--steps", "4", "--pool-max-buffers", "0", "--pool-invalidation"]) == 0

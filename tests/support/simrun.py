"""Helpers for runs on the simulated driver."""

from types import SimpleNamespace


from graphdiag import events as E
from graphdiag.config import resolve
from graphdiag.runner import run


def run_sim(timeline=(), env=None, **settings):
    """A run on the simulated driver; returns the RunResult."""
    settings.setdefault("backend", "sim")
    settings.setdefault("prompt_tokens", 8)
    cfg = resolve(settings, environ=env or {})
    return run(cfg, SimpleNamespace(name="test", timeline=list(timeline)))


def of(result, *kinds):
    return [e for e in result.events if isinstance(e, kinds)]


def phases(result, split=0):
    """step -> phase decided for that split."""
    return {e.step: e.phase for e in of(result, E.PhaseDecided) if e.split == split}



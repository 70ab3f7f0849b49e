"""The suite's memory plugin (tests/support/memory_budget.py), run on a small test file in a pytest of its
own: a test that raises the peak RSS past GRAPHDIAG_TEST_PEAK_MB fails and says so, the others pass; a
test that leaves 300 MB in a reference cycle has it collected once it ends and the freed heap handed back; GRAPHDIAG_TEST_RSS_LOG gets a
line per test; a bad budget is one line; a run whose process tree (a test's subprocess included) adds up past
GRAPHDIAG_TEST_TREE_MB fails naming the test; under pytest -n 2 an xdist_group's tests never overlap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SUITE = '''
import gc
import numpy as np

class Node:
    pass

def test_small():
    pass

def test_big():
    a = np.ones(400 << 20, np.uint8)     # 400 MB, every page touched
    assert a[-1] == 1

KEEP = []


def test_leaves_a_cycle():
    gc.disable()                          # only the plugin's collection may free it
    n = Node()
    n.me, n.data = n, []
    for _ in range(3000):                 # 300 MB in heap-sized pieces, each behind a small one that stays:
        n.data.append(np.ones(100_000, np.uint8))    # freed, they leave holes only malloc_trim gives back
        KEEP.append(bytearray(2000))

def test_after():
    gc.enable()
'''


def _pytest(tmp_path, suite=SUITE, args=(), **env):
    (tmp_path / "test_mem.py").write_text(suite)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("GRAPHDIAG_TEST_", "PYTEST_XDIST_"))}
    run_env.update(env, PYTHONPATH=os.pathsep.join([str(TESTS), run_env.get("PYTHONPATH", "")]))
    # through a small launcher: a process spawned straight from this one starts with this one's RSS as its
    # ru_maxrss (Linux carries the spawning address space's high-water mark over exec), hundreds of MB here
    launch = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"
    return subprocess.run([sys.executable, "-c", launch, sys.executable, "-m", "pytest", "-q", "-p",
                           "support.memory_budget", "-p", "no:cacheprovider", *args, "test_mem.py"],
                          cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=120)


def test_a_test_past_the_budget_fails_naming_its_peak_and_a_cycle_is_collected(tmp_path):
    log = tmp_path / "rss.tsv"
    p = _pytest(tmp_path, GRAPHDIAG_TEST_PEAK_MB="250", GRAPHDIAG_TEST_RSS_LOG=str(log))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "1 failed, 3 passed" in p.stdout
    assert "FAILED test_mem.py::test_big" in p.stdout
    assert "during this test's call, past GRAPHDIAG_TEST_PEAK_MB=250" in p.stdout
    rows = {r[0].split("::")[1]: r[1:] for r in (line.split("\t") for line in log.read_text().splitlines())}
    assert list(rows) == ["test_small", "test_big", "test_leaves_a_cycle", "test_after"]
    cpu, rss, peak, raised = (float(x) for x in rows["test_big"])
    assert raised > 350 * 1024 and cpu >= 0
    # the cycle's 300 MB were collected after its test (gc was disabled: only the plugin collects) and the
    # heap's holes trimmed
    assert int(rows["test_leaves_a_cycle"][1]) < int(rows["test_big"][2]) - 250 * 1024


def test_a_bad_budget_is_one_line(tmp_path):
    p = _pytest(tmp_path, GRAPHDIAG_TEST_PEAK_MB="4GB")
    assert p.returncode == 4
    assert "GRAPHDIAG_TEST_PEAK_MB must be a whole number of MB (over 0), got '4GB'" in p.stderr
    assert "Traceback" not in p.stderr


TREE_SUITE = '''
import subprocess, sys

def test_small():
    pass

def test_a_child_holds_300_mb():
    # a subprocess: its memory is in no test's own peak, only in the tree's
    hold = "import numpy as np, time; a = np.ones(300 << 20, np.uint8); time.sleep(1.5)"
    subprocess.run([sys.executable, "-c", hold], check=True)
'''


def test_a_run_whose_process_tree_adds_up_past_the_tree_budget_fails_naming_the_test(tmp_path):
    p = _pytest(tmp_path, TREE_SUITE, GRAPHDIAG_TEST_TREE_MB="250")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "2 passed" in p.stdout
    assert "past GRAPHDIAG_TEST_TREE_MB=250; running then: test_mem.py::test_a_child_holds_300_mb" in p.stdout
    p = _pytest(tmp_path, TREE_SUITE, GRAPHDIAG_TEST_TREE_MB="2000")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "within GRAPHDIAG_TEST_TREE_MB=2000" in p.stdout


GROUP_SUITE = '''
import time
import pytest

def _stay(tmp_path_factory, name):
    start = time.monotonic()
    time.sleep(1.0)
    with open(tmp_path_factory.getbasetemp().parent / "group.log", "a") as f:   # shared by the workers
        f.write(f"{name} {start} {time.monotonic()}\\n")

@pytest.mark.xdist_group("heavy")
def test_one(tmp_path_factory):
    _stay(tmp_path_factory, "one")

@pytest.mark.xdist_group("heavy")
def test_two(tmp_path_factory):
    _stay(tmp_path_factory, "two")
'''


def test_the_tests_of_an_xdist_group_never_overlap_on_two_workers(tmp_path):
    p = _pytest(tmp_path, GROUP_SUITE, ("-n", "2", "--dist", "loadgroup", "--basetemp", str(tmp_path / "bt")))
    assert p.returncode == 0, p.stdout + p.stderr
    log = (tmp_path / "bt" / "group.log").read_text().splitlines()
    spans = sorted(tuple(float(x) for x in line.split()[1:]) for line in log)
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], spans

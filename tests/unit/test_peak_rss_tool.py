"""tools/peak_rss.py: a command's wall and CPU time, its process tree's summed peak memory (a child and its
grandchild each holding 150 MB at once: over 280 MB), the largest single process's peak beside it, and the
command's exit status passed on; no command is one line and exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "peak_rss.py"

GRANDCHILD = "import numpy as np, time; b = np.ones(150 << 20, np.uint8); time.sleep(1.5)"
CHILD = ("import subprocess, sys, numpy as np; a = np.ones(150 << 20, np.uint8); "
         f"subprocess.run([sys.executable, '-c', {GRANDCHILD!r}]); sys.exit(3)")


def test_the_tree_peak_adds_up_every_process_and_the_status_is_passed_on():
    p = subprocess.run([sys.executable, str(TOOL), "--every", "0.05", "--", sys.executable, "-c", CHILD],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    m = re.search(r"peak_rss: (\d+) s wall, (\d+) s CPU, ([\d.]+) GB peak of the process tree \(sampled every "
                  r"0.05 s\), ([\d.]+) GB largest single process", p.stderr)
    assert m, p.stderr
    tree, single = float(m[3]), float(m[4])
    assert tree > 0.28 and 0.14 < single < 0.26


def test_no_command_is_one_line():
    p = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "no command given" in p.stderr and "Traceback" not in p.stderr

"""Run a command and say what it cost: wall seconds, CPU seconds, and the peak resident memory of its whole
process tree (every process under it added up, sampled), beside the largest single process's peak
(what GNU time -v calls "Maximum resident set size"; under pytest -n each worker is its own process).

    python tools/peak_rss.py [--every 0.2] -- python -m pytest -q -n 2 --dist loadgroup

Linux only (it reads /proc). The sum is sampled every --every seconds, so a spike shorter than that can be
missed; the single-process peak is the kernel's own (ru_maxrss), never missed. The command's exit status is
passed on.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time


def _children() -> dict[int, list[int]]:
    """parent pid -> child pids, for every process /proc shows now."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue                     # gone since listdir
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_kb(root: int) -> int:
    """The resident memory of `root` and every process under it, kB."""
    kids, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        total += _rss_kb(pid)
        todo += kids.get(pid, [])
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0.2, help="seconds between samples of the tree's memory")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given (put it after --)")
    if not os.path.isdir("/proc/self"):
        ap.error("needs Linux's /proc")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_kb(proc.pid))
        time.sleep(args.every)
    wall = time.monotonic() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"peak_rss: {wall:.0f} s wall, {ru.ru_utime + ru.ru_stime:.0f} s CPU, "
          f"{peak / 1048576:.2f} GB peak of the process tree (sampled every {args.every:g} s), "
          f"{ru.ru_maxrss / 1048576:.2f} GB largest single process", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

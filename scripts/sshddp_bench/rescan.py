"""Case ``rescan``: the CPU of one rescan of the node's sampler (how it finds the node's
processes, every RESCAN seconds), walking the supervisor's tree against scanning every
process of the host (teardown's scan, and the sampler's before it walked the tree).

This process stands for the supervisor: a node of 4 marked ``sleep`` ranks under a marked
``sh`` (its torchrun) is its tree. Around it, unmarked ``sleep`` processes that left their
parent (as the other nodes' processes of a lab of many hosts on one /proc are, or a busy
host's other users') fill /proc: at 0 and at FILLERS of them. The CPU is this thread's
(``time.thread_time``), so a busy machine slows it less than it slows the wall clock.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

from sshddp_bench import internals
from sshddp_bench.case import Case
from sshddp_bench.harness import Bench, BenchError, Stat, kill_pids, progress, stat
from sshddp_bench.machine import load_average

FILLERS = (0, 1500)  #: processes beside the node's: none, and the 256-host lab's /proc
RANKS = 4  #: the node's ranks
SCANS = 20  #: scans per repetition, each way
RESCAN_S = 5.0  #: the sampler's RESCAN: one scan every this many seconds


@dataclass(frozen=True)
class RescanSize:
    fillers: int
    procs: int  #: processes in /proc while it ran
    tree_ms: Stat  #: CPU of one scan of the supervisor's tree (ms)
    all_ms: Stat  #: CPU of one scan of every process (ms)
    load: str  #: load average after the size


def node_tree(mark: str) -> subprocess.Popen[bytes]:
    """A node: one marked ``sh`` (torchrun) with RANKS marked sleeping children."""
    script = " ".join(["sleep 600 &"] * RANKS) + " wait"
    env = {**os.environ, "SSHDDP_NODE_MARK": mark}
    return subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)


def fillers(n: int) -> list[int]:
    """``n`` unmarked sleeping processes outside this process's tree (their shell exits)."""
    if n == 0:
        return []
    script = f"i=0; while [ $i -lt {n} ]; do sleep 600 >/dev/null 2>&1 & echo $!; i=$((i+1)); done"
    out = subprocess.run(["sh", "-c", script], capture_output=True, check=True).stdout
    return [int(p) for p in out.split()]


def cpu_ms(scan: Callable[[str], int], mark: str) -> float:
    """The CPU of one scan (ms), the mean over SCANS; it must find the node's RANKS + 1."""
    t0 = time.thread_time()
    for _ in range(SCANS):
        found = scan(mark)
        if found != RANKS + 1:
            raise BenchError(f"rescan: found {found} of the node's {RANKS + 1} processes")
    return (time.thread_time() - t0) / SCANS * 1000


def bench_size(mark: str, n: int, reps: int) -> RescanSize:
    extra = fillers(n)
    try:
        tree: list[float] = []
        every: list[float] = []
        for rep in range(reps):
            pair = [(tree, internals.scan_own_tree), (every, internals.scan_every_process)]
            for into, scan in pair if rep % 2 == 0 else pair[::-1]:
                into.append(cpu_ms(scan, mark))
        procs = sum(1 for name in os.listdir("/proc") if name.isdigit())
    finally:
        kill_pids(extra)
    size = RescanSize(n, procs, stat(tree), stat(every), load_average())
    progress(f"rescan {procs} processes: tree {size.tree_ms.fmt()} ms, all {size.all_ms.fmt()}")
    return size


def bench_rescan(b: Bench, reps: int) -> tuple[RescanSize, ...]:
    mark = b.name("rescan")
    node = node_tree(mark)
    try:
        deadline = time.monotonic() + 10
        while internals.scan_every_process(mark) != RANKS + 1:  # its shell forks them
            if time.monotonic() > deadline:
                raise BenchError(f"rescan: the node's {RANKS} ranks did not start")
            time.sleep(0.05)
        return tuple(bench_size(mark, n, reps) for n in FILLERS)
    finally:
        os.killpg(node.pid, 9)
        node.wait()


def size_line(s: RescanSize) -> str:
    per_s = s.tree_ms.median / RESCAN_S, s.all_ms.median / RESCAN_S
    return (
        f"| {s.procs} | {s.tree_ms.fmt(digits=3)} | {s.all_ms.fmt(digits=3)} "
        f"| {s.all_ms.median / max(s.tree_ms.median, 1e-9):.0f}x "
        f"| {per_s[0]:.3f} | {per_s[1]:.3f} | {s.load} |"
    )


def table(rows: tuple[RescanSize, ...]) -> list[str]:
    return [
        "| processes in /proc | tree walk (ms CPU a scan) | every process (ms CPU a scan) "
        "| ratio | tree: ms CPU a second | every: ms CPU a second | load average after |",
        "|---:|---|---|---:|---:|---:|---|",
        *(size_line(s) for s in rows),
    ]


def noisy(rows: tuple[RescanSize, ...]) -> list[str]:
    return [f"rescan/{s.procs}" for s in rows if s.tree_ms.noisy or s.all_ms.noisy]


METHOD = f"""\
* **rescan**: the bench process stands for a supervisor: a node of {RANKS} marked `sleep`
  ranks under a marked `sh` is its tree; around it {" and ".join(map(str, FILLERS))}
  unmarked `sleep` processes outside the tree. Each repetition, alternating which goes
  first, {SCANS} scans each way: the sampler's (`run_pids` over the supervisor's descendants
  from `/proc/PID/task/TID/children`) and teardown's (`run_pids` over every process);
  each must find the node's {RANKS + 1} processes. CPU is the thread's (`time.thread_time`),
  a scan's mean; a second's is that over the sampler's RESCAN ({RESCAN_S:.0f} s).
"""

CASE: Case[tuple[RescanSize, ...]] = Case(
    name="rescan",
    hosts=lambda sizes: 1,
    run=lambda b, sizes, reps: bench_rescan(b, reps),
    title=lambda rows: "the node sampler's rescan: its tree against every process",
    table=table,
    noisy=noisy,
    method=lambda sizes: METHOD,
)

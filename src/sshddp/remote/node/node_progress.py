"""Whether a quiet node's ranks still work: every node's part of the stall watchdog.

No output is not proof of a hang: a detached Lightning bar prints nothing until the end. So
while its output is quiet, every node's supervisor samples its ranks every few seconds
(``QuietWatch``): each process's stacks (``host_stacks.collect``, asked of each rank's
stacks thread: no signal) and its CPU time (utime + stime, /proc/PID/stat). Two samples
apart (``moved``, pure), the ranks worked when a process came or went, a process's Python
stacks changed, or, on a host without a GPU, a process used at least ``CPU_SHARE`` of a core
between them: a rank blocked in a gloo wait, a lock or ``time.sleep`` uses next to none, a
working one a whole core. On a GPU host CPU time says nothing (a rank waiting for a kernel
that never ends spins in cudaStreamSynchronize at 100 %), so only the stacks count there.

The node's heartbeat tells node 0 how long its ranks have been ``still``: seconds since
they last wrote output or were seen working. The run has stalled only when every node has
been still that long (``host_watchdog.verdict``). RUNDIR/progress.json (``ProgressRecord``)
says it for ``sshddp ps``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

from sshddp.protocol import contract
from sshddp.protocol.contract import ProgressRecord, ThreadRecord
from sshddp.remote.common import atomic_write_json
from sshddp.remote.node.joined import entered, still

CPU_SHARE = 0.1  #: of one core, between two samples: a rank that used this much worked
FEWEST = 1.0  #: seconds between samples, at least
MOST = 30.0  #: and at most: each sample appends a dump to each process's stacks file

QuietClock = Callable[[], float]  #: seconds the node has written nothing (``joined.node_watch``)
StackKey = Tuple[Tuple[Tuple[str, int, str], ...], ...]
#: pid -> (its CPU time in seconds, None: unreadable; its stacks, None: none read)
Sample = Dict[int, Tuple[Optional[float], Optional[StackKey]]]


def interval(stall_timeout: float) -> float:
    """Seconds between samples: a quarter of the stall timeout, so that a stall is judged
    on several samples, within ``FEWEST`` and ``MOST``."""
    return min(MOST, max(FEWEST, stall_timeout / 4))


def stack_key(threads: Sequence[ThreadRecord]) -> StackKey:
    """Where a process stands: every thread's Python frames (file base name, line,
    function), in any thread order."""
    return tuple(
        sorted(
            tuple((os.path.basename(f["file"]), f["line"], f["func"]) for f in t["frames"])
            for t in threads
        )
    )


def moved(before: Sample, after: Sample, seconds: float, cpu_counts: bool) -> str:
    """What shows the processes worked between two samples ``seconds`` apart, "" when
    nothing does: a process came or went, its stacks changed, or (``cpu_counts``) it used
    ``CPU_SHARE`` of a core."""
    if set(before) != set(after):
        return "its processes changed"
    for pid, (cpu, stacks) in after.items():
        cpu_then, stacks_then = before[pid]
        if stacks is not None and stacks_then is not None and stacks != stacks_then:
            return f"the stacks of pid {pid} changed"
        used = cpu - cpu_then if cpu is not None and cpu_then is not None else 0.0
        if cpu_counts and seconds > 0 and used >= CPU_SHARE * seconds:
            return f"pid {pid} used {used / seconds:.0%} of a core"
    return ""


def take(rundir: str) -> Sample:
    """The node's ranks (and their workers) now: CPU time and stacks (only of those that
    called init_process_group: ``joined.entered``); every process but torchrun's agent
    where no rank is known."""
    from sshddp.remote.calls.host_stacks import collect
    from sshddp.remote.calls.node_sampler import cpu_ticks

    found = collect(rundir, only=entered(rundir), unasked=True)["processes"]
    ranks = [p for p in found if p["role"] in (contract.RANK, contract.WORKER)]
    chosen = ranks or [p for p in found if p["role"] != contract.AGENT]
    sample: Sample = {}
    for p in chosen:
        ticks = cpu_ticks(p["pid"])
        cpu = None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")
        sample[p["pid"]] = (cpu, stack_key(p["threads"]) if p["threads"] else None)
    return sample


class QuietWatch:
    """A node's sampler thread: while the node is quiet, a sample every ``every`` seconds,
    compared with the one before; ``moved_at`` is when its ranks were last seen working."""

    def __init__(self, rundir: str, every: float, cpu_counts: bool) -> None:
        self.rundir = rundir
        self.every = every
        self.cpu_counts = cpu_counts
        self.moved_at: Optional[float] = None
        self.thread: Optional[threading.Thread] = None

    def start(self, quiet: QuietClock) -> None:
        if self.thread is None:
            self.thread = threading.Thread(
                target=self._run, args=(quiet,), daemon=True, name="progress"
            )
            self.thread.start()

    def _run(self, quiet: QuietClock) -> None:
        last: Optional[tuple[float, Sample]] = None
        while True:
            time.sleep(self.every)
            if quiet() < self.every:
                last = None  # it writes: no need to look
                continue
            try:
                now, sample = time.time(), take(self.rundir)
            except Exception:  # a process that went mid-read: look again next time
                last = None
                continue
            if last is not None and moved(last[1], sample, now - last[0], self.cpu_counts):
                self.moved_at = now
            last = (now, sample)
            self._record(now, quiet())

    def _record(self, now: float, quiet: float) -> None:
        record: ProgressRecord = {
            "schema": contract.SCHEMA,
            "at": now,
            "moved_at": self.moved_at,
            "still": round(still(now, quiet, self.moved_at), 1),
        }
        try:
            atomic_write_json(os.path.join(self.rundir, contract.PROGRESS), record)
        except OSError:  # no room: ps shows the node's quiet time alone
            pass

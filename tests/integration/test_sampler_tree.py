"""How the node's sampler finds the node's processes, on real processes: it walks the
supervisor's tree (O(the node's processes)), where teardown still scans every process."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from sshddp.protocol.contract import MARK_VAR
from sshddp.remote import common
from sshddp.remote.calls import node_sampler


def test_the_rescan_walks_the_supervisors_tree_and_teardown_still_finds_a_double_fork(
    tmp_path: Path,
) -> None:
    """The sampler looks only at its process's descendants (a child started by another
    thread too: /proc/PID/task/TID/children is per thread); a marked process that left the
    tree by double-forking is not ``top``'s, but teardown's scan of every process finds it."""
    mark = f"t/{os.getpid()}/{time.monotonic_ns()}"
    env = {**os.environ, MARK_VAR: mark}
    started: list[subprocess.Popen[bytes]] = []
    grandchild = orphan = 0
    try:
        worker = threading.Thread(
            target=lambda: started.append(subprocess.Popen(["sleep", "60"], env=env))
        )
        worker.start()
        worker.join()
        helper = subprocess.Popen(["sleep", "60"])  # unmarked: the supervisor's, not the run's
        started.append(helper)
        script = "sleep 60 & echo $!; (sleep 60 & echo $!); wait"
        shell = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.PIPE)
        started.append(shell)
        assert shell.stdout is not None
        grandchild, orphan = int(shell.stdout.readline()), int(shell.stdout.readline())
        _wait_until(lambda: orphan not in (common.descendants(os.getpid()) or []))

        tree = common.descendants(os.getpid())
        assert tree is not None and helper.pid in tree and orphan not in tree
        ours = {started[0].pid, shell.pid, grandchild}
        assert set(common.run_pids(None, mark, among=tree)) == ours
        assert set(common.run_pids(None, mark)) == ours | {orphan}  # teardown's: exhaustive

        spec = {"mark": mark, "node_rank": 0}
        sampler = node_sampler.Sampler(str(tmp_path), spec)  # type: ignore[arg-type]
        sampler._scan()
        assert set(sampler.procs) == ours
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
        for pid in (grandchild, orphan):
            if pid:
                os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not common.run_pids(None, mark))


def test_a_process_gone_has_no_tree() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert common.descendants(proc.pid) is None  # the sampler then scans every process


def _wait_until(done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.01)

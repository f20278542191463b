"""Watching the Slurm job under a run: when it ends, the run ends with it, and says why.

A run on a Slurm job's nodes holds them only while the job runs. When the job ends under
it (``scancel``, its time limit, preemption, a failed node), Slurm ends every process of
its steps: over srun that is the whole run. Processes started over SSH are outside the
job (unless the cluster adopts SSH sessions into jobs, as ``pam_slurm_adopt`` does), and
would go on on nodes that are no longer the user's. So while a coordinator follows such a
run it looks at the job every ``SLURM_POLL`` seconds; once the job no longer runs, it
stops the run (a no-op where Slurm got there first), the followers stop reconnecting to
nodes that are gone, and the report names the job's end as the root cause.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Optional

from sshddp import defaults
from sshddp.errors import SshddpError
from sshddp.hosts import slurm
from sshddp.model.allocation import job_ended
from sshddp.model.layout import RunLayout
from sshddp.model.state import RunResult
from sshddp.run.runstate import RunState
from sshddp.run.teardown import Teardown


def job_of(layout: RunLayout) -> Optional[str]:
    """The Slurm job whose nodes the run is on, if any."""
    return layout.nodes[0].host.slurm_job if layout.nodes else None


class JobWatch:
    """A thread that ends the run when its Slurm job ends (nothing for other runs)."""

    def __init__(
        self,
        state: RunState,
        teardown: Teardown,
        environ: Optional[Mapping[str, str]] = None,
        poll: float = defaults.SLURM_POLL,
    ) -> None:
        self.state = state
        self.teardown = teardown
        self.job = job_of(state.layout)
        self.environ = os.environ if environ is None else environ
        self.poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="slurm-job")

    def __enter__(self) -> JobWatch:
        if self.job is not None:
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            if self.check():
                return

    def check(self) -> bool:
        """Look at the job once; True (and the run stopped) when it no longer runs."""
        if self.job is None:
            return False
        try:
            cause = job_ended(self.job, slurm.job_state(self.job, self.environ))
        except SshddpError:
            return False  # the controller is busy or down: look again later
        if cause is None:
            return False
        with self.state.lock:
            if self.state.cause is None:
                self.state.cause = cause
        self.teardown.request(False, cause)
        return True

    def settle(self, result: RunResult) -> RunResult:
        """``result``, naming the job's end if the run did not succeed and the job has ended
        meanwhile (the nodes may have reported before the next look)."""
        settled = result.ok or result.detached or result.cause is not None
        if not settled and self.check():
            result.cause = self.state.cause
        return result

"""What ``sshddp.launch`` raises when a run does not give every rank's value back: errors of
sshddp's one tree, so ``except sshddp.UsageError`` and the CLI's exit codes hold here too."""

from __future__ import annotations

from typing import Any, Optional

from sshddp.errors import ExitCode, NodeFailed, SshddpError


class RunFailed(NodeFailed):
    """The run failed and no rank's function raised (a rank was killed, a host was lost):
    the message is the report the CLI prints."""

    def __init__(self, message: str, run_id: str, report: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.report = report  #: the CLI's report, as text


class RankFailed(RunFailed):
    """A rank's function raised: the first one to, by the time it did."""

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        report: str,
        rank: int,
        host: str,
        node: int,
        traceback: str,
        root_cause: str,
        values: dict[int, Any],
    ) -> None:
        super().__init__(message, run_id, report)
        self.rank = rank  #: the global rank whose function raised
        self.host = host  #: the host it ran on
        self.node = node  #: its node rank
        self.traceback = traceback  #: the rank's own traceback: its frames, none of sshddp's
        self.root_cause = root_cause  #: the report's root cause, as the CLI names it
        self.values = values  #: the return values of the ranks that finished, by global rank


class RunHung(SshddpError):
    """A watchdog stopped the run: the world never formed, or it stalled."""

    exit_code = ExitCode.HUNG

    def __init__(self, message: str, run_id: str, report: str, stacks: Optional[str]) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.report = report  #: the CLI's report, as text
        self.stacks = stacks  #: the stacks the watchdog took, as ``sshddp stacks`` shows them


class ResultError(SshddpError):
    """A rank's return value could not come back: too large, or not picklable (there or
    here). The message names the rank and the value's type."""

    exit_code = ExitCode.RUN_FAILED

    def __init__(self, message: str, run_id: str, rank: int) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.rank = rank  #: the global rank whose value could not come back

"""The one exception tree of sshddp and the process exit codes it maps to.

Every error a user can cause or meet is an ``SshddpError`` carrying its exit status;
only ``cli.py`` turns one into a printed message and ``sys.exit``.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Documented process exit statuses (README.md, "Exit codes")."""

    OK = 0
    RUN_FAILED = 1  #: a node of the run failed, or the run was stopped
    BAD_INPUT = 2  #: bad command line, inventory, run id or local file
    CHECK_FAILED = 3  #: doctor or the launch preflight found a failing check
    UNREACHABLE = 4  #: a host needed for the command could not be reached
    NOT_RUNNING = 5  #: the run has ended: nothing to look at live (``stacks``)
    HUNG = 6  #: a watchdog stopped the run: the world never formed, or the run stalled
    SYNC_FAILED = 7  #: sync could not build a host's environment (uv failed, no such Python)
    INTERNAL = 70  #: a bug in sshddp (EX_SOFTWARE); rerun with --traceback
    #: a local file (a log, the registry), or a host receiving the code, could not take bytes
    LOG_WRITE_FAILED = 74
    INTERRUPTED = 130  #: Ctrl-C


class SshddpError(Exception):
    """Base of every error sshddp reports to the user without a traceback."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(SshddpError):
    """A bad command-line value (option, run id, local path)."""

    exit_code = ExitCode.BAD_INPUT


class InventoryError(SshddpError):
    """The inventory file is missing, unreadable, not YAML, or invalid."""

    exit_code = ExitCode.BAD_INPUT


class RunNotFound(UsageError):
    """A run id (or prefix) that names no run, or more than one."""


class RunNotRunning(SshddpError):
    """The run has ended on every node: there is no live process to look at."""

    exit_code = ExitCode.NOT_RUNNING


class RunGone(RunNotFound):
    """The hosts hold nothing more of a run (retention removed its run directories) and
    this machine never recorded how it ended."""


class CheckFailed(SshddpError):
    """Doctor or the launch preflight found at least one failing check."""

    exit_code = ExitCode.CHECK_FAILED


class Quarantined(CheckFailed):
    """A launch named a host in quarantine (``sshddp quarantine``): exit 3, as a failing
    preflight check, since the inventory itself is valid."""


class HostUnreachable(SshddpError):
    """A host could not be connected to or authenticated with."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, host: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.host = host
        self.hint = hint


class RemoteError(SshddpError):
    """A remote helper script failed in a way that is not the user's run failing."""

    exit_code = ExitCode.UNREACHABLE


class InterpreterMissing(RemoteError):
    """The host's configured Python interpreter does not exist there."""


class LogWriteFailed(SshddpError):
    """A local log file could not take more bytes (disk full, quota, I/O error)."""

    exit_code = ExitCode.LOG_WRITE_FAILED


class LocalWriteFailed(SshddpError):
    """A local copy (``fetch``'s DEST) could not be written (disk full, I/O error)."""

    exit_code = ExitCode.LOG_WRITE_FAILED


class HostDiskFull(SshddpError):
    """A host's disk filled as it received the code: nothing was started anywhere."""

    exit_code = ExitCode.LOG_WRITE_FAILED


class StateError(SshddpError):
    """The local state directory (the run registry) cannot be used: exit 2 when the path is
    the problem (unwritable, under a file, a malformed record), 74 when its disk is full."""

    def __init__(self, message: str, full: bool = False) -> None:
        super().__init__(message)
        self.exit_code = ExitCode.LOG_WRITE_FAILED if full else ExitCode.BAD_INPUT


class SyncFailed(SshddpError):
    """``launch --sync``: a host's environment could not be built (exit 7), a host could
    not be reached (exit 4), or a host's workdir failed the launch's checks (exit 3); the
    message names each such host."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.SYNC_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NodeFailed(SshddpError):
    """The run failed: the report names the root cause."""

    exit_code = ExitCode.RUN_FAILED


class Interrupted(SshddpError):
    """The user pressed Ctrl-C; the run was stopped."""

    exit_code = ExitCode.INTERRUPTED

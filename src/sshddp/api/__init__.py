"""The Python API: ``sshddp.launch(fn, inventory)`` runs a function on every rank and returns
every rank's value (``LaunchResult``), or raises ``RankFailed``, ``RunHung`` or
``ResultError``. A thin door into the launch command's machinery (``cli.launch``)."""

from __future__ import annotations

from sshddp.api.errors import RankFailed, ResultError, RunFailed, RunHung
from sshddp.api.launch import LaunchResult, launch
from sshddp.api.peek import Stacks
from sshddp.api.start import Run, start
from sshddp.errors import UsageError

__all__ = [
    "LaunchResult",
    "RankFailed",
    "ResultError",
    "RunFailed",
    "Run",
    "RunHung",
    "Stacks",
    "UsageError",
    "launch",
    "start",
]

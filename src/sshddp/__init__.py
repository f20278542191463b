"""sshddp: run PyTorch distributed training across GPU machines over plain SSH."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.4.0"

# (not for the shipped code's check at Python 3.8: the API is the coordinator's, 3.10+)
if TYPE_CHECKING and sys.version_info >= (3, 10):
    from sshddp.api import RankFailed as RankFailed
    from sshddp.api import ResultError as ResultError
    from sshddp.api import RunFailed as RunFailed
    from sshddp.api import RunHung as RunHung
    from sshddp.api import Stacks as Stacks
    from sshddp.api import UsageError as UsageError
    from sshddp.api.launch import LaunchResult as LaunchResult
    from sshddp.api.launch import launch as launch
    from sshddp.api.start import Run as Run
    from sshddp.api.start import start as start

#: the API's names, imported on first use: ``import sshddp`` (and the CLI) stay as fast
_API = frozenset(
    {
        "LaunchResult",
        "RankFailed",
        "ResultError",
        "Run",
        "RunFailed",
        "RunHung",
        "Stacks",
        "UsageError",
        "launch",
        "start",
    }
)
__all__ = ["__version__", *sorted(_API)]


def __getattr__(name: str) -> Any:
    if name in _API:
        from sshddp import api

        return getattr(api, name)
    raise AttributeError(f"module 'sshddp' has no attribute {name!r}")

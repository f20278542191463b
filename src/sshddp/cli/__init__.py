"""The command line (click only): parse, build typed options, call ``sshddp.run``, print,
exit. See ``app`` for the entry points.

This module imports nothing of the CLI itself: ``main``, the console script, is running
before click and the commands' modules are imported, so a Ctrl-C while they are (the
first fraction of a second) ends it as one at any later point does, without a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from sshddp.errors import ExitCode

if TYPE_CHECKING:
    from sshddp.cli.terminal import Terminal

__all__ = ["cli", "main", "run"]


def main(argv: Optional[Sequence[str]] = None, terminal: Optional[Terminal] = None) -> None:
    """Console-script entry point: ``app.main``, once the CLI is imported. A Ctrl-C before
    ``app`` takes over SIGINT exits 130 with one line, as ``app`` says it."""
    try:
        from sshddp.cli import app

        app.main(argv, terminal)
    except KeyboardInterrupt:
        sys.stderr.write("sshddp: interrupted\n")
        sys.exit(ExitCode.INTERRUPTED)


def run(argv: Optional[Sequence[str]] = None, terminal: Optional[Terminal] = None) -> int:
    """``app.run``: the CLI in-process (tests)."""
    from sshddp.cli import app

    return app.run(argv, terminal)


def __getattr__(name: str) -> Any:
    if name == "cli":  # the click group, imported when asked for
        from sshddp.cli.app import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

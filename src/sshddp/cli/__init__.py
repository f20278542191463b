"""The command line (click only): parse, build typed options, call ``sshddp.run``, print,
exit. See ``app`` for the entry points."""

from __future__ import annotations

from sshddp.cli.app import cli, main, run

__all__ = ["cli", "main", "run"]

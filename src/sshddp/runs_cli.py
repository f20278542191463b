"""Commands on existing runs: attach, logs, ps, stop."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add the run commands to the top-level group."""

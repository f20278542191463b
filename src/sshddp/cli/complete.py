"""Shell completion of run ids (``_SSHDDP_COMPLETE``, see docs/install.md): from the local
registry's file names only, so pressing Tab never contacts a host or parses a record."""

from __future__ import annotations

import click
from click.shell_completion import CompletionItem

from sshddp.run import registry


def complete_run_ids(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The recorded run ids that start with what was typed, newest first."""
    return [CompletionItem(i) for i in registry.run_ids() if i.startswith(incomplete)]

"""``sshddp sync``: every host gets the environment of a uv project's lock."""

from __future__ import annotations

from typing import Any

import click

from sshddp.cli.hostlist import host_list_options, split_hosts
from sshddp.cli.options import CONTEXT, Exit, make_ssh, ssh_options, terminal_of, trace_option
from sshddp.errors import UsageError
from sshddp.model import sync as model
from sshddp.run.sync import load_project, sync_hosts


@click.command("sync", context_settings=CONTEXT)
@click.argument("args", nargs=-1, metavar="INVENTORY PROJECT")
@ssh_options
@trace_option
@host_list_options
@click.pass_context
def sync(ctx: click.Context, args: tuple[str, ...], **kw: Any) -> None:
    """Give every host of INVENTORY (or of -H) the virtual environment that PROJECT's lock
    describes: PROJECT is a uv project (a directory with pyproject.toml and uv.lock).

    Each host's environment lives under its sshddp workdir (envs/KEY), KEY a hash of the
    lock, the host's platform and its Python; a host that has it answers at once. uv does
    the installing (sshddp brings it to a host without it), with the inventory's env.
    `launch --sync PROJECT` runs the ranks in it. Exit 0 when every host has its
    environment, 7 when one could not be built (uv's message names why), 4 when a host
    could not be reached.
    """
    terminal = terminal_of(ctx)
    ssh = make_ssh(kw)
    inventory, rest, _ = split_hosts(ctx, args, kw, "PROJECT")
    if len(rest) != 1:
        raise UsageError("expected one PROJECT: `sshddp sync INVENTORY PROJECT`")
    project = load_project(rest[0])
    results = sync_hosts(inventory, project, ssh, kw["fanout"])
    for result in sorted(results, key=lambda r: r.node):
        terminal.out(model.line(result, project.python))
    terminal.err(model.summary(results))
    raise Exit(model.exit_code(results))

"""``sshddp exec``: run one command on every host in parallel, grouped output, status per host."""

from __future__ import annotations

import threading
from typing import Any, BinaryIO

import click

from sshddp.cli.hostlist import DashDashCommand, host_list_options, split_hosts
from sshddp.cli.options import (
    CONTEXT,
    Exit,
    Seconds,
    make_ssh,
    ssh_options,
    terminal_of,
    trace_option,
)
from sshddp.model import exec as model
from sshddp.model.inventory import Host
from sshddp.run.exec import run_everywhere


@click.command(
    "exec", cls=DashDashCommand, context_settings={**CONTEXT, "allow_interspersed_args": False}
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="INVENTORY -- COMMAND [ARGS]...")
@ssh_options
@trace_option
@host_list_options
@click.option(
    "--timeout",
    type=Seconds(min=0.1),
    metavar="SECONDS",
    help="Give up on a host whose command runs longer (it is reported, not killed).",
)
@click.option("--json", "as_json", is_flag=True, help="Print every host's outcome as JSON.")
@click.option("--stream", is_flag=True, help="Print lines as they come, prefixed with the host.")
@click.pass_context
def exec_(ctx: click.Context, args: tuple[str, ...], **kw: Any) -> None:
    """Run COMMAND on every host of INVENTORY (or of -H) in parallel, like `pdsh -w` with
    `dshbak -c`: hosts whose output is identical are printed once, under one header.

    COMMAND and its ARGS reach each host verbatim as argv, with no shell of ours in
    between (write `sh -c '...'` for one), with the inventory's env and the host's python
    directory first on PATH, as under `--launcher node`. Exit 0 when it exited 0
    everywhere, 1 when it failed or timed out on a host, 4 when a host could not be reached.
    """
    terminal = terminal_of(ctx)
    ssh = make_ssh(kw)
    inventory, command, _ = split_hosts(ctx, args, kw, "COMMAND")
    model.check_command(command)  # a bad COMMAND is refused before anything connects
    lock = threading.Lock()
    width = max(len(h.host) for h in inventory.hosts)
    tty = _isatty(terminal.stdout_bytes)  # the hosts' bytes are filtered for a terminal only

    def line(host: Host, data: bytes) -> None:
        with lock:
            prefix = f"{host.host:<{width}}: ".encode()
            terminal.stdout_bytes.write(model.stream_line(prefix, data, tty))
            terminal.stdout_bytes.flush()

    sink = line if kw["stream"] and not kw["as_json"] else None
    results = run_everywhere(inventory, command, ssh, kw["fanout"], kw["timeout"], sink)
    if kw["as_json"]:
        for text in model.json_pieces(results):
            terminal.stdout.write(text)
        terminal.out("")
    elif not kw["stream"]:
        for piece in model.rendered(results, tty):  # a piece at a time: the output may be large
            terminal.stdout_bytes.write(piece)
        terminal.stdout_bytes.flush()
    terminal.err(model.summary(results))
    raise Exit(model.exit_code(results))


def _isatty(stream: BinaryIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False

"""``sshddp doctor``: check every host of an inventory before a run."""

from __future__ import annotations

import os
from typing import Any, Optional

import click

from sshddp.cli.hostlist import host_list_options, split_hosts
from sshddp.cli.options import CONTEXT, Exit, make_ssh, ssh_options, terminal_of
from sshddp.errors import ExitCode, UsageError
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import node_addr
from sshddp.model.checks import Context, reports_ok
from sshddp.model.report import doctor_json, doctor_table
from sshddp.run import preflight


@click.command(context_settings=CONTEXT)
@click.argument("inventory", required=False, metavar="[INVENTORY]")
@ssh_options
@host_list_options
@click.option("--script", metavar="FILE", help="Also check that FILE is present or shippable.")
@click.option("--port", type=click.IntRange(1, 65535), help="Rendezvous port to check.")
@click.option("--json", "as_json", is_flag=True, help="Print facts and findings as JSON.")
@click.pass_context
def doctor(ctx: click.Context, inventory: Optional[str], **kw: Any) -> None:
    """Check every host of INVENTORY (or of -H): reachability, Python/torch/CUDA/NCCL
    parity, GPUs, the rendezvous port and its reachability from every host. Exit 0 when all
    pass, 3 when a check fails."""
    terminal = terminal_of(ctx)
    ssh = make_ssh(kw)
    if inventory is not None and kw["hosts"] is not None:
        raise UsageError(f"{inventory}: give an INVENTORY or -H, not both")
    inv, _, _ = split_hosts(ctx, [inventory] if inventory else [], kw, "the options")
    script = kw["script"]
    checks = Context(
        rdzv_addr=inv.rendezvous.host or node_addr(inv.hosts[0], ssh),
        rdzv_port=kw["port"] or inv.rendezvous.port,
        script=script,
        script_is_local=bool(script) and os.path.isfile(script or ""),
    )
    with HostPool(inv.hosts, ssh, kw["fanout"]) as pool:
        facts, reports = preflight.doctor(pool, checks)
    if kw["as_json"]:
        terminal.out(doctor_json(facts, reports))
    else:
        terminal.show(doctor_table(reports))
    raise Exit(ExitCode.OK if reports_ok(reports) else ExitCode.CHECK_FAILED)

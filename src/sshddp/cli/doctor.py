"""``sshddp doctor``: check every host of an inventory before a run."""

from __future__ import annotations

import os
from typing import Any

import click

from sshddp.cli.options import (
    CONTEXT,
    Exit,
    make_ssh,
    ssh_options,
    terminal_of,
    transport_option,
)
from sshddp.errors import ExitCode
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import node_addr
from sshddp.model.checks import Context, reports_ok
from sshddp.model.report import doctor_json, doctor_table
from sshddp.run import preflight
from sshddp.run.inputs import load_source


@click.command(context_settings=CONTEXT)
@click.argument("inventory", type=click.Path())
@ssh_options
@transport_option
@click.option("--script", metavar="FILE", help="Also check that FILE is present or shippable.")
@click.option("--port", type=click.IntRange(1, 65535), help="Rendezvous port to check.")
@click.option("--json", "as_json", is_flag=True, help="Print facts and findings as JSON.")
@click.pass_context
def doctor(ctx: click.Context, inventory: str, **kw: Any) -> None:
    """Check every host of INVENTORY: reachability, Python/torch/CUDA/NCCL parity, GPUs,
    the rendezvous port and its reachability from every host; on a Slurm job's nodes
    (INVENTORY slurm or slurm:JOBID) also the GPUs each step sees. Exit 0 when all pass, 3
    when a check fails."""
    terminal = terminal_of(ctx)
    ssh = make_ssh(kw)
    inv = load_source(inventory, terminal.environ, kw["transport"])
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

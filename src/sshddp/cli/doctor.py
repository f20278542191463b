"""``sshddp doctor``: check every host of an inventory before a run."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Optional

import click

from sshddp import defaults
from sshddp.cli.hostlist import host_list_options, split_hosts
from sshddp.cli.options import (
    CONTEXT,
    PORT_HELP,
    PORT_OR_AUTO,
    Exit,
    make_ssh,
    ssh_options,
    terminal_of,
    trace_option,
    transport_option,
)
from sshddp.cli.terminal import Terminal
from sshddp.errors import ExitCode, StateError, UsageError
from sshddp.hosts.pool import HostPool, node_addr
from sshddp.hosts.transport import SshOptions
from sshddp.model import cudadriver, envvars, quarantine
from sshddp.model import sync as sync_model
from sshddp.model.checks import Context, HostReport, reports_ok
from sshddp.model.inventory import Inventory
from sshddp.model.plan import LaunchOptions
from sshddp.model.report import doctor_json, doctor_table
from sshddp.run import preflight
from sshddp.run.payload import code_spec
from sshddp.run.quarantine import store as quarantine_store
from sshddp.run.scriptcheck import script_imports
from sshddp.run.sync import load_project, project_path, sync_hosts


@click.command(context_settings=CONTEXT)
@click.argument("inventory", required=False, metavar="[INVENTORY]")
@ssh_options
@trace_option
@host_list_options
@transport_option
@click.option(
    "--script",
    metavar="FILE",
    help="Also check that FILE is present or shippable, and that every host finds the "
    "modules it imports.",
)
@click.option(
    "--workdir", metavar="DIR", help="The directory a launch would ship (its modules count)."
)
@click.option("--port", type=PORT_OR_AUTO, metavar="N|auto", help=PORT_HELP)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Environment the ranks would get (repeatable), as for launch; checks run with it.",
)
@click.option(
    "--sync",
    "sync_project",
    metavar="PROJECT",
    help="Check the hosts in the environments `sshddp sync PROJECT` made (their Python, "
    "torch, imports), and show each host's environment hash. Inventory: `sync:` in defaults.",
)
@click.option(
    "--health",
    is_flag=False,
    flag_value="basic",
    default=None,
    metavar="[=deep]",
    help="Also check the hardware's health: the inventory's `health:` command on every "
    "host, each GPU's ECC errors, pending remaps, recovery action, hardware slowdowns and "
    "PCIe link, Xids in the kernel log, InfiniBand ports (docs/health.md). --health=deep "
    "adds `dcgmi diag -r 1` where DCGM is installed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print facts and findings as JSON.")
@click.pass_context
def doctor(ctx: click.Context, inventory: Optional[str], **kw: Any) -> None:
    """Check every host of INVENTORY (or of -H): reachability, Python/torch/CUDA/NCCL
    parity, GPUs, the environment the ranks will get, network interfaces, entries that are
    one machine, the rendezvous port and its reachability from every host, clocks and the
    script's imports; on a Slurm job's nodes (INVENTORY slurm or slurm:JOBID) also the GPUs
    each step sees; with --health, the hardware's health. Exit 0 when all pass, 3 when a
    check fails."""
    terminal = terminal_of(ctx)
    ssh = make_ssh(kw)
    env, secrets = envvars.parse_env_pairs(tuple(kw["env_items"]), terminal.environ.get)
    inventory = _health_level(inventory, kw)
    if inventory is not None and kw["hosts"] is not None:
        raise UsageError(f"{inventory}: give an INVENTORY or -H, not both")
    inv, _, _ = split_hosts(ctx, [inventory] if inventory else [], kw, "the options")
    project = project_path(kw["sync_project"], inv)
    locked_cuda = None
    if project is not None:
        inv, locked_cuda = _in_environments(terminal, inv, project, ssh, kw["fanout"])
    checks = _context(inv, kw, node_addr(inv.hosts[0], ssh), env, secrets)
    checks = replace(checks, locked_cuda=locked_cuda)
    with HostPool(inv.hosts, ssh, kw["fanout"]) as pool:
        facts, reports = preflight.doctor(pool, checks)
    reports = _marked(terminal, reports)
    if kw["as_json"]:
        terminal.out(doctor_json(facts, reports, checks.secret_names))
    else:
        terminal.show(doctor_table(reports))
    raise Exit(ExitCode.OK if reports_ok(reports) else ExitCode.CHECK_FAILED)


def _marked(terminal: Terminal, reports: Sequence[HostReport]) -> list[HostReport]:
    """The reports with each quarantined host's warning; a quarantine file that cannot be
    read is named, and the checks stand."""
    try:
        store = quarantine_store.load()
    except StateError as exc:
        terminal.err(f"sshddp: warning: {exc.message}")
        return list(reports)
    return quarantine.marked(reports, store, time.time())


def _health_level(inventory: Optional[str], kw: dict[str, Any]) -> Optional[str]:
    """``--health`` alone is basic, ``--health=deep`` deep. Its value being optional, click
    gives a bare ``--health`` the word after it: before INVENTORY, that word is INVENTORY."""
    level = kw["health"]
    if level in (None, "basic", "deep"):
        return inventory
    if inventory is None and kw["hosts"] is None:
        kw["health"] = "basic"
        return str(level)
    raise UsageError(f"--health={level}: expected --health or --health=deep")


def _in_environments(
    terminal: Terminal, inv: Inventory, project: str, ssh: SshOptions, fanout: int
) -> tuple[Inventory, Optional[str]]:
    """``inv`` with each host's python its synced environment's, and the CUDA of the torch
    build the lock pins (each host's driver is checked against it); each host's hash
    shown. A host without the environment fails doctor (exit 3) here."""
    loaded = load_project(project)
    results = sync_hosts(inv, loaded, ssh, fanout, check=True)
    for result in sorted(results, key=lambda r: r.node):
        terminal.err(sync_model.line(result, loaded.python))
    pythons = sync_model.pythons(results)
    if pythons is None:
        terminal.err(sync_model.summary(results))
        raise Exit(ExitCode.CHECK_FAILED)
    hosts = tuple(replace(h, python=pythons[h.index]) for h in inv.hosts)
    return replace(inv, hosts=hosts), cudadriver.locked_cuda(loaded.files)


def _context(
    inv: Inventory,
    kw: dict[str, Any],
    first_addr: str,
    env: envvars.EnvPairs,
    secrets: frozenset[str],
) -> Context:
    """What doctor checks against: the inventory, --port, --env and the script, if any."""
    port = kw["port"] if kw["port"] is not None else inv.rendezvous.port
    if port != defaults.AUTO_PORT and not 1 <= port <= 65534:
        raise UsageError(f"--port {port}: expected a TCP port, 1-65534, or auto")
    script = kw["script"]
    code = code_spec(LaunchOptions(script=script, workdir=kw["workdir"])) if script else None
    return Context(
        rdzv_addr=inv.rendezvous.host or first_addr,
        rdzv_port=port,
        script=script,
        script_is_local=code is not None and code.kind != "remote",
        inventory=inv.source,
        rdzv_host_set=inv.rendezvous.host is not None,
        cli_env=env,
        secret_names=envvars.secret_names(secrets, [h.env for h in inv.hosts]),
        imports=script_imports(code, False) if code else None,
        health=kw["health"] or "command",  # a launch runs the health: command too
    )

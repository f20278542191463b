"""``sshddp launch``: parse the launch's options, run it, print its report, exit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

import click

from sshddp import defaults
from sshddp.cli.hostlist import (
    DashDashCommand,
    host_list_options,
    spares_option,
    split_hosts,
    with_spares,
)
from sshddp.cli.options import (
    CONTEXT,
    PORT_HELP,
    PORT_OR_AUTO,
    Duration,
    Exit,
    Seconds,
    count,
    log_dir_option,
    make_ssh,
    ranks_option,
    select_verbose,
    selected_ranks,
    ssh_options,
    terminal_of,
    transport_option,
    verbose_option,
)
from sshddp.cli.terminal import Terminal
from sshddp.cli.watchdog import read_hang, watchdog_options
from sshddp.errors import ExitCode, UsageError
from sshddp.model.allocation import check_not_in_step
from sshddp.model.envvars import parse_env_pairs
from sshddp.model.inventory import Inventory
from sshddp.model.launchers import LAUNCHERS
from sshddp.model.plan import LaunchOptions, stages_spares
from sshddp.model.report import doctor_table, run_report
from sshddp.model.state import RunResult
from sshddp.model.sync import summary as sync_summary
from sshddp.run import coordinator
from sshddp.run.logread import rank_tail
from sshddp.run.preflight import PreflightFailed
from sshddp.run.quarantine.spares import swap_bad_hosts
from sshddp.run.sinks import tail_lines
from sshddp.run.sync import project_path, synced

REPORT_TAIL = 400  # lines of the failing node's log the report looks through


# Not interspersed: parsing stops at INVENTORY, so the script's own options pass through.
@click.command(cls=DashDashCommand, context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="INVENTORY SCRIPT [ARGS]...")
@ssh_options
@ranks_option
@verbose_option
@host_list_options
@spares_option
@transport_option
@click.option("-m", "--module", metavar="MODULE", help="Run a Python module instead of SCRIPT.")
@click.option(
    "--launcher",
    type=click.Choice(LAUNCHERS),
    default="torchrun",
    show_default=True,
    help="torchrun on every node, or `node`: one process per node that spawns its own "
    "workers (Lightning, mp.spawn, or `-- COMMAND` such as `accelerate launch`).",
)
@click.option(
    "--nproc-per-node",
    type=count(1, defaults.MAX_PROCS_PER_NODE),
    metavar="N",
    help="Processes per node (default: gpus, or nproc).",
)
@click.option("--port", type=PORT_OR_AUTO, metavar="N|auto", help=PORT_HELP)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Environment for every rank (repeatable); KEY alone copies it from here.",
)
@click.option("--workdir", metavar="DIR", help="Ship this local directory (honours .gitignore).")
@click.option(
    "--include",
    multiple=True,
    metavar="PATTERN",
    help="Ship the --workdir's files that .gitignore leaves out when they match PATTERN "
    "(gitignore syntax, relative to the workdir, e.g. 'data/*.bin'); repeatable. Inventory: "
    "`include:` in defaults.",
)
@log_dir_option
@click.option("--name", metavar="NAME", help="Run id (refused if it exists).")
@click.option("--dry-run", is_flag=True, help="Print the per-node plan; connect to nothing.")
@click.option("--no-check", is_flag=True, help="Skip the preflight checks.")
@click.option("--detach", is_flag=True, help="Return once every node has started.")
@click.option(
    "--max-restarts",
    type=count(0, defaults.MAX_RESTARTS),
    default=0,
    show_default=True,
    metavar="N",
    help="After a failure, stop every node and start the whole run again, up to N times.",
)
@click.option(
    "--min-nodes",
    type=count(1, 100_000),
    default=None,
    metavar="K",
    help="With --max-restarts: once a node is lost and no spare is left, go on with K or "
    "more nodes (the inventory's min_nodes:).",
)
@click.option(
    "--grace",
    type=Seconds(min=0),
    default=defaults.GRACE,
    show_default=True,
    metavar="SECONDS",
    help="SIGTERM to SIGKILL at teardown.",
)
@click.option(
    "--heartbeat-timeout",
    type=Seconds(min=0.5),
    default=defaults.HEARTBEAT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="A node silent this long counts as lost, and the run is stopped.",
)
@click.option(
    "--tty",
    is_flag=True,
    help="Give the ranks a terminal (isatty() true: colours, progress bars) instead of a "
    "pipe; caps a node's output near 100 MB/s.",
)
@click.option(
    "--torchrun-arg",
    "torchrun_args",
    multiple=True,
    metavar="--OPT=VALUE",
    help="Pass one option to torchrun (repeatable), e.g. --torchrun-arg=--local-ranks-filter=0. "
    "Options sshddp sets itself (--nnodes, --node-rank, --nproc-per-node, --rdzv-endpoint...) "
    "are refused.",
)
@click.option(
    "--local-rank-arg",
    is_flag=True,
    help="Append --local_rank=N to the script's arguments (scripts written for "
    "torch.distributed.launch).",
)
@click.option(
    "--fresh-cwd",
    is_flag=True,
    help="Run in a new directory for this run only (removed by retention), not in the "
    "workspace that the script's directory keeps on each host.",
)
@click.option(
    "--share",
    multiple=True,
    metavar="PATH",
    help="Before the ranks start, make PATH (relative to the ranks' working directory, e.g. "
    "snapshot.pt) on every node a copy of node 0's, sent from node 0 and checked by SHA-256; "
    "repeatable. For hosts that share no disk, when rank 0 saves a checkpoint every rank loads.",
)
@click.option(
    "--sync",
    "sync_project",
    metavar="PROJECT",
    help="First give every host the environment of uv project PROJECT (as `sshddp sync`), "
    "then run the ranks with its Python (instead of `python:`). Inventory: `sync:` in defaults.",
)
@click.option(
    "--quarantine-for",
    type=Duration(),
    default=defaults.QUARANTINE_FOR,
    metavar="DURATION",
    help="A host whose node ends the run (lost, unreachable, a GPU hardware error) is left "
    "out of launches this long, e.g. 24h, 30m, 2d; 0: never. Default: 24h. See `sshddp "
    "quarantine`.",
)
@click.option(
    "--ignore-quarantine",
    is_flag=True,
    help="Launch on the inventory's hosts even where one is quarantined.",
)
@watchdog_options
@click.pass_context
def launch(ctx: click.Context, args: tuple[str, ...], **kw: Any) -> None:
    """Start SCRIPT (or -m MODULE) under torchrun on every host of INVENTORY (or of -H).

    INVENTORY is a file, or `slurm` (the Slurm allocation sshddp runs in) or `slurm:JOBID`
    (a running job's nodes). Options go before INVENTORY; everything after SCRIPT goes to
    the script verbatim. With --launcher node, each node runs SCRIPT once (it spawns its
    own workers), or the command after `--`, whose arguments may use {node_rank} {nnodes}
    {master_addr} {master_port} {nproc} {world_size}.
    """
    terminal = terminal_of(ctx)
    outcome = run_launch(ctx, args, kw, terminal)
    if outcome.report:
        terminal.err(outcome.report)
    raise Exit(outcome.exit_code)


@dataclass(frozen=True)
class LaunchOutcome:
    """How a launch ended, for the command to print and exit with (or the API to return)."""

    result: Optional[RunResult]  #: the run's end; None for --dry-run and --detach
    report: str  #: the report the command prints ("" when no run ended here)
    exit_code: int  #: the command's exit status
    stacks: str = ""  #: a hung run's stacks, as the watchdog took them (printed already)


def run_launch(
    ctx: click.Context, args: Sequence[str], kw: dict[str, Any], terminal: Terminal
) -> LaunchOutcome:
    """The launch that ``kw`` (the command's options) and ``args`` (INVENTORY SCRIPT
    [ARGS]) ask for, run to its end; it prints nothing of the report itself."""
    check_not_in_step(terminal.environ)
    select_verbose(terminal, kw["verbose"])
    inv, rest, dashdash = split_hosts(ctx, args, kw, "SCRIPT")
    return launch_on(inv, rest, kw, terminal, dashdash)


def launch_on(
    inv: Inventory,
    script_and_args: Sequence[str],
    kw: dict[str, Any],
    terminal: Terminal,
    dashdash: bool = False,
) -> LaunchOutcome:
    """Launch ``script_and_args`` on ``inv``'s hosts (spares, quarantine and --sync
    applied), with the command's options ``kw``."""
    ssh = make_ssh(kw)
    inv = with_spares(inv, kw["spares"])
    options, secrets = launch_options(script_and_args, kw, terminal, dashdash)
    if not kw["dry_run"]:  # a dry run connects to nothing: its plan is the inventory's
        # before --sync: the hosts it gives an environment are those that will run
        inv = swap_bad_hosts(
            inv,
            ssh,
            kw["fanout"],
            terminal.err,
            kw["ignore_quarantine"],
            kw["quarantine_for"],
            env=options.env,
        )
    project = project_path(kw["sync_project"], inv)
    if project is not None and not kw["dry_run"]:  # a dry run connects to nothing
        spares = stages_spares(options)  # a spare seated mid-run runs the same environment
        inv, synced_hosts, left = synced(inv, project, ssh, kw["fanout"], spares)
        terminal.err(sync_summary([r for r in synced_hosts if r.status.ok]))  # left: below
        for line in left:
            terminal.err(line)
    try:
        result = coordinator.launch(inv, options, ssh, _mode(kw), terminal, secrets)
    except PreflightFailed as failed:
        terminal.show(doctor_table(failed.reports), to_stderr=True)
        for line in failed.quarantined:
            terminal.err(line)
        raise
    if result is None:
        return LaunchOutcome(None, "", ExitCode.OK)
    stacks = ""
    if result.hung:
        result, stacks = read_hang(result, ssh, kw["fanout"])
        if stacks:
            terminal.err(stacks)
    return LaunchOutcome(result, report_text(result), int(result.exit_code), stacks)


def _mode(kw: dict[str, Any]) -> coordinator.LaunchMode:
    return coordinator.LaunchMode(
        dry_run=kw["dry_run"],
        check=not kw["no_check"],
        detach=kw["detach"],
        fanout=kw["fanout"],
        ranks=selected_ranks(kw["show_ranks"]),
        ignore_quarantine=kw["ignore_quarantine"],
        on_started=kw.get("on_started"),  # set by the Python API only
    )


def launch_options(
    script_and_args: Sequence[str], kw: dict[str, Any], terminal: Terminal, dashdash: bool = False
) -> tuple[LaunchOptions, frozenset[str]]:
    """Split SCRIPT from its arguments (or take the command after ``--``) and gather the
    launch options."""
    if dashdash:
        return _command_options(list(script_and_args), kw, terminal)
    script, module, rest = _script_or_module(list(script_and_args), kw["module"])
    pairs, secrets = parse_env_pairs(tuple(kw["env_items"]), terminal.environ.get)
    options = LaunchOptions(
        script=script,
        module=module,
        script_args=tuple(rest),
        nproc_per_node=kw["nproc_per_node"],
        port=kw["port"],
        env=pairs,
        workdir=kw["workdir"],
        log_dir=kw["log_dir"],
        name=kw["name"],
        max_restarts=kw["max_restarts"],
        min_nodes=kw["min_nodes"] or 0,
        grace=kw["grace"],
        heartbeat_timeout=kw["heartbeat_timeout"],
        tty=kw["tty"],
        tty_size=terminal.size(),
        live=terminal.live(),
        launcher=kw["launcher"],
        torchrun_args=tuple(kw["torchrun_args"]),
        local_rank_arg=kw["local_rank_arg"],
        fresh_cwd=kw["fresh_cwd"],
        init_timeout=kw["init_timeout"],
        stall_timeout=kw["stall_timeout"],
        on_stall=kw["on_stall"],
        share=tuple(kw["share"]),
        include=tuple(kw["include"]),
        quarantine_for=kw["quarantine_for"],
        end_with_caller=bool(kw.get("end_with_caller")),  # set by the Python API only
    )
    return options, secrets


def _script_or_module(
    rest: list[str], module: Optional[str]
) -> tuple[Optional[str], Optional[str], list[str]]:
    """SCRIPT (or ``-m MODULE``) and the arguments after it."""
    if module is None and rest and rest[0] == "-m":
        if len(rest) < 2:
            raise UsageError("-m needs a MODULE")
        module, rest = rest[1], rest[2:]
    script: Optional[str] = None
    if module is None:
        if not rest:
            raise UsageError("missing SCRIPT (or -m MODULE) after the inventory")
        script, rest = rest[0], rest[1:]
        if script.startswith("-"):
            raise UsageError(
                f"{script!r} where SCRIPT was expected: launch options go before the "
                "inventory, e.g. `sshddp launch --dry-run inv.yaml train.py`"
            )
    return script, module, rest


def _command_options(
    command: list[str], kw: dict[str, Any], terminal: Terminal
) -> tuple[LaunchOptions, frozenset[str]]:
    """``--launcher node INV -- COMMAND [ARGS...]``: the node's launcher is COMMAND."""
    if kw["launcher"] != "node":
        raise UsageError(
            "a command after `--` needs --launcher node (torchrun runs a SCRIPT or -m MODULE): "
            "`sshddp launch --launcher node inv.yaml -- accelerate launch train.py`"
        )
    if not command:
        raise UsageError("missing COMMAND after `--`")
    if kw["module"] is not None:
        raise UsageError("-m MODULE and a command after `--` exclude each other")
    options, secrets = launch_options(["_"], kw, terminal)
    return replace(options, script=None, command=tuple(command)), secrets


def report_result(terminal: Terminal, result: RunResult) -> int:
    """Print the run's report; its exit status."""
    terminal.err(report_text(result))
    return int(result.exit_code)


def report_text(result: RunResult) -> str:
    """The run's report: every node's state, then the root cause with its last lines."""
    root = result.root
    tail = tail_lines(root.log_path, REPORT_TAIL) if root is not None else []
    ranks = rank_tail(root.log_path, REPORT_TAIL) if root is not None else None
    return run_report(result, tail, ranks)

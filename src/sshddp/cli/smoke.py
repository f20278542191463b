"""``sshddp smoke``: a real distributed smoke test before a big run, with its figures."""

from __future__ import annotations

from typing import Any

import click

from sshddp import defaults
from sshddp.cli.hostlist import host_list_options, split_hosts
from sshddp.cli.launch import report_result
from sshddp.cli.options import (
    CONTEXT,
    Exit,
    count,
    log_dir_option,
    make_ssh,
    ssh_options,
    terminal_of,
    trace_option,
)
from sshddp.errors import ExitCode, UsageError
from sshddp.model import smoke as model
from sshddp.model.envvars import parse_env_pairs
from sshddp.model.plan import LaunchOptions
from sshddp.model.report import doctor_table
from sshddp.run import coordinator
from sshddp.run.preflight import PreflightFailed
from sshddp.run.smoke import JOB, job_args
from sshddp.run.smoke import smoke as run_smoke

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_SIZE = 16 << 30  # an all-reduce or a send of more is a typo, not a measurement
MAX_ITERS = 100_000


def parse_sizes(text: str, option: str = "--sizes") -> tuple[int, ...]:
    """``1K,64K,16M``: byte counts (K, M, G are powers of 1024)."""
    sizes = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        unit = word[-1].upper() if word[-1].isalpha() else ""
        number = word[:-1] if unit else word
        size = int(number) * _UNITS[unit] if unit in _UNITS and number.isdigit() else 0
        if not 0 < size <= MAX_SIZE:
            raise UsageError(
                f"{option} {text!r}: {word!r} is not a size such as 4096, 64K or 16M, from 1 "
                "byte to 16G"
            )
        sizes.append(size)
    return tuple(sizes)


@click.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.argument("inventory", required=False, metavar="[INVENTORY]")
@ssh_options
@trace_option
@host_list_options
@click.option("--port", type=count(1, 65534), metavar="N", help="Rendezvous port.")
@click.option(
    "--nproc-per-node",
    type=count(1, defaults.MAX_PROCS_PER_NODE),
    metavar="N",
    help="Ranks per node (default: gpus, or nproc).",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Environment for every rank (repeatable).",
)
@click.option(
    "--sizes",
    metavar="B,B,...",
    help="All-reduce sizes, e.g. 1K,1M,64M (default: 1 KiB to 16 MiB on CPU, 256 MiB on GPUs).",
)
@click.option(
    "--iters",
    type=count(1, MAX_ITERS),
    default=20,
    show_default=True,
    help="Timed all-reduces per size.",
)
@click.option(
    "--p2p-size",
    default="4M",
    show_default=True,
    metavar="B",
    help="Bytes each node sends node 0 and back.",
)
@log_dir_option
@click.option("--no-check", is_flag=True, help="Skip the preflight checks.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.pass_context
def smoke(ctx: click.Context, inventory: str | None, **kw: Any) -> None:
    """Run a short distributed job on every host of INVENTORY (or of -H) through the normal
    launch path: every rank must join and an all-reduce give the exact sum; then it measures
    all-reduce bandwidth by size (algorithm and bus bandwidth, as nccl-tests define them)
    and each node's link to node 0, and names a node far slower than the others. Exit 0
    when every rank joined and the sum is exact, 1 when not, 3 when the preflight failed.
    """
    terminal = terminal_of(ctx)
    ssh = make_ssh(kw)
    inv, _, _ = split_hosts(ctx, [inventory] if inventory else [], kw, "the options")
    p2p = parse_sizes(kw["p2p_size"], "--p2p-size")
    pairs, secrets = parse_env_pairs(tuple(kw["env_items"]), terminal.environ.get)
    options = LaunchOptions(
        script=str(JOB),
        script_args=job_args(parse_sizes(kw["sizes"] or ""), kw["iters"], p2p[0] if p2p else 0),
        nproc_per_node=kw["nproc_per_node"],
        port=kw["port"],
        env=pairs,
        log_dir=kw["log_dir"],
    )
    mode = coordinator.LaunchMode(check=not kw["no_check"], fanout=kw["fanout"])
    try:
        result, report = run_smoke(inv, options, ssh, mode, terminal, secrets)
    except PreflightFailed as failed:
        terminal.show(doctor_table(failed.reports), to_stderr=True)
        raise
    if result is not None and not result.ok:
        raise Exit(report_result(terminal, result))
    if report is None:
        terminal.err("sshddp: smoke: the job ended without its record; see node 0's log")
        raise Exit(ExitCode.RUN_FAILED)
    terminal.out(model.to_json(report) if kw["as_json"] else model.render(report))
    raise Exit(ExitCode.OK if report.ok else ExitCode.RUN_FAILED)

"""The commands behind the CLI: each takes parsed values and an Environment, returns a status."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional

from sshddp.checks import Context
from sshddp.cluster import Cluster
from sshddp.doctor import reports_ok, run_checks
from sshddp.environment import Environment
from sshddp.errors import ExitCode, UsageError
from sshddp.inventory import load_inventory
from sshddp.launch import LaunchMode, launch
from sshddp.plan import LaunchOptions, parse_env_pairs
from sshddp.report import doctor_json, doctor_table, peer_cause, run_report
from sshddp.sinks import tail_lines
from sshddp.transport import SshOptions, node_addr


def run_doctor(
    env: Environment,
    inventory_path: str,
    ssh: SshOptions,
    script: Optional[str],
    port: Optional[int],
    as_json: bool,
    fanout: int,
) -> int:
    inventory = load_inventory(inventory_path)
    first = inventory.hosts[0]
    rdzv_addr = inventory.rendezvous.host or node_addr(first, ssh)
    ctx = Context(
        rdzv_addr=rdzv_addr,
        rdzv_port=port or inventory.rendezvous.port,
        script=script,
        script_is_local=bool(script) and os.path.isfile(script or ""),
    )
    with Cluster(inventory.hosts, ssh, fanout) as cluster:
        facts, reports = run_checks(cluster, ctx, deep=True)
    if as_json:
        env.out(doctor_json(facts, reports))
    else:
        doctor_table(reports, env.rich_out())
    return ExitCode.OK if reports_ok(reports) else ExitCode.CHECK_FAILED


def launch_options(
    script_and_args: Sequence[str], kw: dict[str, Any], env: Environment
) -> tuple[LaunchOptions, frozenset[str]]:
    """Split SCRIPT from its arguments and gather the launch options."""
    rest = list(script_and_args)
    module = kw["module"]
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
    pairs, secrets = parse_env_pairs(tuple(kw["env_items"]), env.environ.get)
    options = LaunchOptions(
        script=script, module=module, script_args=tuple(rest),
        nproc_per_node=kw["nproc_per_node"], port=kw["port"], env=pairs,
        workdir=kw["workdir"], log_dir=kw["log_dir"], name=kw["name"],
        max_restarts=kw["max_restarts"], grace=kw["grace"],
        heartbeat_timeout=kw["heartbeat_timeout"],
        tty=kw["tty"],
    )  # fmt: skip
    return options, secrets


def run_launch(
    env: Environment, inventory_path: str, script_and_args: Sequence[str], ssh: SshOptions,
    kw: dict[str, Any],
) -> int:  # fmt: skip
    options, secrets = launch_options(script_and_args, kw, env)
    inventory = load_inventory(inventory_path)
    mode = LaunchMode(dry_run=kw["dry_run"], check=not kw["no_check"], detach=kw["detach"],
                      fanout=kw["fanout"])  # fmt: skip
    result = launch(inventory, options, ssh, mode, env, secrets)
    if result is None:
        return ExitCode.OK
    return report_result(env, result)


def report_result(env: Environment, result: Any) -> int:
    """Print the run's report; its exit status."""
    root = next((n for n in result.nodes if n.node_rank == result.root_cause), None)
    tail = tail_lines(root.log_path, 400) if root is not None else []
    env.err(run_report(result, tail))
    if result.ok:
        return ExitCode.OK
    if result.interrupted:
        return ExitCode.INTERRUPTED
    if result.extra.get("log_error"):
        return ExitCode.LOG_WRITE_FAILED
    if result.detached:
        return ExitCode.OK
    unreachable = any(n.state.value == "unreachable" for n in result.nodes)
    if result.root_cause is None and unreachable and not peer_cause(result):
        return ExitCode.UNREACHABLE
    return ExitCode.RUN_FAILED

"""Commands on existing runs, from any terminal: attach, logs, ps, stop.

They read the local run registry for the hosts and run directories, then ask the hosts
(whose supervisors own the runs) for the live state and the log bytes the local copy lacks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import click

from sshddp import ops, registry
from sshddp.cli import CONTEXT, Exit, env_of, make_ssh, ssh_options
from sshddp.cluster import Cluster
from sshddp.environment import Environment
from sshddp.errors import ExitCode, HostUnreachable, LogWriteFailed
from sshddp.executor import Executor, NodeState
from sshddp.plan import LaunchPlan, NodePlan
from sshddp.sinks import Console, NodeLogs
from sshddp.transport import SshOptions, Transport


def _ssh_for(entry: dict[str, Any], kw: dict[str, Any]) -> SshOptions:
    if not kw.get("ssh_config") and entry.get("ssh_config"):
        kw["ssh_config"] = entry["ssh_config"]
    return make_ssh(kw)


def _connect(cluster: Cluster, strict: bool) -> dict[int, Optional[HostUnreachable]]:
    errors = cluster.connect_all()
    bad = [e for e in errors.values() if e is not None]
    if strict and bad:
        detail = "; ".join(e.message + (f" (fix: {e.hint})" if e.hint else "") for e in bad)
        raise HostUnreachable(bad[0].host, f"cannot reach every host of the run: {detail}")
    return errors


def _logs_and_console(
    plan: LaunchPlan, entry: dict[str, Any], env: Environment
) -> tuple[NodeLogs, Console]:
    logs = NodeLogs(Path(entry["log_dir"]))
    console = Console(env.stdout_bytes, env.color)
    width = max(len(f"[{n.node_rank} {n.host.host}]") for n in plan.nodes)
    for node in plan.nodes:
        logs.open(node.node_rank, node.host.host)
        console.add_node(node.node_rank, node.host.host, width)
    return logs, console


def attach(env: Environment, run: str, kw: dict[str, Any]) -> int:
    from sshddp.commands import report_result
    from sshddp.launch import _detach_on, _finish

    entry = registry.resolve(run)
    plan = registry.plan_of(entry)
    with Cluster([n.host for n in plan.nodes], _ssh_for(entry, kw), kw["fanout"]) as cluster:
        _connect(cluster, strict=True)
        logs, console = _logs_and_console(plan, entry, env)
        env.err(f"sshddp: attached to run {plan.run_id}; Ctrl-C stops it on every host, "
                "Ctrl-\\ detaches")  # fmt: skip
        executor = Executor(plan, cluster, logs, console)
        try:
            with _detach_on(executor):
                result = _finish(executor.follow())
        finally:
            logs.close()
    return report_result(env, result)


def _fetch(transport: Transport, node: NodePlan, logs: NodeLogs) -> dict[str, Any]:
    """Append what the local copy lacks; the node's status."""
    rank = node.node_rank
    return ops.read_node(transport, node.rundir, logs.size(rank), "fetch",
                         lambda data: logs.write(rank, data))  # fmt: skip


def logs_cmd(env: Environment, run: str, kw: dict[str, Any]) -> int:
    entry = registry.resolve(run)
    plan = registry.plan_of(entry)
    nodes = [n for n in plan.nodes if kw["node"] is None or n.node_rank == kw["node"]]
    if not nodes:
        raise click.BadParameter(f"run {plan.run_id} has nodes 0-{len(plan.nodes) - 1}",
                                 param_hint="--node")  # fmt: skip
    with Cluster([n.host for n in plan.nodes], _ssh_for(entry, kw), kw["fanout"]) as cluster:
        errors = _connect(cluster, strict=False)
        logs, console = _logs_and_console(plan, entry, env)
        try:
            reachable = [n for n in nodes if errors[n.host.index] is None]
            fetched = cluster.map(lambda n: _fetch(cluster.transports[n.host.index], n, logs),
                                  reachable)  # fmt: skip
            for outcome in fetched:  # a local copy cut short must not print as the whole log
                if isinstance(outcome.error, LogWriteFailed):
                    raise outcome.error
            for n in nodes:
                if errors[n.host.index] is not None:
                    env.err(f"sshddp: node {n.node_rank} ({n.host.host}) unreachable; showing "
                            f"the local copy only: {errors[n.host.index]}")  # fmt: skip
            _print_logs(env, console, logs, nodes, kw["tail"], single=kw["node"] is not None)
            if kw["follow"]:
                sub = LaunchPlan(**{**plan.__dict__, "nodes": tuple(reachable)})
                Executor(sub, cluster, logs, console, watch_only=True).follow()
        finally:
            logs.close()
    return ExitCode.OK


def _print_logs(env: Environment, console: Console, logs: NodeLogs, nodes: list[NodePlan],
                tail: Optional[int], single: bool) -> None:  # fmt: skip
    for node in nodes:
        data = logs.paths[node.node_rank].read_bytes()
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail:]) if tail > 0 else b""
        if single:
            env.stdout_bytes.write(data)
            env.stdout_bytes.flush()
        else:
            console.write(node.node_rank, data)
            console.flush_node(node.node_rank)


def _states(entry: dict[str, Any], kw: dict[str, Any]) -> list[dict[str, Any]]:
    """Each node's status, read live from its host (or why it could not be)."""
    plan = registry.plan_of(entry)
    with Cluster([n.host for n in plan.nodes], _ssh_for(entry, dict(kw)), kw["fanout"]) as cluster:
        errors = cluster.connect_all()

        def status(node: NodePlan) -> dict[str, Any]:
            err = errors[node.host.index]
            if err is not None:
                return {"state": NodeState.UNREACHABLE.value, "reason": err.message}
            return ops.read_node(cluster.transports[node.host.index], node.rundir, 0, "status")

        outcomes = cluster.map(status, plan.nodes)
    return [o.value if o.ok and o.value else {"state": "unknown", "reason": str(o.error)}
            for o in outcomes]  # fmt: skip


def root_cause(states: list[dict[str, Any]], hosts: list[str]) -> str:
    """The earliest node to fail or be lost, in words."""
    bad = [(s.get("ended") or float("inf"), i, s) for i, s in enumerate(states)
           if s.get("state") in ("failed", "lost")]  # fmt: skip
    if not bad:
        return ""
    _, i, s = min(bad, key=lambda t: (t[0], t[1]))
    return f"node {i} ({hosts[i]}) {s['state']}: {s.get('reason', '')}".rstrip(": ")


def ps_cmd(env: Environment, show_all: bool, kw: dict[str, Any]) -> int:
    from rich.table import Table

    table = Table(header_style="bold")
    for col in ("run", "started", "duration", "nodes", "root cause"):
        table.add_column(col)
    shown = 0
    for entry in registry.all_runs():
        recorded = entry.get("result") or {}
        finished = bool(recorded.get("nodes")) and all(
            n["state"] in _FINAL for n in recorded["nodes"]
        )
        if finished and not show_all:
            continue
        states = _states(entry, kw) if not finished else recorded["nodes"]
        hosts = [n["host"]["host"] for n in entry["nodes"]]
        started = entry.get("created", 0)
        ended = max((s.get("ended") or 0 for s in states), default=0)
        live = any(s.get("state") not in _FINAL for s in states)
        duration = (time.time() if live else ended or time.time()) - started
        summary = " ".join(f"{i}:{s.get('state')}" for i, s in enumerate(states))
        table.add_row(entry["run_id"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
                      _duration(duration), summary, root_cause(states, hosts))  # fmt: skip
        shown += 1
    if shown:
        env.rich_out().print(table)
    else:
        env.out("no runs" + ("" if show_all else " in progress (`sshddp ps --all` lists all)"))
    return ExitCode.OK


_FINAL = {state.value for state in NodeState if state.final}


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def stop_cmd(env: Environment, run: str, kw: dict[str, Any]) -> int:
    entry = registry.resolve(run)
    plan = registry.plan_of(entry)
    with Cluster([n.host for n in plan.nodes], _ssh_for(entry, kw), kw["fanout"]) as cluster:
        errors = _connect(cluster, strict=False)
        reachable = [n for n in plan.nodes if errors[n.host.index] is None]

        def stop(node: NodePlan) -> dict[str, Any]:
            transport = cluster.transports[node.host.index]
            return ops.stop_node(transport, node.rundir, kw["force"], "stopped with `sshddp stop`")

        outcomes = dict(zip((n.node_rank for n in reachable), cluster.map(stop, reachable)))
    code = ExitCode.OK
    for node in plan.nodes:
        err = errors[node.host.index]
        outcome = outcomes.get(node.node_rank)
        if err is not None or outcome is None or not outcome.ok:
            if err is not None:
                why = err.message + (f"\n  fix: {err.hint}" if err.hint else "")
            else:
                why = str(outcome.error if outcome else "no answer")
            env.err(f"node {node.node_rank} ({node.host.host}): NOT stopped: {why}")
            code = ExitCode.UNREACHABLE
            continue
        rec = outcome.value or {}
        was = "was already " + rec.get("state", "?") if rec.get("already") else "stopped"
        env.out(f"node {node.node_rank} ({node.host.host}): {was}")
    return code


def register(group: click.Group) -> None:
    """Add the run commands to the top-level group."""

    @group.command(name="attach", context_settings=CONTEXT)
    @click.argument("run")
    @ssh_options
    @click.pass_context
    def attach_command(ctx: click.Context, run: str, **kw: Any) -> None:
        """Follow RUN live again, like launch; exit with its result."""
        raise Exit(attach(env_of(ctx), run, kw))

    @group.command(name="logs", context_settings=CONTEXT)
    @click.argument("run")
    @click.option("--node", type=click.IntRange(min=0), metavar="K", help="Only node K (raw).")
    @click.option("--follow", "-f", is_flag=True, help="Keep printing until the run ends.")
    @click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Last N lines per node.")
    @ssh_options
    @click.pass_context
    def logs_command(ctx: click.Context, run: str, **kw: Any) -> None:
        """Print RUN's logs, fetching what the local copy lacks from the hosts first."""
        raise Exit(logs_cmd(env_of(ctx), run, kw))

    @group.command(name="ps", context_settings=CONTEXT)
    @click.option("--all", "show_all", is_flag=True, help="Also finished runs.")
    @ssh_options
    @click.pass_context
    def ps_command(ctx: click.Context, show_all: bool, **kw: Any) -> None:
        """List the runs this machine started, with each node's state read live."""
        raise Exit(ps_cmd(env_of(ctx), show_all, kw))

    @group.command(name="stop", context_settings=CONTEXT)
    @click.argument("run")
    @click.option("--force", is_flag=True, help="SIGKILL at once, no grace period.")
    @ssh_options
    @click.pass_context
    def stop_command(ctx: click.Context, run: str, **kw: Any) -> None:
        """Stop RUN on every host (SIGTERM, grace, SIGKILL); a finished run is a no-op."""
        raise Exit(stop_cmd(env_of(ctx), run, kw))

"""``sshddp launch``: plan, preflight, ship, start, follow, and report a run."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Optional

from sshddp import registry
from sshddp.bundle import build_payload, code_spec
from sshddp.checks import Context, evaluate
from sshddp.cluster import Cluster
from sshddp.doctor import gather_sessions, reports_ok
from sshddp.environment import Environment
from sshddp.errors import CheckFailed, UsageError
from sshddp.executor import Executor, RunResult
from sshddp.inventory import Host, Inventory
from sshddp.plan import LaunchOptions, LaunchPlan, describe, make_plan, new_run_id
from sshddp.report import doctor_table
from sshddp.sessions import HostSession
from sshddp.sinks import Console, NodeLogs
from sshddp.transport import SshOptions, node_addr


@dataclass(frozen=True)
class LaunchMode:
    """How to run, beyond what to run."""

    dry_run: bool = False
    check: bool = True
    detach: bool = False
    fanout: int = 32


def build_plan(
    inventory: Inventory, options: LaunchOptions, ssh: SshOptions, secrets: frozenset[str]
) -> LaunchPlan:
    run_id = options.name or new_run_id()
    if registry.exists(run_id):
        raise UsageError(f"--name {run_id}: a run with that id exists already; pick another")
    code = code_spec(options)
    return make_plan(inventory, options, run_id, code, lambda h: node_addr(h, ssh), secrets)


def launch(
    inventory: Inventory,
    options: LaunchOptions,
    ssh: SshOptions,
    mode: LaunchMode,
    env: Environment,
    secrets: frozenset[str] = frozenset(),
) -> RunResult | None:
    """Run it. None for --dry-run and --detach, else the finished run's result."""
    plan = build_plan(inventory, options, ssh, secrets)
    if mode.dry_run:
        env.out(describe(plan))
        return None
    payload = build_payload(plan.code)
    logs = NodeLogs(Path(plan.log_dir).absolute())
    console = Console(env.stdout_bytes, env.color)
    width = max(len(f"[{n.node_rank} {n.host.host}]") for n in plan.nodes)
    for node in plan.nodes:
        logs.open(node.node_rank, node.host.host)
        console.add_node(node.node_rank, node.host.host, width)
    env.err(_banner(plan, mode.detach))
    with Cluster(inventory.hosts, ssh, mode.fanout) as cluster:
        unreachable: dict[int, BaseException] = {}
        if mode.check:
            sessions = _preflight(cluster, plan, options, env, payload.disk_bytes)
        else:
            sessions, unreachable = _open_sessions(cluster, _session_opener(cluster, plan))
        executor = Executor(plan, cluster, logs, console)
        try:
            registry.save(registry.record(plan, inventory.source, ssh.ssh_config))
            if not executor.boot(payload, sessions, unreachable):
                return _finish(executor.result(False))
            if mode.detach:
                env.err(f"sshddp: run {plan.run_id} started on {len(plan.nodes)} node(s); "
                        f"follow it with `sshddp attach {plan.run_id}`")  # fmt: skip
                return None
            with _detach_on(executor):
                return _finish(executor.follow())
        finally:
            for session in sessions.values():  # those no follower took over
                session.close()
            logs.close()


def _finish(result: RunResult) -> RunResult:
    registry_entry = registry.load(result.run_id)
    registry_entry["result"] = {
        "nodes": [{"node_rank": n.node_rank, "state": n.state.value, "returncode": n.returncode,
                   "reason": n.reason} for n in result.nodes],
        "root_cause": result.root_cause,
    }  # fmt: skip
    registry.save(registry_entry)
    return result


def _banner(plan: LaunchPlan, detach: bool) -> str:
    lines = [
        f"sshddp: run {plan.run_id}: {plan.world_size} processes on {len(plan.nodes)} node(s), "
        f"rendezvous {plan.rdzv_addr}:{plan.rdzv_port}, logs in {plan.log_dir}/"
    ]
    if not detach:
        lines.append(
            "sshddp: Ctrl-C stops the run on every host; Ctrl-\\ (SIGQUIT) or closing the "
            f"terminal detaches and leaves it running (`sshddp attach {plan.run_id}`)"
        )
    return "\n".join(lines)


def _preflight(
    cluster: Cluster, plan: LaunchPlan, options: LaunchOptions, env: Environment, code_bytes: int
) -> dict[int, HostSession]:
    """Every host's launch session, opened by the doctor checks that matter for a launch;
    ``CheckFailed`` (nothing started, no session left) when one fails."""
    script = options.script if plan.code.kind == "remote" else None
    ctx = Context(plan.rdzv_addr, plan.rdzv_port, script=script,
                  nproc_override=options.nproc_per_node, code_bytes=code_bytes)  # fmt: skip
    facts, sessions = gather_sessions(cluster, ctx, _session_opener(cluster, plan))
    reports = evaluate(facts, ctx)
    if not reports_ok(reports):
        for session in sessions.values():
            session.close()
        doctor_table(reports, env.rich_err())
        raise CheckFailed(
            "the preflight checks failed (above); nothing was started. Fix them, or pass "
            "--no-check to launch anyway"
        )
    return sessions


def _session_opener(
    cluster: Cluster, plan: LaunchPlan
) -> Callable[[Host, Optional[dict[str, Any]]], HostSession]:
    """Opens a host's launch session; the probe's arguments, or None for no preflight."""
    rundirs = {n.host.index: n.rundir for n in plan.nodes}

    def open_session(host: Host, probe: Optional[dict[str, Any]]) -> HostSession:
        transport = cluster.transports[host.index]
        return HostSession(transport, plan.run_id, rundirs[host.index], probe)

    return open_session


def _open_sessions(
    cluster: Cluster, open_session: Callable[[Host, Optional[dict[str, Any]]], HostSession]
) -> tuple[dict[int, HostSession], dict[int, BaseException]]:
    """``--no-check``: every reachable host's launch session, without the probe."""
    errors: dict[int, BaseException] = {
        i: e for i, e in cluster.connect_all().items() if e is not None
    }
    reachable = [h for h in cluster.hosts if h.index not in errors]
    outcomes = cluster.map(lambda h: open_session(h, None), reachable)
    sessions: dict[int, HostSession] = {}
    for host, outcome in zip(reachable, outcomes):
        if outcome.value is not None:
            sessions[host.index] = outcome.value
        elif outcome.error is not None:
            errors[host.index] = outcome.error
    return sessions, errors


class _detach_on:
    """SIGQUIT (Ctrl-\\) and SIGHUP detach: the run goes on without us."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._old: dict[int, object] = {}

    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        self._executor.detach()

    def __enter__(self) -> None:
        if os.name != "posix":
            return
        for sig in (signal.SIGQUIT, signal.SIGHUP):
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread (in-process tests)
                pass

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]

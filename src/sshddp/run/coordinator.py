"""One run's life on the coordinator, in order: plan, preflight, boot, follow, teardown, record.

``launch`` starts a run; ``attach`` follows one again from any terminal; ``watch`` follows
one without ever stopping it (``logs --follow``). Each reads as its phases inside one
try/finally; the phases are their own modules over one ``RunState``. Nothing here prints
but through the ``Screen`` it is given; the CLI prints the final report.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Optional

from sshddp import defaults
from sshddp.errors import HostUnreachable, UsageError
from sshddp.hosts.pool import HostPool
from sshddp.hosts.session import HostSession
from sshddp.hosts.transport import SshOptions, node_addr
from sshddp.model.checks import Context
from sshddp.model.inventory import Host, Inventory
from sshddp.model.plan import LaunchOptions, LaunchPlan, describe, make_plan, new_run_id
from sshddp.model.state import RunResult
from sshddp.run import preflight, registry
from sshddp.run.boot import Boot
from sshddp.run.follow import Followers
from sshddp.run.payload import build_payload, code_spec
from sshddp.run.registry import RunRecord
from sshddp.run.runstate import RunState
from sshddp.run.sinks import Screen, open_sinks
from sshddp.run.teardown import Teardown


@dataclass(frozen=True)
class LaunchMode:
    """How to run, beyond what to run."""

    dry_run: bool = False
    check: bool = True
    detach: bool = False
    fanout: int = defaults.FANOUT


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
    screen: Screen,
    secrets: frozenset[str] = frozenset(),
) -> Optional[RunResult]:
    """Run it. None for --dry-run and --detach, else the finished run's result."""
    plan = build_plan(inventory, options, ssh, secrets)
    if mode.dry_run:
        screen.out(describe(plan))
        return None
    payload = build_payload(plan.code)
    logs, console = open_sinks(
        plan, Path(plan.log_dir).absolute(), screen.stdout_bytes, screen.color
    )
    screen.err(_banner(plan, mode.detach))
    with HostPool(inventory.hosts, ssh, mode.fanout) as pool:
        state = RunState(plan, pool, logs, console)
        try:
            # preflight: every host's session, opened by the checks (or without them)
            unreachable: dict[int, BaseException] = {}
            if mode.check:
                ctx = Context.for_launch(plan, payload.disk_bytes)
                state.sessions = preflight.for_launch(pool, ctx, _session_opener(pool, plan))
            else:
                state.sessions, unreachable = _open_sessions(pool, plan)
            registry.save(RunRecord.of(plan, inventory.source, ssh.ssh_config))
            # boot: stage everywhere, then start everywhere
            teardown = Teardown(state)
            if not Boot(state, payload, unreachable).run(teardown):
                return _recorded(state.result(False))
            if mode.detach:
                screen.err(
                    f"sshddp: run {plan.run_id} started on {len(plan.nodes)} node(s); "
                    f"follow it with `sshddp attach {plan.run_id}`"
                )
                return None
            # follow, and tear down on the first failure
            with _detach_on(state):
                return _recorded(Followers(state, teardown).run())
        finally:
            state.close_sessions()  # those no follower took over
            logs.close()
            payload.close()


def attach(record: RunRecord, ssh: SshOptions, fanout: int, screen: Screen) -> RunResult:
    """Follow a run again, like launch: Ctrl-C stops it, Ctrl-\\ detaches."""
    plan = record.plan()
    with HostPool([n.host for n in plan.nodes], ssh, fanout) as pool:
        connect_strictly(pool)
        logs, console = open_sinks(plan, Path(record.log_dir), screen.stdout_bytes, screen.color)
        screen.err(
            f"sshddp: attached to run {plan.run_id}; Ctrl-C stops it on every host, "
            "Ctrl-\\ detaches"
        )
        state = RunState(plan, pool, logs, console)
        try:
            with _detach_on(state):
                return _recorded(Followers(state, Teardown(state)).run())
        finally:
            logs.close()


def watch(state: RunState) -> RunResult:
    """Follow the nodes of ``state`` until they end, never stopping them (logs --follow)."""
    return Followers(state, Teardown(state), watch_only=True).run()


def connect_strictly(pool: HostPool) -> None:
    """Connect every host of the pool, or say which could not be reached."""
    bad = [e for e in pool.connect_all().values() if e is not None]
    if bad:
        detail = "; ".join(e.message + (f" (fix: {e.hint})" if e.hint else "") for e in bad)
        raise HostUnreachable(bad[0].host, f"cannot reach every host of the run: {detail}")


def _recorded(result: RunResult) -> RunResult:
    """Keep the run's end in the registry, for ps."""
    registry.save(registry.load(result.run_id).ended(result))
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


def _session_opener(pool: HostPool, plan: LaunchPlan) -> preflight.SessionOpener:
    """Opens a host's launch session with the probe's arguments (None: no preflight)."""
    rundirs = {n.index: n.rundir for n in plan.nodes}

    def open_session(host: Host, probe: Optional[dict[str, Any]]) -> HostSession:
        return HostSession(pool.transport(host), plan.run_id, rundirs[host.index], probe)

    return open_session


def _open_sessions(
    pool: HostPool, plan: LaunchPlan
) -> tuple[dict[int, HostSession], dict[int, BaseException]]:
    """``--no-check``: every reachable host's launch session, without the probe."""
    errors: dict[int, BaseException] = {
        i: e for i, e in pool.connect_all().items() if e is not None
    }
    reachable = [h for h in pool.hosts if h.index not in errors]
    opener = _session_opener(pool, plan)
    outcomes = pool.map(lambda h: opener(h, None), reachable)
    sessions = {i: s for i, s in outcomes.succeeded.items() if s is not None}
    errors.update(outcomes.failed)
    return sessions, errors


@contextmanager
def _detach_on(state: RunState) -> Iterator[None]:
    """SIGQUIT (Ctrl-\\) and SIGHUP detach: the run goes on without us."""

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        state.detached.set()

    old: dict[signal.Signals, Any] = {}
    if os.name == "posix":
        for sig in [signal.SIGQUIT, signal.SIGHUP]:
            try:
                old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread (in-process tests)
                pass
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous)

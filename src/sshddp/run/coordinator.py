"""One run's life on the coordinator, in order: plan, preflight, boot, follow, teardown, record.

``launch`` starts a run; ``attach`` follows one again from any terminal; ``watch`` follows
one without ever stopping it (``logs --follow``). Each reads as its phases inside one
try/finally; the phases are their own modules over one ``RunState``. Nothing here prints
but through the ``Screen`` it is given; the CLI prints the final report.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, Optional

from sshddp import defaults, trace
from sshddp.errors import (
    HostDiskFull,
    HostUnreachable,
    Interrupted,
    RunGone,
    StateError,
    UsageError,
)
from sshddp.hosts import calls
from sshddp.hosts.pool import HostPool, node_addr
from sshddp.hosts.session import HostSession
from sshddp.hosts.transport import SshOptions
from sshddp.model import leftout
from sshddp.model.allocation import refuse_detach
from sshddp.model.checks import Context
from sshddp.model.inventory import Host, Inventory
from sshddp.model.layout import RunLayout
from sshddp.model.plan import (
    LaunchOptions,
    LaunchPlan,
    check_run_id,
    describe,
    make_plan,
    new_run_id,
    with_port,
)
from sshddp.model.ranksel import check_ranks
from sshddp.model.state import NodeResult, NodeState, RunResult, replaced_in
from sshddp.protocol.contract import ExitRecord
from sshddp.run import preflight, registry
from sshddp.run.attempts import AttemptWatch
from sshddp.run.boot import Boot, pack_soon
from sshddp.run.follow import Followers
from sshddp.run.interrupts import Interrupts
from sshddp.run.jobwatch import JobWatch
from sshddp.run.payload import Payload, build_payload, code_spec
from sshddp.run.quarantine import ends as quarantine_ends
from sshddp.run.quarantine import store as quarantine_store
from sshddp.run.registry import Launcher, RunRecord
from sshddp.run.runstate import LaunchState, RunState
from sshddp.run.scriptcheck import script_imports
from sshddp.run.sinks import Screen, open_sinks, seat_spares
from sshddp.run.teardown import Teardown
from sshddp.run.winch import forward_resizes


@dataclass(frozen=True)
class LaunchMode:
    """How to run, beyond what to run."""

    dry_run: bool = False
    check: bool = True
    detach: bool = False
    fanout: int = defaults.FANOUT
    ranks: Optional[frozenset[int]] = None  #: --ranks: the ranks the console shows (all: None)
    ignore_quarantine: bool = False  #: --ignore-quarantine: launch on quarantined hosts too
    #: called once every node started (the Python API's ``start`` returns then)
    on_started: Optional[Callable[[], None]] = None


def build_plan(
    inventory: Inventory, options: LaunchOptions, ssh: SshOptions, secrets: frozenset[str]
) -> LaunchPlan:
    if options.name is not None:
        check_run_id(options.name)  # before the name names any file
    run_id = options.name or new_run_id()
    if registry.exists(run_id):  # early and friendly; ``registry.create`` is the real guard
        raise UsageError(f"--name {run_id}: a run with that id exists already; pick another")
    code = code_spec(replace(options, include=(*inventory.include, *options.include)))
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
    if mode.detach:
        refuse_detach(inventory.hosts)
    with trace.phase("plan"):
        plan = build_plan(inventory, options, ssh, secrets)
    _trace_plan(plan, mode)
    if mode.ranks is not None:  # before anything is reserved or started
        check_ranks(mode.ranks, plan.world_size, plan.run_id)
    if mode.dry_run:
        screen.out(describe(plan))
        return None
    if not mode.ignore_quarantine:  # before any record or host
        quarantine_store.refuse(inventory.hosts)
    if plan.rdzv_port == defaults.AUTO_PORT and not mode.check:
        raise UsageError(
            "--port auto (or `rendezvous: {port: auto}`) needs the preflight: node 0's probe "
            "picks the port; drop --no-check, or give a port with --port N"
        )
    if mode.check:  # before any record or host: code that is not Python starts nothing
        preflight.compile_code(plan.code, options.module is not None)
    payload = build_payload(plan.code)
    return Launch(plan, options, mode, screen).run(inventory, ssh, payload)


class Launch:
    """One launch, from its record on. Until a node may start, Ctrl-C or a failure ends it
    with nothing started anywhere and its record dropped; from then on, Ctrl-C only counts,
    and the run is stopped on every host before the launch returns."""

    def __init__(
        self, plan: LaunchPlan, options: LaunchOptions, mode: LaunchMode, screen: Screen
    ) -> None:
        self.plan = plan
        self.options = options
        self.mode = mode
        self.screen = screen
        self.interrupts = Interrupts()
        self.record: Optional[RunRecord] = None
        self.started = False  #: a node may have started: the record stays, Ctrl-C stops it
        self.boot: Optional[Boot] = None

    def run(self, inventory: Inventory, ssh: SshOptions, payload: Payload) -> Optional[RunResult]:
        try:
            self.interrupts.install()  # raises until a node may start, then only counts
            return self._run(inventory, ssh, payload)
        except KeyboardInterrupt:
            if self.started:
                raise
            raise Interrupted(
                f"run {self.plan.run_id} interrupted before it started: nothing was started on "
                "any host"
            ) from None
        finally:
            if self.record is not None and not self.started:
                _forget(self.plan.run_id)

    def _run(self, inventory: Inventory, ssh: SshOptions, payload: Payload) -> Optional[RunResult]:
        plan = self.plan
        left = leftout.summary(payload.left, payload.more_left)
        if left:
            self.screen.err(left)
        self.record = _reserve(plan, inventory.source, ssh, self.options.quarantine_for)
        where = Path(plan.log_dir).absolute()
        logs, console = open_sinks(plan.layout, where, self.screen, self.mode.ranks, fresh=True)
        try:
            hosts = [n.host for n in plan.nodes]  # the spares staged with it too
            with HostPool(hosts, ssh, self.mode.fanout) as pool:
                state = LaunchState(plan, pool, logs, console)
                state.left_out += payload.left  # the report explains a rank missing one
                try:
                    with trace.phase("preflight"):
                        unreachable = self._preflight(state, inventory, payload)
                    # named once the preflight passed: a run id it drops is never shown; and
                    # Ctrl-\ detaches from the moment the banner says so, boot included
                    with _detach_on(state, plan.end_with_caller):
                        self.screen.err(_banner(state.plan))
                        if not self.mode.detach:
                            self.screen.err(_ctrl_c_line(state.plan))
                        self.interrupts.defer()
                        return self._boot_and_follow(state, payload, unreachable)
                finally:
                    state.close_sessions()  # those no follower took over
        finally:
            if not self.started:  # nothing ran: no empty log files of a dropped run id
                logs.discard_if_empty()
            logs.close()
            payload.close()

    def _preflight(
        self, state: LaunchState, inventory: Inventory, payload: Payload
    ) -> dict[int, BaseException]:
        """Every host's session, opened by the checks (or, with --no-check, without them);
        the hosts that could not be reached. With ``--port auto`` the plan (and the record)
        take the port node 0 picked, and holds until the nodes start."""
        plan, pool = state.plan, state.pool
        if not self.mode.check:
            trace.log.info("preflight: skipped (--no-check); sessions opened without a probe")
            state.sessions, unreachable = _open_sessions(pool, plan)
            return unreachable
        ctx = _checks(plan, payload.disk_bytes, inventory, self.options)
        opener = _session_opener(pool, plan)
        try:
            gathered = preflight.for_launch(pool, ctx, opener, self.screen.err)
        except preflight.PreflightFailed as failed:  # a host not there: quarantined
            failed.quarantined = quarantine_ends.after_preflight(
                failed.reports, self.options.quarantine_for, plan.run_id
            )
            raise
        state.sessions = gathered.sessions
        if plan.rdzv_port == defaults.AUTO_PORT:
            port = _picked(gathered.rdzv_port)
            trace.log.info("preflight: node 0 picked rendezvous port %d (--port auto)", port)
            state.plan = self.plan = with_port(inventory, self.options, plan, port)
            assert self.record is not None
            self.record = replace(self.record, rdzv=(plan.rdzv_addr, port))
        return {}

    def _boot_and_follow(
        self, state: LaunchState, payload: Payload, unreachable: dict[int, BaseException]
    ) -> Optional[RunResult]:
        plan = state.plan
        teardown = Teardown(state)
        boot = self.boot = Boot(state, payload, unreachable, self._may_start, self.screen.err)
        booted = boot.run(teardown)
        if boot.cancelled:
            raise Interrupted(
                f"run {plan.run_id} interrupted before it started: every node removed what it "
                "had staged, nothing was started on any host"
            )
        if not booted and boot.handoff.nospace:
            raise HostDiskFull(boot.handoff.disk_full())
        if not booted:
            return _recorded(state.result(False), self.screen)
        if self.mode.on_started is not None:
            self.mode.on_started()
        if self.mode.detach and not self.interrupts.count:
            trace.log.info("detach: --detach, the run goes on without this sshddp")
            self.screen.err(
                f"sshddp: run {plan.run_id} started on {len(plan.nodes)} node(s); "
                f"follow it with `sshddp attach {plan.run_id}`"
            )
            return None
        # follow, and tear down on the first failure (or the Ctrl-C that came meanwhile, or
        # the end of the Slurm job the run lives in)
        resizes = forward_resizes(state, self.screen.stdout_bytes)
        # the supervisors restart the run on their own (--max-restarts): say when they do
        attempts = AttemptWatch(state) if plan.max_restarts > 0 else nullcontext()
        follow = trace.phase("follow")
        with resizes, attempts, JobWatch(state, teardown) as job, follow:
            result = job.settle(Followers(state, teardown, interrupts=self.interrupts).run())
        return _recorded(result, self.screen)

    def _may_start(self) -> bool:
        """Every node staged: record that the run may start (False: Ctrl-C came first)."""
        if self.interrupts.count:
            return False
        assert self.record is not None
        registry.save(replace(self.record, launcher=None, code_delivery=self._delivery()))
        self.started = True
        return True

    def _delivery(self) -> Optional[dict[str, object]]:
        """How the code reached the hosts (the hand-off's record), or None (no hand-off)."""
        return self.boot.handoff.record() if self.boot else None


def attach(
    record: RunRecord,
    ssh: SshOptions,
    fanout: int,
    screen: Screen,
    ranks: Optional[frozenset[int]] = None,
) -> RunResult:
    """Follow a run again, like launch: Ctrl-C stops it, Ctrl-\\ detaches; the console shows
    the ranks ``ranks`` selects (all: None). A node whose run directory is gone (retention)
    is not followed; when every node's is, the recorded end."""
    layout = record.layout()
    interrupts = Interrupts().deferred()  # any Ctrl-C from here on stops the run
    with HostPool([n.host for n in layout.nodes], ssh, fanout) as pool:
        errors = pool.connect_all()
        unreached = {n.node_rank: errors[n.index] for n in layout.nodes if errors[n.index]}
        found = node_statuses(pool, layout.only(r for r in _ranks(layout) if r not in unreached))
        if trace.on():
            trace.log.info("attach: run %s, node states %s", layout.run_id, _statuses(found))
        gone = {r: s for r, s in found.items() if s and s.get("state") == NodeState.GONE.value}
        gone.update(_replaced(layout, found, unreached))  # lost mid-run: a spare holds it
        if len(gone) == len(layout.nodes):
            return _all_gone(record, gone, screen)
        logs, console = open_sinks(layout, Path(record.log_dir), screen, ranks)
        seat_spares(layout, logs, console, found)  # a spare seated mid-run: as its node
        state = RunState(layout.only(r for r in found if r not in gone), pool, logs, console)
        for rank, status in found.items():  # a detach before a node's first line: not pending
            if rank in state.results and status and status.get("state") == NodeState.RUNNING.value:
                state.results[rank].state = NodeState.RUNNING
        teardown = Teardown(state)
        try:
            follow = trace.phase("follow")
            with _detach_on(state), JobWatch(state, teardown) as job, follow:
                screen.err(_attached_line(layout))  # said once Ctrl-\ does what it says
                result = job.settle(Followers(state, teardown, interrupts=interrupts).run())
        finally:
            logs.close()
    return _recorded(_with_gone(result, record, gone), screen)


def _attached_line(layout: RunLayout) -> str:
    how = "it cannot be detached (transport srun)" if _bound(layout) else "Ctrl-\\ detaches"
    return f"sshddp: attached to run {layout.run_id}; Ctrl-C stops it on every host, " + how


def watch(state: RunState, interrupts: Optional[Interrupts] = None) -> RunResult:
    """Follow the nodes of ``state`` until they end, never stopping them (logs --follow):
    Ctrl-C leaves (``interrupts`` counts it)."""
    interrupts = interrupts or Interrupts().deferred()
    return Followers(state, Teardown(state), watch_only=True, interrupts=interrupts).run()


def node_statuses(pool: HostPool, layout: RunLayout) -> dict[int, Optional[ExitRecord]]:
    """Every node's status by node rank (``gone``: its host holds no run directory for it);
    None for a node that cannot be asked: following it says what went wrong."""
    outcomes = pool.map(
        lambda n: calls.read_node(pool.transport(n), n.rundir, 0, "status"), layout.nodes
    )
    return {n.node_rank: outcomes[n.index].value for n in layout.nodes}


def _ranks(layout: RunLayout) -> list[int]:
    return [n.node_rank for n in layout.nodes]


def _replaced(
    layout: RunLayout,
    found: dict[int, Optional[ExitRecord]],
    unreached: Mapping[int, Any],
) -> dict[int, ExitRecord]:
    """The nodes that cannot be reached because a spare took their rank mid-run (the
    spare's status says so): their record, ``replaced``, for the report; any other node
    out of reach fails the attach, naming every one, as ``connect_strictly``."""
    host = {n.node_rank: n.host.host for n in layout.nodes}
    took = {s.get("node_rank"): host[r] for r, s in found.items() if s and layout.spare(r)}
    left = [e for r, e in unreached.items() if r not in took]
    if left:
        raise _unreachable(left)
    return {
        r: {"state": NodeState.REPLACED.value, "reason": f"lost mid-run; {took[r]} took its place"}
        for r in unreached
    }


def _unreachable(bad: list[Any]) -> HostUnreachable:
    detail = "; ".join(e.message + (f" (fix: {e.hint})" if e.hint else "") for e in bad)
    return HostUnreachable(bad[0].host, f"cannot reach every host of the run: {detail}")


def connect_strictly(pool: HostPool) -> None:
    """Connect every host of the pool, or say which could not be reached."""
    bad = [e for e in pool.connect_all().values() if e is not None]
    if bad:
        raise _unreachable(bad)


def _reserve(
    plan: LaunchPlan, inventory: str, ssh: SshOptions, quarantine_for: Optional[float]
) -> RunRecord:
    """Create the run's record before any host is contacted; of two launches with the same
    name at the same moment, exactly one gets here."""
    record = RunRecord.of(plan, inventory, ssh.ssh_config, Launcher.me())
    record = replace(record, quarantine_for=quarantine_for)
    registry.create(record)
    return record


def _statuses(found: dict[int, Optional[ExitRecord]]) -> str:
    return ", ".join(f"{r}: {(s or {}).get('state', 'unknown')}" for r, s in found.items())


def _forget(run_id: str) -> None:
    """Drop the record of a launch that started nothing (best effort: it is ours)."""
    try:
        registry.forget(run_id)
    except StateError:
        pass


def _recorded(result: RunResult, screen: Screen) -> RunResult:
    """Keep the run's end in the registry, for ps. A registry that cannot take it never
    hides the run's result: it is reported all the same, with a warning."""
    result = replaced_in(result)  # a spare took a lost node's place mid-run
    if trace.on():
        trace.log.info("report: run %s, %s", result.run_id, _node_states(result))
    try:
        registry.record_end(result.run_id, lambda r: r.ended_with(result))
    except StateError as exc:
        screen.err(f"sshddp: warning: the run's end is not recorded: {exc.message}")
    return replace(result, quarantined=tuple(quarantine_ends.after_run(result)))


def _all_gone(record: RunRecord, gone: dict[int, ExitRecord], screen: Screen) -> RunResult:
    """Every node's run directory is gone: the recorded end, or ``RunGone``."""
    if record.end_known:
        screen.err(
            f"sshddp: run {record.run_id}: its run directories are gone from the hosts; "
            "this is its end as recorded here"
        )
        return record.recorded_result()
    try:
        ended = registry.record_end(record.run_id, lambda r: r.ended_from(list(gone.values())))
        for line in quarantine_ends.after_record(ended):
            screen.err(line)
    except StateError:
        pass  # what follows says it all
    raise RunGone(
        f"run {record.run_id}: its run directories are gone from every host (a host keeps its "
        f"newest {defaults.KEEP_RUNS} runs), and this machine never recorded how it ended; "
        f"`sshddp logs {record.run_id}` shows the local copies"
    )


def _with_gone(result: RunResult, record: RunRecord, gone: dict[int, ExitRecord]) -> RunResult:
    """``result`` with the nodes that were not followed: their recorded end, else gone."""
    if not gone:
        return result
    recorded = {e.node_rank: e for e in record.result or ()}
    hosts = {n.node_rank: n.host.host for n in record.nodes}
    nodes = list(result.nodes)
    for rank, status in gone.items():
        node = NodeResult(rank, hosts[rank])
        end = recorded.get(rank)
        node.apply(status if end is None or not NodeState.of(end.state).final else vars(end))
        nodes.append(node)
    return replace(result, nodes=sorted(nodes, key=lambda n: n.node_rank))


def _trace_plan(plan: LaunchPlan, mode: LaunchMode) -> None:
    """What the plan decided, host by host (never the environment: it may hold secrets)."""
    if not trace.on():
        return
    trace.log.info(
        "plan: run %s, %d process(es) on %d node(s), rendezvous %s:%s, %s%s",
        plan.run_id,
        plan.world_size,
        len(plan.nodes),
        plan.rdzv_addr,
        "auto" if plan.rdzv_port == defaults.AUTO_PORT else plan.rdzv_port,
        "preflight checks" if mode.check else "no preflight (--no-check)",
        ", --detach" if mode.detach else "",
    )
    for node in plan.nodes:
        trace.log.info(
            "plan: node %d on %s, run dir %s", node.node_rank, node.host.host, node.rundir
        )


def _node_states(result: RunResult) -> str:
    return "; ".join(
        f"node {n.node_rank} ({n.host}) {n.state.value}" + (f": {n.reason}" if n.reason else "")
        for n in result.nodes
    )


def _banner(plan: LaunchPlan) -> str:
    return (
        f"sshddp: run {plan.run_id}: {plan.world_size} processes on {len(plan.nodes)} node(s), "
        f"rendezvous {plan.rdzv_addr}:{plan.rdzv_port}, logs in {plan.log_dir}/"
    )


def _ctrl_c_line(plan: LaunchPlan) -> str:
    """Said once the preflight passed: before, Ctrl-C ends a launch that started nothing."""
    if _bound(plan.layout):
        return (
            "sshddp: Ctrl-C stops the run on every host; it lives in this sshddp's Slurm job "
            "steps (transport srun), so it cannot be detached"
        )
    if plan.end_with_caller:
        return "sshddp: Ctrl-C stops the run on every host; it ends if this process does"
    return (
        "sshddp: Ctrl-C stops the run on every host; Ctrl-\\ (SIGQUIT) or closing the "
        f"terminal detaches and leaves it running (`sshddp attach {plan.run_id}`)"
    )


def _bound(layout: RunLayout) -> bool:
    """The run lives in job steps this sshddp holds (transport srun)."""
    return any(n.host.transport == "srun" for n in layout.nodes)


def _checks(
    plan: LaunchPlan, code_bytes: int, inventory: Inventory, options: LaunchOptions
) -> Context:
    """What the launch's preflight checks, beyond the plan: --env, the script's imports."""
    return Context.for_launch(
        plan,
        code_bytes,
        cli_env=options.env,
        imports=script_imports(plan.code, options.module is not None),
        inventory=inventory.source,
        rdzv_host_set=inventory.rendezvous.host is not None,
    )


def _picked(port: Optional[int]) -> int:
    if port is None:  # the preflight fails first: the port check names why
        raise UsageError("node 0 picked no rendezvous port")
    return port


def _session_opener(pool: HostPool, plan: LaunchPlan) -> preflight.SessionOpener:
    """Opens a host's launch session with the probe's arguments (None: no preflight)."""
    nodes = {n.index: n for n in plan.nodes}

    def open_session(host: Host, probe: Optional[dict[str, Any]]) -> HostSession:
        node = nodes[host.index]
        session = HostSession(pool.transport(host), plan.run_id, node.rundir, probe)
        pack_soon()  # what the go carries, packed while the probes run
        return session

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
def _detach_on(state: RunState, caller: bool = False) -> Iterator[None]:
    """SIGQUIT (Ctrl-\\) and SIGHUP detach: the run goes on without us. A run over srun
    lives in our job steps: Ctrl-\\ says so, and after SIGHUP we follow it on, quietly. A
    run that ends with its caller (``caller``: the Python API) is never detached."""

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        if caller:
            return
        if not _bound(state.layout):
            state.detached.set()
        elif signum == signal.SIGQUIT:  # printed by a thread: the console has a lock
            text = (
                "sshddp: a run over srun cannot be detached: its processes live in the job "
                "steps this sshddp holds. Ctrl-C stops it; `sshddp logs --follow "
                f"{state.layout.run_id}` follows it from another terminal"
            )
            threading.Thread(target=state.console.message, args=(text,), daemon=True).start()

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

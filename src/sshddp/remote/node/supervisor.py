"""The supervisor: owns one node's torchrun for the whole run, independent of any SSH channel.

Forked off the launch session by ``boot`` and detached (or run as ``python -S supervisor.py
RUNDIR``). It starts torchrun in its own session with one pipe as stdout and stderr (or a
raw pty with spec "tty": ranks then see a terminal), copies what arrives byte for byte to
RUNDIR/node.log (``output.NodeOutput``), records state.json, and on SIGTERM (graceful) or
SIGUSR1 (immediate) stops exactly this node's processes: torchrun's process group plus
every process carrying this node's run marker. Its last act is exit.json. Ranks start
through rank.py, which line-buffers them: one write per line. The supervisors of a run
watch each other (``peers``), authenticated by the run's key, so a run stops everywhere
without any laptop. Everything the node reacts to is an event of one inbox, and one loop
(``Supervisor.run``) hands them to ``node_events.decide``, which moves the node's phase.

torchrun's exit is noticed without reaping it (``waitid`` with ``WNOWAIT``): its zombie keeps
its pid, and so its process group's number, from being reused until the node's processes
are gone, so teardown never signals a stranger's group.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any, Optional

from sshddp.protocol import compose, contract
from sshddp.protocol.contract import Escaped, ExitRecord, Secrets, SpecRecord
from sshddp.protocol.peer_messages import PeerMessage, fail, halted
from sshddp.remote.calls.node_sampler import Sampler, usage
from sshddp.remote.common import (
    Group,
    RunStop,
    atomic_write_json,
    boot_id,
    publish_json,
    python_first,
    read_json,
    start_time,
)
from sshddp.remote.node import spare_health
from sshddp.remote.node.bound import session_gone
from sshddp.remote.node.host_watchdog import Watchdog, nccl_env
from sshddp.remote.node.joined import node_world
from sshddp.remote.node.node_ends import Ending, signame
from sshddp.remote.node.node_events import (
    AWAITING,
    DONE,
    LINGERING,
    SPARE,
    STARTING,
    STOPPING,
    WATCHING,
    Action,
    Begun,
    CheckHealth,
    EndRun,
    Event,
    Exited,
    Farewell,
    Fetch,
    Fetched,
    Finish,
    HealthChecked,
    Hurry,
    LetGo,
    LoopState,
    Message,
    OutputFull,
    Reply,
    Say,
    SessionGone,
    Signal,
    StartNext,
    TakeStacks,
    TearDown,
    Tell,
    TornDown,
    decide,
    initial,
)
from sshddp.remote.node.node_inbox import Inbox
from sshddp.remote.node.output import NodeOutput, node_output
from sshddp.remote.node.peers import Peers, peers_for
from sshddp.remote.node.restart_share import Handover
from sshddp.remote.node.restarts import WAIT_TICK, Restarts, seated_spec, stop_reason
from sshddp.remote.node.standby import Spare

IDLE_WAIT = 1.0  # the loop's longest sleep: output, signals, torchrun's exit and aborts wake it
POLL_WAIT = 0.02  # the loop's sleep where no wakeup pipe could be set up (not the main thread)
LINGER_TICK = 0.05  # the loop's sleep while node 0's server waits for the others' ends


class Supervisor:
    """One node's supervisor: one loop (``run``) over one inbox of events. ``decide``
    (``node_events``) alone applies them and moves the node's phase; the loop carries out
    what it returns and does the phase's I/O: copy the output while watching, advance the
    teardown (``RunStop``) while stopping, wait on the inbox while awaiting node 0's word
    or lingering. The peers' threads, the watchdog's and the signal handlers only post."""

    def __init__(
        self,
        rundir: str,
        parent: Optional[int] = None,
        secrets: Optional[Secrets] = None,
    ) -> None:
        self.rundir = rundir
        self.parent = parent  #: the launch session it is bound to (over srun), if any
        self.spec: SpecRecord = read_json(os.path.join(rundir, contract.SPEC))
        self.seated: SpecRecord = self.spec  #: the spec as the current attempt runs it
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.sampler: Optional[Sampler] = None  #: samples.jsonl, once the node's output is set up
        self.output: Optional[NodeOutput] = None
        self.inbox = Inbox()
        self.state = initial(self.spec)
        self.started = time.time()
        self.watchdog = Watchdog(rundir, self.spec, self.started, self.inbox)
        self.peers: Peers = peers_for(self.spec, peer_key(secrets), self.inbox, self.watchdog.mine)
        self.group: Optional[Group] = None  #: torchrun's process group, once it runs
        self.stop: Optional[Stopping] = None  #: the teardown under way, while stopping
        self.escaped: list[Escaped] = []
        self.restarts = Restarts(rundir, self.spec)
        self.env: dict[str, str] = dict(secrets["env"]) if secrets else {}  #: then torchrun's
        self.spare = spare_for(rundir, self.spec)
        self.handover = Handover(self.spec, self.peers.key)  #: --share files at a restart

    def start(self) -> bool:
        """Set up the node's output and start torchrun; False when it could not be started
        (the loop hears why: ``Begun``)."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, functools.partial(on_signal, self.inbox))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.inbox.open()
        try:
            self.output = node_output(self.rundir, self.spec)
        except OSError as exc:  # a file planted in the run directory, say
            self.inbox.post(Begun(1, f"cannot create the node's log: {exc}"))
            return False
        self.env = node_env(self.rundir, self.spec, self.env)
        self.sampler = Sampler(self.rundir, self.spec)
        self.sampler.start()
        if self.state.phase == SPARE:
            return spare_waits(self.rundir, self.started)
        return self.spawn()

    def spawn(self) -> bool:
        """Start the attempt's torchrun (``Spare``: the standby's, if one waits); False when
        it could not start. The world forms anew, so the watchdog watches from now."""
        assert self.output is not None
        self.seated = seated_spec(self.spec, self.state.seated(), self.state.rank)
        self.restarts.begin(self.output, self.spec, self.state.go, self.seated["node_rank"])
        self.watchdog.restart(self.peers.known)
        self.spare.argv = torchrun_argv(self.rundir, self.seated)
        env = attempt_env({**self.env, **self.output.env}, self.seated, self.state.replaced)
        env[contract.ATTEMPT_VAR] = str(self.restarts.attempt)
        fresh = functools.partial(start_torchrun, self.rundir, self.seated, env, self.output)
        proc, failed = self.spare.run(self.restarts, env, self.output, fresh)
        if proc is not None:
            self.proc = proc
            started = record_state(self.rundir, proc.pid, self.started, self.spare.was_standby)
            self.group = (proc.pid, started) if started is not None else self.group
        self.inbox.post(Begun(self.restarts.attempt, failed))
        return not failed

    def run(self) -> None:
        """The node's life: one loop that decides on what happened, then does its phase's
        I/O, until the node has ended and the others no longer need it."""
        self.start()
        self.peers.start()
        while self.state.phase != DONE:
            seen = loop_sees(self.state, self.proc, self.output)
            self.state, actions = decide(self.state, *seen, *self.inbox.take())
            for action in actions:
                self._act(action)
            self._step()

    def _step(self) -> None:
        """The phase's I/O, until there may be something new to decide on (the launch
        session gone, the peers letting go of this node: posted)."""
        phase = self.state.phase
        if phase == WATCHING and session_gone(self.rundir, self.parent):
            self.inbox.post(SessionGone())
        elif phase == WATCHING and self.output is not None:
            wait = IDLE_WAIT if self.inbox.fd is not None else POLL_WAIT
            if not self.output.pump(wait, self.inbox.fd):
                self.inbox.sleep(POLL_WAIT)
        elif phase == STOPPING and self.stop is not None:
            rc = self.stop.step()
            if rc is not None:
                self.escaped, self.stop = self.stop.escaped, None
                self.inbox.post(TornDown(rc))
        elif phase in (AWAITING, SPARE, STARTING):  # (STARTING: node 0's files come)
            self.inbox.sleep(WAIT_TICK)
        elif phase == LINGERING and self.peers.released():
            self.inbox.post(LetGo())
        elif phase == LINGERING:
            self.inbox.sleep(LINGER_TICK)

    def _act(self, action: Action) -> None:
        if isinstance(action, Tell):
            self.peers.tell_all(self.handover.offered(action.msg))
        elif isinstance(action, EndRun):
            self.peers.broadcast_abort(action.reason)
        elif isinstance(action, TakeStacks):
            args = (action.kind, action.reason, action.action)
            threading.Thread(target=self.watchdog.hang, args=args, daemon=True).start()
        elif isinstance(action, TearDown):
            assert self.proc is not None and self.output is not None
            self.stop = Stopping(self, action.graceful, self.proc, self.output)
        elif isinstance(action, Hurry) and self.stop is not None:
            self.stop.run.hurry()
        elif isinstance(action, (Say, Reply)):
            word = word_for(action, self.restarts) if isinstance(action, Say) else action.msg
            to_node_0(self.state.rank, self.inbox, self.peers, word)
        elif isinstance(action, StartNext):
            self.spawn()
        elif isinstance(action, Finish):
            self._finish(action.end)
        elif isinstance(action, Farewell):
            self.peers.farewell()
        elif isinstance(action, Fetch):
            get = (self.handover, self.state, self.inbox, action.attempt)
            threading.Thread(target=fetch_share, args=get, daemon=True, name="share").start()
        elif isinstance(action, CheckHealth):
            look = (self.inbox, self.spec, self.env, action.attempt)
            threading.Thread(target=look_at_health, args=look, daemon=True).start()

    def _finish(self, end: Ending) -> None:
        """Record the node's end (``asked``: in the asker's words, if any) and tell the others."""
        reason = stop_reason(self.rundir, end.reason) if end.asked else end.reason
        recorded = with_escaped(noted(reason, unwatched(self.peers, end.state)), self.escaped)
        if self.sampler is not None:
            self.sampler.stop()
        self.handover.close()
        self.spare.end()  # (a standby whose supervisor died leaves as its socket closes)
        if self.output is not None:
            self.output.unreserve()
        node, facts = self.seated["node_rank"], exit_facts(self.rundir, self.seated, self.restarts)
        write_exit(
            self.rundir, node, self.started, end.state, end.rc, recorded, self.escaped, facts
        )
        self.peers.report(end.state, end.told or reason)


class Stopping:
    """A teardown of the node's processes (``RunStop``: ``graceful``, SIGTERM and the spec's
    grace first), a step per turn of ``supervisor``'s loop, the node's output flowing
    meanwhile; at its end torchrun is reaped and the output read to its end (``escaped``:
    who kept it open)."""

    def __init__(
        self,
        supervisor: Supervisor,
        graceful: bool,
        proc: subprocess.Popen[bytes],
        output: NodeOutput,
    ) -> None:
        spec = supervisor.spec
        grace = float(spec["grace"]) if graceful else 0.0
        self.run = RunStop(supervisor.group, spec["mark"], grace, runs_torchrun(spec))
        self.proc, self.output, self.wake = proc, output, supervisor.inbox
        self.escaped: list[Escaped] = []

    def step(self) -> Optional[int]:
        """One turn: torchrun's exit code once no process of the node is left."""
        if self.run.step():
            rc = self.proc.wait()
            self.escaped = self.output.drain()
            return rc
        if not self.output.pump(self.run.wait(), self.wake.fd):
            self.wake.sleep(self.run.wait())
        return None


def loop_sees(
    state: LoopState, proc: Optional[subprocess.Popen[bytes]], output: Optional[NodeOutput]
) -> list[Event]:
    """What the loop sees itself, ahead of the inbox's events: torchrun's exit, a full disk."""
    seen: list[Event] = []
    if state.phase == WATCHING and proc is not None and exited(proc):
        seen.append(Exited())
    if output is not None and output.full and state.full is None:
        seen.append(OutputFull(output.full))
    return seen


def attempt_env(
    env: dict[str, str], seated: SpecRecord, replaced: tuple[int, ...]
) -> dict[str, str]:
    """``env`` for an attempt: the node rank it runs as, and the node ranks a spare took
    (SSHDDP_REPLACED: "" when none did)."""
    env[contract.NODE_RANK_VAR] = str(seated["node_rank"])
    env[contract.REPLACED_VAR] = ",".join(str(r) for r in replaced)
    return env


def spare_waits(rundir: str, since: float) -> bool:
    """A spare's state.json: its supervisor alone runs (the launch sees it started; ``ps``
    and ``stop`` find it) until node 0 seats it."""
    record_state(rundir, os.getpid(), since)
    return True


def to_node_0(rank: int, inbox: Inbox, peers: Peers, msg: PeerMessage) -> None:
    """Tell node 0's supervisor ``msg`` (node 0's own word: a post to its own inbox)."""
    if rank == 0:
        inbox.post(Message(0, msg))
    else:
        peers.tell_node_0(msg)


def fetch_share(handover: Handover, state: LoopState, inbox: Inbox, attempt: int) -> None:
    """Node 0's ``--share`` files for ``attempt``, fetched where this node's copies differ
    (a thread: the loop hears a stop meanwhile). It always answers."""
    try:
        failed = handover.refresh(state)
    except Exception as exc:  # a fetch that broke: the attempt fails, saying why
        failed = f"could not get node 0's --share files: {type(exc).__name__}: {exc}"
    inbox.post(Fetched(attempt, failed))


def look_at_health(inbox: Inbox, spec: SpecRecord, env: dict[str, str], attempt: int) -> None:
    """A spare's look at its health, asked by node 0 (a thread: the loop goes on). It
    always answers: node 0 waits for it before the next attempt."""
    try:
        problem = spare_health.problem(spec, env)
    except Exception as exc:  # a look that broke is no healthy answer; node 0 hears why
        problem = f"its look at its health failed: {type(exc).__name__}: {exc}"
    inbox.post(HealthChecked(attempt, problem))


def on_signal(inbox: Inbox, signum: int, frame: Optional[FrameType]) -> None:
    """A signal handler: the loop hears of ``signum``."""
    inbox.post(Signal(signum))


def record_state(rundir: str, pid: int, since: float, standby: bool = False) -> Optional[int]:
    """state.json for torchrun ``pid``; its start time (None: it is gone already)."""
    started = start_time(pid)  # not reaped before teardown: it names torchrun
    record = state_record(pid, started, since, standby)
    atomic_write_json(os.path.join(rundir, contract.STATE), record)
    return started


def word_for(say: Say, restarts: Restarts) -> PeerMessage:
    """What node 0 hears of an attempt that ended: halted, or failed (and what failed,
    from the attempt's output); either way, where the output shows a rank died of a
    hardware error, which (node 0 then replaces the node)."""
    if say.word == "halted":
        return halted(say.attempt, restarts.hardware())
    return fail(say.attempt, restarts.failure(say.reason), restarts.hardware())


def exit_facts(rundir: str, spec: SpecRecord, restarts: Restarts) -> ExitRecord:
    """What exit.json adds to the node's end: its attempts, and the world its processes
    joined (the report warns of a run that succeeded without forming one), and what its
    GPUs did over its kept samples (the report's mean utilisation, peak memory, idle GPUs)."""
    facts = restarts.summary()
    facts["usage"] = usage(rundir)
    world = node_world(rundir, spec)
    if world is not None:
        facts["world"] = world
    return facts


def unwatched(peers: Peers, state: str) -> str:
    """What the record of a node that succeeded must say of its link to node 0's
    supervisor (a node that ended otherwise was stopped, or stopped the others, already:
    its record is not held up for it)."""
    return peers.settle() if state == contract.SUCCEEDED else ""


def noted(reason: str, note: str) -> str:
    """``reason``, and ``note`` after it (what the node's record must also say)."""
    return f"{reason}; {note}" if reason and note else reason or note


def runs_torchrun(spec: SpecRecord) -> bool:
    """torchrun runs the node (its workers are in sessions of their own)."""
    return spec.get("launcher", contract.LAUNCH_TORCHRUN) == contract.LAUNCH_TORCHRUN


def state_record(
    pid: int, started: Optional[int], since: float, standby: bool = False
) -> dict[str, Any]:
    """state.json: this supervisor and torchrun, each named by pid and start time
    (``standby``: that torchrun was a standby, torch imported before the attempt began)."""
    me = os.getpid()
    return {
        "schema": contract.SCHEMA,
        "state": contract.RUNNING,
        "supervisor_pid": me,
        "supervisor_start": start_time(me),
        "pid": pid,
        "pgid": pid,
        "pid_start": started,
        "boot_id": boot_id(),
        "started": since,
        "standby": standby,
    }


def exited(proc: subprocess.Popen[bytes]) -> bool:
    """torchrun has exited. It is not reaped (``WNOWAIT``): as a zombie it keeps its pid,
    and so its process group's number, from being reused until teardown is done."""
    if proc.returncode is not None:
        return True
    try:
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, proc.pid, flags) is not None
    except ChildProcessError:
        return proc.poll() is not None


def peer_key(secrets: Optional[Secrets]) -> Optional[bytes]:
    """The supervisors' shared secret, as bytes; None when there is none or it is not hex."""
    try:
        return bytes.fromhex((secrets["peer_key"] if secrets else None) or "") or None
    except ValueError:
        return None


def with_escaped(reason: str, escaped: list[Escaped]) -> str:
    """``reason``, and what the report says of processes that escaped teardown (logged)."""
    if not escaped:
        return reason
    told = escaped_text(escaped)
    print(f"sshddp supervisor: {told}", file=sys.stderr, flush=True)
    return f"{reason}; {told}" if reason else told


def escaped_text(escaped: list[Escaped]) -> str:
    """What the report says of processes that escaped teardown."""
    named = ", ".join(f"pid {e['pid']} ({e['command']})" for e in escaped[:5])
    more = f" and {len(escaped) - 5} more" if len(escaped) > 5 else ""
    return (
        f"{len(escaped)} process(es) left the run's session and environment and kept its "
        f"output open after it ended: {named}{more}; sshddp stopped reading their output "
        "and did not signal them (it cannot prove they are the run's): end them yourself"
    )


def node_env(rundir: str, spec: SpecRecord, extra: dict[str, str]) -> dict[str, str]:
    """Ours, ``extra`` (the node's planned variables), the run's marks, and the node's site
    directory first on PYTHONPATH."""
    env = dict(os.environ)
    env.update(extra)
    env.update(nccl_env(rundir, env))
    # Every Python process of the node imports RUNDIR/site/sitecustomize.py first.
    site = os.path.join(rundir, contract.SITE)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    env[contract.RUN_ID_VAR] = spec["run_id"]
    env[contract.NODE_RANK_VAR] = str(spec["node_rank"])
    env[contract.MARK_VAR] = spec["mark"]
    if spec.get("launcher") == contract.LAUNCH_COMMAND:
        # A command resolves as in the host python's activated venv (`accelerate`, ...).
        env["PATH"] = python_first(env.get("PATH"))
    return env


def torchrun_argv(rundir: str, spec: SpecRecord) -> list[str]:
    """The node's planned command (torchrun, a node launcher's script, or its command), with
    this interpreter and this run directory's shims."""
    return compose.node_argv(spec, sys.executable, rundir)


def spare_for(rundir: str, spec: SpecRecord) -> Spare:
    """The node's standby holder: the next attempt's torchrun may start ahead where the node
    runs torchrun."""
    return Spare(torchrun_argv(rundir, spec), spec.get("cwd"), runs_torchrun(spec))


def start_torchrun(
    rundir: str, spec: SpecRecord, env: dict[str, str], output: NodeOutput
) -> tuple[Optional[subprocess.Popen[bytes]], str]:
    """torchrun (or the node's launcher) in a session of its own, writing to ``output``;
    else None and why it could not start."""
    argv = torchrun_argv(rundir, spec)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=spec.get("cwd") or None,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output.slave,
            stderr=output.slave,
            start_new_session=True,
        )
    except OSError as exc:
        output.write((f"sshddp: cannot start {argv[0]}: {exc}\n").encode())
        return None, f"cannot start torchrun: {exc}"
    finally:
        output.close_writer()
    return proc, ""


def write_exit(
    rundir: str,
    node_rank: int,
    started: float,
    state: str,
    rc: Optional[int],
    reason: str,
    escaped: Optional[list[Escaped]] = None,
    facts: Optional[ExitRecord] = None,
) -> None:
    """exit.json: how the node ended (the supervisor's last act); ``facts``: which attempt
    it ended in, of how many, and why the earlier ones ended; the world its processes
    joined. One there already is final (``stop`` wrote it while this supervisor was
    frozen): it stays."""
    result: ExitRecord = {
        "schema": contract.SCHEMA,
        "state": state,
        "returncode": rc,
        "reason": reason,
        "started": started,
        "ended": time.time(),
        "node_rank": node_rank,
    }
    if escaped:
        result["escaped"] = escaped
    result.update(facts or {})
    if rc is not None and rc < 0:
        result["signal"] = signame(-rc)
    try:
        final = publish_json(os.path.join(rundir, contract.EXIT), result)
    except OSError:
        return  # a full disk even after the reserve went: the peers still hear the reason
    if not final:  # `sshddp stop` ended the node while this supervisor was frozen
        print(f"sshddp supervisor: exit.json is final already; not {state}", file=sys.stderr)


def run_supervisor(
    rundir: str,
    parent: Optional[int] = None,
    secrets: Optional[Secrets] = None,
) -> None:
    os.umask(0o077)
    Supervisor(rundir, parent, secrets).run()


def main(args: dict[str, Any]) -> None:
    """``python -S supervisor.py RUNDIR`` (see ``sshddp.hosts.shipped.standalone``): the
    node's environment and the peers' key (``Secrets``) come as one JSON line on stdin, as
    a launch session hands them over in memory; without it, the node runs without them."""
    run_supervisor(args["rundir"], secrets=_secrets_from(sys.stdin))


def _secrets_from(stream: Any) -> Optional[Secrets]:
    if stream is None or stream.isatty():
        return None
    try:
        given = json.loads(stream.readline() or "null")
    except ValueError:
        return None
    if not isinstance(given, dict) or not isinstance(given.get("env", {}), dict):
        return None
    return {"env": dict(given.get("env") or {}), "peer_key": given.get("peer_key")}

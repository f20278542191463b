"""The supervisor: owns one node's torchrun for the whole run, independent of any SSH channel.

Forked off the launch session by ``boot`` and detached (or run as ``python -S supervisor.py
RUNDIR``). It starts torchrun in its own session with one pipe as stdout and stderr (or a
raw pty with spec "tty": ranks then see a terminal), copies what arrives byte for byte to
RUNDIR/node.log (``output.NodeOutput``), records state.json, and on SIGTERM (graceful) or
SIGUSR1 (immediate) stops exactly this node's processes: torchrun's process group plus
every process carrying this node's run marker. Its last act is exit.json. Ranks start
through rank.py, which line-buffers them: one write per line. The supervisors of a run
watch each other (``peers``), authenticated by the run's key, so a run stops everywhere
without any laptop.

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
from dataclasses import replace
from types import FrameType
from typing import Any, Optional

from sshddp.protocol import compose, contract
from sshddp.protocol.contract import Escaped, ExitRecord, Secrets, SpecRecord
from sshddp.protocol.peer_messages import fail, halted
from sshddp.remote.calls.node_sampler import Sampler, usage
from sshddp.remote.common import (
    Group,
    atomic_write_json,
    boot_id,
    kill_run,
    publish_json,
    python_first,
    read_json,
    start_time,
)
from sshddp.remote.node.bound import session_gone
from sshddp.remote.node.host_watchdog import Watchdog, nccl_env
from sshddp.remote.node.joined import node_world
from sshddp.remote.node.node_events import (
    EXITED,
    WATCH,
    Begun,
    EndRun,
    Event,
    Exited,
    Message,
    OutputFull,
    SessionGone,
    Signal,
    Tell,
    decide,
    going,
    halting,
    initial,
    outcome,
    stopping,
    word_to_node_0,
)
from sshddp.remote.node.node_inbox import Inbox
from sshddp.remote.node.output import NodeOutput, node_output
from sshddp.remote.node.peers import Peers, peers_for
from sshddp.remote.node.restarts import WAIT_TICK, Restarts, stop_reason
from sshddp.remote.node.standby import Spare, Standby

IDLE_WAIT = 1.0  # the loop's longest sleep: output, signals, torchrun's exit and aborts wake it
POLL_WAIT = 0.02  # the loop's sleep where no wakeup pipe could be set up (not the main thread)
LINGER_TICK = 0.05  # the loop's sleep while node 0's server waits for the others' ends


class Supervisor:
    """One node's supervisor: one loop over one inbox of events (``node_events``), its
    decisions pure; the peers' threads, the watchdog's and the signal handlers only post.
    The loop runs the node's attempts (``_attempts``: watch, stop or handle the exit, wait
    for node 0's word), then stays while node 0's server relays the others' ends."""

    def __init__(
        self,
        rundir: str,
        parent: Optional[int] = None,
        standby: Optional[Standby] = None,
        secrets: Optional[Secrets] = None,
    ) -> None:
        self.rundir = rundir
        self.parent = parent  #: the launch session it is bound to (over srun), if any
        self.spec: SpecRecord = read_json(os.path.join(rundir, contract.SPEC))
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.sampler: Optional[Sampler] = None  #: samples.jsonl, once the node's output is set up
        self.output: Optional[NodeOutput] = None
        self.inbox = Inbox()
        self.state = initial(self.spec)
        self.started = time.time()
        self.watchdog = Watchdog(rundir, self.spec, self.started, self.inbox)
        self.peers: Peers = peers_for(self.spec, peer_key(secrets), self.inbox, self.watchdog.mine)
        self.group: Optional[Group] = None  #: torchrun's process group, once it runs
        self.escaped: list[Escaped] = []
        self.restarts = Restarts(rundir, self.spec)
        self.env: dict[str, str] = dict(secrets["env"]) if secrets else {}  #: then torchrun's
        self.spare = spare_for(rundir, self.spec, standby)

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.inbox.post(Signal(signum))

    def start(self) -> bool:
        """Start torchrun; False (and exit.json written) when it could not be started."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.inbox.open()
        try:
            self.output = node_output(self.rundir, self.spec)
        except OSError as exc:  # a file planted in the run directory, say
            self.finish(contract.FAILED, None, f"cannot create the node's log: {exc}")
            return False
        self.env = node_env(self.rundir, self.spec, self.env)
        self.sampler = Sampler(self.rundir, self.spec)
        self.sampler.start()
        failed = self.spawn()
        if failed:
            self.finish(contract.FAILED, None, failed)
        return not failed

    def spawn(self) -> str:
        """Start the attempt's torchrun (``Spare``: the standby's, if one waits); why not.
        The world forms anew, so the watchdog watches from now."""
        assert self.output is not None
        self.restarts.begin(self.output, self.spec, self.state.go)
        self._apply(Begun(self.restarts.attempt))
        self.watchdog.restart(self.peers.known)
        env = {**self.env, **self.output.env, contract.ATTEMPT_VAR: str(self.restarts.attempt)}
        fresh = functools.partial(start_torchrun, self.rundir, self.spec, env, self.output)
        proc, failed = self.spare.run(self.restarts, env, self.output, fresh)
        if proc is not None:
            self.proc = proc
            self._record_state(proc.pid)
        return failed

    def _record_state(self, pid: int) -> None:
        started = start_time(pid)  # not reaped before teardown: it names torchrun
        self.group = (pid, started) if started is not None else self.group
        record = state_record(pid, started, self.started, self.spare.was_standby)
        atomic_write_json(os.path.join(self.rundir, contract.STATE), record)

    def reap(self) -> None:
        """Called while teardown waits: keep the output flowing (torchrun is reaped after)."""
        self._pump(0)

    def _pump(self, timeout: float) -> bool:
        assert self.output is not None
        return self.output.pump(timeout, self.inbox.fd)

    def _drain(self) -> None:
        """Everything that happened since the last look: what the loop sees itself
        (torchrun's exit, a full disk), then the inbox's events, in order."""
        seen: list[Event] = []
        if self.proc is not None and not self.state.exited and exited(self.proc):
            seen.append(Exited())
        if self.output is not None and self.output.full and self.state.full is None:
            seen.append(OutputFull(self.output.full))
        for event in seen + self.inbox.take():
            self._apply(event)

    def _apply(self, event: Event) -> None:
        if isinstance(event, Message):  # node 0 decides with its view of the others
            self.state = replace(
                self.state, heard=frozenset(self.peers.heard()), ended=frozenset(self.peers.ended())
            )
        self.state, actions = decide(self.state, event)
        for action in actions:
            if isinstance(action, Tell):
                self.peers.tell_all(action.msg)
            elif isinstance(action, EndRun):
                self.peers.broadcast_abort(action.reason)
            else:
                args = (action.kind, action.reason, action.action)
                threading.Thread(target=self.watchdog.hang, args=args, daemon=True).start()

    def _watch(self) -> bool:
        """Copy output until torchrun exits (True) or the node must stop (False)."""
        assert self.proc is not None and self.output is not None
        wait = IDLE_WAIT if self.inbox.fd is not None else POLL_WAIT
        while True:
            self._drain()
            next_step = outcome(self.state)
            if next_step != WATCH:
                return next_step == EXITED
            if session_gone(self.rundir, self.parent):
                self._apply(SessionGone())
                continue
            if not self._pump(wait):
                time.sleep(0.02)

    def run(self) -> None:
        if not self.start():
            self.peers.start()
            self.peers.report(contract.FAILED, "torchrun did not start")
            self._linger()
            return
        self.peers.start()
        ended, reason = self._attempts()  # one without restarts
        assert self.proc is not None
        self.finish(ended, self.proc.returncode, noted(reason, unwatched(self.peers, ended)))
        self.peers.report(ended, reason)
        self._linger()

    def _attempts(self) -> tuple[str, str]:
        """Run the node's attempts (the first one runs) until the node ends; its final
        state and why."""
        while True:
            ended, reason = self._exited() if self._watch() else self._stopped()
            if not self._again(ended, reason):
                break
            failed = self.spawn()
            if failed:
                return contract.FAILED, failed
        self._drain()
        full = self.output is not None and self.output.full
        if halting(self.state) and ended in (contract.STOPPED, contract.FAILED) and not full:
            abort = self.state.abort  # stopped for a restart that never came
            default = "stopped: " + abort if abort else "stopped on request"
            return contract.STOPPED, stop_reason(self.rundir, default)
        return ended, reason

    def _again(self, ended: str, reason: str) -> bool:
        """The attempt ended in state ``ended``: True once every node is to start the next
        one; False when the node ends here (no restarts, none left, or the run is stopping)."""
        self._drain()
        word = word_to_node_0(self.state, ended)
        if word is None:
            return False
        k = self.state.attempt
        said = halted(k) if word == "halted" else fail(k, self.restarts.failure(reason))
        if self.state.rank == 0:
            self._apply(Message(0, said))
        else:
            self.peers.tell_node_0(said)
        while not stopping(self.state):
            if going(self.state):
                return True
            self.inbox.sleep(WAIT_TICK)
            self._drain()
        return False

    def _linger(self) -> None:
        """Stay up as long as the others need this node (node 0's server relays their
        ends), still deciding on what they say; then say goodbye."""
        while not self.peers.released():
            self.inbox.sleep(LINGER_TICK)
            self._drain()
        self.peers.farewell()

    def _hurried(self) -> bool:
        """A SIGUSR1 came since the stop began: the rest of the grace is skipped."""
        self._drain()
        return self.state.stop_signal == signal.SIGUSR1

    def _stopped(self) -> tuple[str, str]:
        """Stop the node's processes (asked to, or aborted by a peer); its final state."""
        assert self.proc is not None and self.output is not None
        grace = 0.0 if self.state.stop_signal == signal.SIGUSR1 else float(self.spec["grace"])
        agent = runs_torchrun(self.spec)
        kill_run(self.group, self.spec["mark"], grace, self.reap, self._hurried, agent=agent)
        self.proc.wait()
        self.escaped = self.output.drain()
        self._drain()
        now = self.state
        abort = now.abort
        ended, reason = (
            contract.STOPPED,
            stop_reason(self.rundir, "stopped: " + abort if abort else "stopped on request"),
        )
        if now.verdict is not None:
            ended, reason = contract.STALLED, now.verdict[1]
        if self.output.full and not abort and now.stop_signal is None:
            ended, reason = contract.FAILED, self.output.full
        return ended, reason

    def _exited(self) -> tuple[str, str]:
        """torchrun is gone: children that escaped into their own session must not outlive
        it. Its final state."""
        assert self.proc is not None and self.output is not None
        kill_run(self.group, self.spec["mark"], 0, self.reap)
        rc = self.proc.wait()
        self.escaped = self.output.drain()
        if self.output.full:  # a node whose output was cut short never passes as complete
            return contract.FAILED, self.output.full
        if rc == 0:
            return contract.SUCCEEDED, ""
        what = "torchrun" if runs_torchrun(self.spec) else "the launcher"
        return contract.FAILED, _describe(rc, what)

    def finish(self, state: str, rc: Optional[int], reason: str) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        self.spare.end()  # (a standby whose supervisor died leaves as its socket closes)
        if self.output is not None:
            self.output.unreserve()
        reason = with_escaped(reason, self.escaped)
        node, facts = self.spec["node_rank"], exit_facts(self.rundir, self.spec, self.restarts)
        write_exit(self.rundir, node, self.started, state, rc, reason, self.escaped, facts)


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


def spare_for(rundir: str, spec: SpecRecord, standby: Optional[Standby]) -> Spare:
    """The node's standby holder: ``standby``, the first attempt's, if any; the next attempt's
    torchrun may start ahead where the node runs torchrun."""
    return Spare(torchrun_argv(rundir, spec), spec.get("cwd"), standby, runs_torchrun(spec))


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
        result["signal"] = _signame(-rc)
    try:
        final = publish_json(os.path.join(rundir, contract.EXIT), result)
    except OSError:
        return  # a full disk even after the reserve went: the peers still hear the reason
    if not final:  # `sshddp stop` ended the node while this supervisor was frozen
        print(f"sshddp supervisor: exit.json is final already; not {state}", file=sys.stderr)


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _describe(rc: int, what: str = "torchrun") -> str:
    if rc < 0:
        return f"{what} was killed by {_signame(-rc)}"
    return f"{what} exited with code {rc}"


def run_supervisor(
    rundir: str,
    parent: Optional[int] = None,
    standby: Optional[Standby] = None,
    secrets: Optional[Secrets] = None,
) -> None:
    os.umask(0o077)
    Supervisor(rundir, parent, standby, secrets).run()


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

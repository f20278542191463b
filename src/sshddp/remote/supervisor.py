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
import time
from types import FrameType
from typing import Any, Optional

from sshddp.remote import agent, contract
from sshddp.remote.bound import session_gone
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
from sshddp.remote.contract import Escaped, ExitRecord, Secrets, SpecRecord
from sshddp.remote.joined import node_world
from sshddp.remote.output import NodeOutput, node_output
from sshddp.remote.peers import Peers, peers_for
from sshddp.remote.restarts import Restarts, stop_reason
from sshddp.remote.standby import Spare, Standby
from sshddp.remote.watchdog import Watchdog, arm, nccl_env

IDLE_WAIT = 1.0  # the loop's longest sleep: output, signals, torchrun's exit and aborts wake it
POLL_WAIT = 0.02  # the loop's sleep where no wakeup pipe could be set up (not the main thread)


class Wakeup:
    """A pipe the loop sleeps on with the output: a signal (SIGCHLD included: torchrun
    exited) or a peer's abort writes a byte to it. An idle node then costs its host one
    wakeup a second, not fifty."""

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        self._write: Optional[int] = None
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        try:
            signal.signal(signal.SIGCHLD, _ignore)
            signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread (in-process tests): the loop polls
            os.close(read)
            os.close(write)
            return
        self.fd = read
        self._write = write

    def poke(self) -> None:
        if self._write is None:
            return
        try:
            os.write(self._write, b"!")
        except OSError:
            pass


class Supervisor:
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
        self.stop_signal: Optional[int] = None
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.output: Optional[NodeOutput] = None
        self.wake: Optional[Wakeup] = None
        self.peers: Peers = peers_for(self.spec, peer_key(secrets))
        self.started = time.time()
        self.group: Optional[Group] = None  #: torchrun's process group, once it runs
        self.escaped: list[Escaped] = []
        self.watchdog = Watchdog(rundir, self.spec, self.started)
        self.restarts = Restarts(rundir, self.spec, self.peers)
        self.env: dict[str, str] = dict(secrets["env"]) if secrets else {}  #: then torchrun's
        self.spare = Spare(torchrun_argv(rundir, self.spec), self.spec.get("cwd"), standby)

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.stop_signal != signal.SIGUSR1:
            self.stop_signal = signum

    def start(self) -> bool:
        """Start torchrun; False (and exit.json written) when it could not be started."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.wake = Wakeup()
        if self.wake.fd is not None:
            self.peers.on_abort = self.wake.poke
        arm(self.watchdog, self.peers, self.wake.poke)
        self.restarts.on_wake = self.wake.poke
        try:
            self.output = node_output(self.rundir, self.spec)
        except OSError as exc:  # a file planted in the run directory, say
            self.finish(contract.FAILED, None, f"cannot create the node's log: {exc}")
            return False
        self.env = node_env(self.rundir, self.spec, self.env)
        failed = self.spawn()
        if failed:
            self.finish(contract.FAILED, None, failed)
        return not failed

    def spawn(self) -> str:
        """Start the attempt's torchrun (``Spare``: the standby's, if one waits); why not."""
        assert self.output is not None
        self.restarts.begin(self.output, self.spec, self.watchdog)
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
        wake = self.wake.fd if self.wake is not None else None
        return self.output.pump(timeout, wake)

    def loop(self) -> bool:
        """Copy output until torchrun exits (True) or the node must stop (False)."""
        assert self.proc is not None and self.output is not None
        wake = self.wake is not None and self.wake.fd is not None
        wait = IDLE_WAIT if wake else POLL_WAIT
        while True:
            if exited(self.proc):
                return True
            if self.stop_signal is not None or self.output.full or self.watchdog.verdict:
                return False
            if self.restarts.halting():
                return False  # node 0 restarts the run: every node stops this attempt
            if self.peers.abort is not None and not self.watchdog.busy.is_set():
                return False  # (while this node's stacks are taken, its ranks stay)
            if session_gone(self.rundir, self.parent):
                self.stop_signal = signal.SIGTERM  # stopped as if signalled
                return False
            if not self._pump(wait):
                time.sleep(0.02)

    def run(self) -> None:
        if not self.start():
            self.peers.start()
            self.peers.report(contract.FAILED, "torchrun did not start")
            self.peers.wait_others()
            return
        self.peers.start()
        state, reason = self.restarts.run(self)  # the attempts: one without restarts
        assert self.proc is not None
        self.finish(state, self.proc.returncode, noted(reason, unwatched(self.peers, state)))
        self.peers.report(state, reason)
        self.peers.wait_others()

    def _stopped(self) -> tuple[str, str]:
        """Stop the node's processes (asked to, or aborted by a peer); its final state."""
        assert self.proc is not None and self.output is not None
        grace = 0.0 if self.stop_signal == signal.SIGUSR1 else float(self.spec["grace"])
        agent = runs_torchrun(self.spec)
        hurry = functools.partial(hurried, self)
        kill_run(self.group, self.spec["mark"], grace, self.reap, hurry, agent=agent)
        self.proc.wait()
        self.escaped = self.output.drain()
        abort = self.peers.abort
        state, reason = (
            contract.STOPPED,
            stop_reason(self.rundir, "stopped: " + abort if abort else "stopped on request"),
        )
        if self.watchdog.verdict is not None:
            state, reason = contract.STALLED, self.watchdog.verdict[1]
        if self.output.full and not abort and self.stop_signal is None:
            state, reason = contract.FAILED, self.output.full
        return state, reason

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
        self.spare.end()  # (a standby whose supervisor died leaves as its socket closes)
        if self.output is not None:
            self.output.unreserve()
        reason = with_escaped(reason, self.escaped)
        node, facts = self.spec["node_rank"], exit_facts(self.rundir, self.spec, self.restarts)
        write_exit(self.rundir, node, self.started, state, rc, reason, self.escaped, facts)


def exit_facts(rundir: str, spec: SpecRecord, restarts: Restarts) -> ExitRecord:
    """What exit.json adds to the node's end: its attempts, and the world its processes
    joined (the report warns of a run that succeeded without forming one)."""
    facts = restarts.summary()
    world = node_world(rundir, spec)
    if world is not None:
        facts["world"] = world
    return facts


def hurried(supervisor: Supervisor) -> bool:
    """A SIGUSR1 came since the stop began: the rest of the grace is skipped."""
    return supervisor.stop_signal == signal.SIGUSR1


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
    """The planned torchrun command, with this interpreter and this run directory's shim.
    A node launcher's script starts the same way, without torchrun; its command as it is."""
    argv = list(spec["argv"])
    launcher = spec.get("launcher", contract.LAUNCH_TORCHRUN)
    if launcher == contract.LAUNCH_COMMAND:
        return argv
    argv[0] = sys.executable  # the host's configured interpreter, resolved by the shell
    if launcher == contract.LAUNCH_NODE:
        argv[1] = os.path.join(rundir, contract.RANK_SHIM)
        return argv
    if argv[1:3] == ["-m", agent.MODULE]:  # torchrun, through the agent shim (agent.py)
        argv[1:3] = [os.path.join(rundir, contract.AGENT_SHIM)]
    if "--no-python" in argv:  # ... then the rank shim, in this run directory
        at = argv.index("--no-python")
        argv[at + 1 : at + 3] = [sys.executable, os.path.join(rundir, contract.RANK_SHIM)]
    return argv


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


def _ignore(signum: int, frame: Optional[FrameType]) -> None:
    pass


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

"""Stop one node's run (idempotent).

args: {"rundir", "force": bool, "reason": str}
Signals the supervisor recorded in state.json (after checking it is that supervisor: pid,
start time and boot), and waits for exit.json. A supervisor that cannot answer (frozen by
SIGSTOP, or not done in time) is killed with its process group. When the supervisor is
gone, stops the node's processes itself: those carrying the node's marker, and torchrun's
process group only while torchrun, named by its pid, start time and boot, still leads it.
A group whose number now belongs to another process is left alone, and the exit record
says so. The record it writes is final: no supervisor that wakes up later replaces it.
Prints one JSON line: the node's exit record plus {"already": bool} (a StopAnswer).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import StopAnswer
from sshddp.remote.common import (
    Group,
    create,
    emit,
    frozen,
    kill_run,
    pgid_of,
    pid_alive,
    publish_json,
    read_json,
    same_process,
    send_signal,
)

SUPERVISOR_EXTRA = 15.0  # seconds beyond the grace a signalled supervisor has to finish


def _is_our_supervisor(state: dict[str, Any]) -> bool:
    """The pid in state.json is still this node's supervisor (not a process that reused it)."""
    return same_process(
        state.get("supervisor_pid"), state.get("supervisor_start"), state.get("boot_id")
    )


def torchrun_group(state: dict[str, Any]) -> tuple[Optional[Group], str]:
    """torchrun's process group, if torchrun (pid, start time, boot) still leads it; else
    None and, when its number now names another live process, what was left alone."""
    pgid, started = state.get("pgid"), state.get("pid_start")
    if not isinstance(pgid, int) or pgid <= 0 or not isinstance(started, int):
        return None, ""  # never recorded: only the marker finds the node's processes
    if same_process(pgid, started, state.get("boot_id")):
        return (pgid, started), ""
    if pid_alive(pgid):
        return None, (
            f"pid {pgid} (torchrun's, and its process group's number) now names another "
            "process: it and its group were left alone"
        )
    return None, ""


def _answer(record: dict[str, Any], already: bool, note: str = "") -> StopAnswer:
    answer: StopAnswer = dict(record)  # type: ignore[assignment]
    answer["already"] = already
    if note:
        answer["note"] = note
    return answer


def main(args: dict[str, Any]) -> None:
    emit(stop(args))


def stop(args: dict[str, Any]) -> StopAnswer:
    rundir = os.path.expanduser(args["rundir"])
    exit_path = os.path.join(rundir, contract.EXIT)
    done = read_json(exit_path)
    if done is not None:
        return _answer(done, True)
    spec = read_json(os.path.join(rundir, contract.SPEC))
    if spec is None:
        return {"state": contract.UNKNOWN, "already": True, "reason": "no such run directory"}
    _note_reason(rundir, args.get("reason") or "stopped on request")
    state = read_json(os.path.join(rundir, contract.STATE)) or {}
    grace = 0.0 if args.get("force") else float(spec["grace"])
    reason = "stopped after its supervisor was lost"
    if _is_our_supervisor(state):
        pid, started = state["supervisor_pid"], state["supervisor_start"]
        done = _signal_supervisor(pid, started, bool(args.get("force")), grace, exit_path)
        if done is not None:
            return _answer(done, False)
        killed = _kill_supervisor(pid, started, grace)
        reason = f"{args.get('reason') or 'stopped on request'}; {killed}" if killed else reason
    # No supervisor (SIGKILLed, host rebooted): do its job, on what is provably the run's.
    group, left_alone = torchrun_group(state)
    agent = spec.get("launcher", contract.LAUNCH_TORCHRUN) == contract.LAUNCH_TORCHRUN
    kill_run(group, spec["mark"], grace, agent=agent)
    result = {
        "schema": contract.SCHEMA,
        "state": contract.STOPPED,
        "returncode": None,
        "node_rank": spec["node_rank"],
        "reason": f"{reason}; {left_alone}" if left_alone else reason,
        "ended": time.time(),
    }
    if not publish_json(exit_path, result):  # the supervisor's own came first: it stands
        result = read_json(exit_path) or result
    return _answer(result, False, left_alone)


def _note_reason(rundir: str, reason: str) -> None:
    """Why the node was asked to stop: the first asker's reason is kept."""
    try:
        with os.fdopen(create(os.path.join(rundir, contract.STOP_REASON)), "w") as fh:
            fh.write(reason)
    except OSError:  # there already: the first asker's stands
        pass


def _signal_supervisor(
    pid: int, started: int, force: bool, grace: float, exit_path: str
) -> Optional[dict[str, Any]]:
    """Ask the supervisor to stop its node; its exit record, or None if it vanished first."""
    if not send_signal(pid, started, signal.SIGUSR1 if force else signal.SIGTERM):
        return None
    deadline = time.time() + grace + SUPERVISOR_EXTRA
    while time.time() < deadline and pid_alive(pid):
        done = read_json(exit_path)
        if done is not None:
            return dict(done)
        if frozen(pid):  # SIGSTOPped: it will not act on the signal, however long we wait
            return None
        time.sleep(0.01)  # within the grace, once a stop: `stop` returns 10 ms after the end
    return read_json(exit_path)


def _kill_supervisor(pid: int, started: int, grace: float) -> str:
    """SIGKILL a supervisor that cannot answer, with its process group (it leads one, of
    its own session), so it never wakes up to act on the node again; what the node's
    record says of it ("" when it was gone already)."""
    if not same_process(pid, started):
        return ""
    why = (
        "frozen (SIGSTOP)"
        if frozen(pid)
        else f"still running {grace + SUPERVISOR_EXTRA:g} s after it was asked to stop"
    )
    if pgid_of(pid) == pid and same_process(pid, started):
        try:
            os.killpg(pid, signal.SIGKILL)  # a live leader keeps its group's number its own
        except OSError:
            pass
    send_signal(pid, started, signal.SIGKILL)
    end = time.time() + SUPERVISOR_EXTRA
    while same_process(pid, started) and time.time() < end:
        time.sleep(0.01)  # bounded by SUPERVISOR_EXTRA, once a stuck supervisor
    return f"its supervisor (pid {pid}) was {why}, and was killed"

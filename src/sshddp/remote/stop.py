"""Stop one node's run (idempotent).

args: {"rundir", "force": bool, "reason": str}
Signals the supervisor recorded in state.json (after checking it is that supervisor), and
waits for exit.json. When the supervisor is gone, kills the node's processes itself.
Prints one JSON line: the node's exit record plus {"already": bool} (a StopAnswer).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Optional

from sshddp.remote import contract
from sshddp.remote.common import atomic_write_json, emit, kill_run, pid_alive, read_json, start_time
from sshddp.remote.contract import StopAnswer

SUPERVISOR_EXTRA = 15.0  # seconds beyond the grace a signalled supervisor has to finish


def _is_our_supervisor(state: dict[str, Any]) -> bool:
    """The pid in state.json is still this node's supervisor (not a process that reused it)."""
    pid = state.get("supervisor_pid")
    if not isinstance(pid, int):
        return False
    return pid_alive(pid) and start_time(pid) == state.get("supervisor_start")


def _answer(record: dict[str, Any], already: bool) -> StopAnswer:
    answer: StopAnswer = dict(record)  # type: ignore[assignment]
    answer["already"] = already
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
    reason_path = os.path.join(rundir, contract.STOP_REASON)
    if not os.path.exists(reason_path):
        with open(reason_path, "w") as fh:
            fh.write(args.get("reason") or "stopped on request")
    state = read_json(os.path.join(rundir, contract.STATE)) or {}
    grace = 0.0 if args.get("force") else float(spec["grace"])
    if _is_our_supervisor(state):
        done = _signal_supervisor(
            state["supervisor_pid"], bool(args.get("force")), grace, exit_path
        )
        if done is not None:
            return _answer(done, False)
    # No supervisor (SIGKILLed, host rebooted): do its job.
    agent = spec.get("launcher", contract.LAUNCH_TORCHRUN) == contract.LAUNCH_TORCHRUN
    kill_run(state.get("pgid"), spec["mark"], grace, agent=agent)
    result = read_json(exit_path)
    if result is None:
        result = {
            "schema": contract.SCHEMA,
            "state": contract.STOPPED,
            "returncode": None,
            "node_rank": spec["node_rank"],
            "reason": "stopped after its supervisor was lost",
            "ended": time.time(),
        }
        atomic_write_json(exit_path, result)
    return _answer(result, False)


def _signal_supervisor(
    pid: int, force: bool, grace: float, exit_path: str
) -> Optional[dict[str, Any]]:
    """Ask the supervisor to stop its node; its exit record, or None if it vanished first."""
    os.kill(pid, signal.SIGUSR1 if force else signal.SIGTERM)
    deadline = time.time() + grace + SUPERVISOR_EXTRA
    while time.time() < deadline and pid_alive(pid):
        done = read_json(exit_path)
        if done is not None:
            return dict(done)
        time.sleep(0.01)
    return None

# stop: stop one node's run (idempotent). ARGS: {"rundir", "force": bool, "reason": str}
# Signals the supervisor recorded in state.json (after checking it is that supervisor), and
# waits for exit.json. When the supervisor is gone, kills the node's processes itself.
# Prints one JSON line: the node's exit.json plus {"already": bool}.


def _is_our_supervisor(state):
    """The pid in state.json is still this node's supervisor (not a process that reused it)."""
    pid = state.get("supervisor_pid")
    return pid_alive(pid) and start_time(pid) == state.get("supervisor_start")


def stop_main(args):
    rundir = os.path.expanduser(args["rundir"])
    exit_path = os.path.join(rundir, "exit.json")
    done = read_json(exit_path)
    if done is not None:
        done["already"] = True
        emit(done)
        return
    spec = read_json(os.path.join(rundir, "spec.json"))
    if spec is None:
        emit({"state": "unknown", "already": True, "reason": "no such run directory"})
        return
    reason_path = os.path.join(rundir, "stop-reason")
    if not os.path.exists(reason_path):
        with open(reason_path, "w") as fh:
            fh.write(args.get("reason") or "stopped on request")
    state = read_json(os.path.join(rundir, "state.json")) or {}
    pid = state.get("supervisor_pid")
    grace = 0 if args.get("force") else float(spec.get("grace", 10))
    if _is_our_supervisor(state):
        os.kill(pid, signal.SIGUSR1 if args.get("force") else signal.SIGTERM)
        deadline = time.time() + grace + 15
        while time.time() < deadline and pid_alive(pid):
            done = read_json(exit_path)
            if done is not None:
                done["already"] = False
                emit(done)
                return
            time.sleep(0.01)
    # No supervisor (SIGKILLed, host rebooted): do its job.
    kill_run(state.get("pgid"), spec["mark"], grace)
    result = read_json(exit_path)
    if result is None:
        result = {
            "state": "stopped",
            "returncode": None,
            "node_rank": spec["node_rank"],
            "reason": "stopped after its supervisor was lost",
            "ended": time.time(),
        }
        atomic_write_json(exit_path, result)
    result["already"] = False
    emit(result)

# follow: stream a node's log from a byte offset until the node has finished.
# ARGS: {"rundir", "offset": int, "mode": "follow" | "fetch" | "status"}
# fetch: send what the log holds now and stop; status: send no log bytes, only the status.
# stdout: the raw bytes of RUNDIR/node.log from offset; stderr at the end: one JSON line with
# the node's exit.json (or {"state": "lost"} when its supervisor vanished without one).
# Exits when the coordinator goes away (stdin closes), so it never lingers.
import select

CHUNK = 1 << 20
POLL_MIN, POLL_MAX = 0.01, 0.1  # seconds between looks at an idle log: short after output


def _coordinator_gone(wait=0.02):
    ready, _, _ = select.select([0], [], [], wait)
    return bool(ready) and not os.read(0, 4096)


def _supervisor_gone(rundir):
    state = read_json(os.path.join(rundir, "state.json"))
    if state is None:
        return False
    return not pid_alive(state.get("supervisor_pid"))


def _open_log(path, offset):
    while True:
        try:
            fh = open(path, "rb")
            fh.seek(offset)
            return fh
        except OSError:
            if _coordinator_gone():
                return None


def node_status(rundir):
    """The node's state as its run directory tells it (exit.json, else liveness)."""
    done = read_json(os.path.join(rundir, "exit.json"))
    if done is not None:
        return done
    state = read_json(os.path.join(rundir, "state.json"))
    if state is None:
        known = os.path.exists(os.path.join(rundir, "spec.json"))
        return {"state": "starting" if known else "unknown"}
    if _supervisor_gone(rundir) and not os.path.exists(os.path.join(rundir, "exit.json")):
        return {
            "state": "lost",
            "reason": "the node's supervisor died",
            "started": state.get("started"),
        }
    return {"state": "running", "started": state.get("started")}


def follow_main(args):
    rundir = os.path.expanduser(args["rundir"])
    exit_path = os.path.join(rundir, "exit.json")
    mode = args.get("mode", "follow")
    if mode == "status" or (
        mode == "fetch" and not os.path.exists(os.path.join(rundir, "node.log"))
    ):
        emit(node_status(rundir), sys.stderr)
        return
    fh = _open_log(os.path.join(rundir, "node.log"), int(args.get("offset", 0)))
    if fh is None:
        return
    out = sys.stdout.buffer
    last_check = 0.0
    wait = POLL_MIN
    while True:
        data = fh.read(CHUNK)
        if data:
            out.write(data)
            out.flush()
            wait = POLL_MIN
            continue
        if mode == "fetch":
            out.flush()
            emit(node_status(rundir), sys.stderr)
            return
        if os.path.exists(exit_path):
            while True:  # exit.json is written after the last byte: drain, then report
                data = fh.read(CHUNK)
                if not data:
                    break
                out.write(data)
            out.flush()
            emit(read_json(exit_path) or {"state": "unknown"}, sys.stderr)
            return
        if time.time() - last_check > 0.5:
            last_check = time.time()
            if _supervisor_gone(rundir) and not os.path.exists(exit_path):
                emit(
                    {
                        "state": "lost",
                        "reason": "the node's supervisor died "
                        "(its host rebooted or its processes were killed)",
                    },
                    sys.stderr,
                )
                return
        if _coordinator_gone(wait):
            return
        wait = min(POLL_MAX, wait * 1.5)  # a quiet node costs its host ~10 wakeups a second

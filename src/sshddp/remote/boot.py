# boot: stage one node's run directory, then fork its supervisor, detached from SSH.
# Used by session.py, which runs stage() and, once every node staged, start().
# ARGS: {"rundir", "spec": {...}, "env": {...}, "payload": {"kind": "file"|"tar"|"none",
#        "name", "size", "sha256"}, "supervisor": source, "remote_script": path|None,
#        "keep_runs": int, "rank": source of rank.py}
# The code stream holds exactly payload.size bytes.
import hashlib
import shutil


class BootError(Exception):
    pass


def _receive_code(rundir, payload, stream):
    data = b""
    while len(data) < payload["size"]:
        chunk = stream.read(payload["size"] - len(data))
        if not chunk:
            raise BootError(
                "the code transfer was cut short (%d of %d bytes)" % (len(data), payload["size"])
            )
        data += chunk
    digest = hashlib.sha256(data).hexdigest()
    if digest != payload["sha256"]:
        raise BootError(
            "SHA-256 mismatch of the shipped code: got %s, expected %s"
            % (digest, payload["sha256"])
        )
    code = os.path.join(rundir, "code")
    os.makedirs(code, 0o700)
    if payload["kind"] == "file":
        with open(os.path.join(code, payload["name"]), "wb") as fh:
            fh.write(data)
    else:
        _unpack(data, code)
    with open(os.path.join(code, ".sha256"), "w") as fh:
        fh.write(digest + "\n")


def _unpack(data, code):
    """Extract a --workdir archive: plain files and directories, all inside ``code``."""
    import io
    import tarfile  # only a --workdir needs it: a launch session skips the import otherwise
    import zlib

    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                parts = member.name.split("/")
                if (
                    member.name.startswith("/")
                    or ".." in parts
                    or not (member.isfile() or member.isdir())
                ):
                    raise BootError("refusing archive member %r" % member.name)
            tar.extractall(code)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise BootError("the shipped archive is damaged: %s" % exc)


def _prune(runs_root, keep):
    """Retention: keep the newest ``keep`` finished run directories under runs_root."""
    try:
        names = os.listdir(runs_root)
    except OSError:
        return
    finished = []
    for name in names:
        path = os.path.join(runs_root, name)
        nodes = [os.path.join(path, n) for n in listdir(path) if n.startswith("n")]
        if nodes and all(os.path.exists(os.path.join(n, "exit.json")) for n in nodes):
            finished.append((os.path.getmtime(path), path))
    finished.sort(reverse=True)
    for _, path in finished[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def _start_supervisor(rundir, source):
    """Fork the node's supervisor off this process, detached from the SSH channel: its own
    session, none of our descriptors. A fork, not a new interpreter: at 8 hosts on 2 cores
    one fresh Python per host took 90 ms of the 0.6 s it took to start torchrun everywhere.
    Its code is also left as RUNDIR/supervisor.py (``python -S supervisor.py RUNDIR``). This
    process carries the run id in its environment, so the supervisor's /proc shows it too."""
    path = os.path.join(rundir, "supervisor.py")
    with open(path, "w") as fh:
        fh.write(source)
    code = compile(source, path, "exec")
    log = os.open(os.path.join(rundir, "supervisor.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        _supervise(rundir, code, log)  # never returns
    os.close(log)
    deadline = time.time() + 20
    while time.time() < deadline:
        state = read_json(os.path.join(rundir, "exit.json")) or read_json(
            os.path.join(rundir, "state.json")
        )
        if state:
            return state
        time.sleep(0.005)
    raise BootError("the supervisor did not start within 20 s; see %s/supervisor.log" % rundir)


def _supervise(rundir, code, log):
    """The forked child: become the supervisor, then exit without running anything of the
    session's again."""
    status = 1
    try:
        os.setsid()
        os.chdir(rundir)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for name in listdir("/proc/self/fd"):  # the channel's pipes, the probe's sockets
            if name.isdigit() and int(name) > 2:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        namespace = {"__name__": "__sshddp_supervisor__"}
        exec(code, namespace)
        namespace["run_supervisor"](rundir)
        status = 0
    except BaseException:  # noqa: BLE001 - it goes to supervisor.log, never to the session
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def stage(args, stream):
    """Put the run directory in place: the code from ``stream`` (its SHA-256 checked), the
    rank shim, env.json and spec.json. Nothing runs yet, and a failed stage leaves nothing.
    The answer: {"ok": true, "rundir"} or {"ok": false, "error", "rundir"}."""
    os.umask(0o077)
    rundir = os.path.expanduser(args["rundir"])
    if os.path.exists(os.path.join(rundir, "spec.json")):
        return {
            "ok": False,
            "rundir": rundir,
            "error": "run directory %s already exists on this host" % rundir,
        }
    try:
        os.makedirs(rundir, 0o700, exist_ok=True)
        spec = args["spec"]
        payload = args["payload"]
        if payload["kind"] != "none":
            _receive_code(rundir, payload, stream)
        remote = args.get("remote_script")
        if remote and not os.path.isfile(home_path(remote)):
            raise BootError("the script %s does not exist on this host" % remote)
        if spec.get("cwd"):
            spec["cwd"] = os.path.expanduser(spec["cwd"])
        with open(os.path.join(rundir, "rank.py"), "w") as fh:
            fh.write(args["rank"])
        atomic_write_json(os.path.join(rundir, "env.json"), args["env"])
        atomic_write_json(os.path.join(rundir, "spec.json"), spec)
        return {"ok": True, "rundir": rundir}
    except (BootError, OSError) as exc:
        discard(rundir)
        return {"ok": False, "error": str(exc), "rundir": rundir}


def discard(rundir):
    """Remove a staged node that will not start (and its run's directory, once empty)."""
    shutil.rmtree(rundir, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(rundir))
    except OSError:
        pass


def start(args):
    """Start the staged node's supervisor. The answer: {"ok": true, "state", "rundir"} or
    {"ok": false, "error", "rundir"}."""
    rundir = os.path.expanduser(args["rundir"])
    try:
        spec = read_json(os.path.join(rundir, "spec.json"))
        if spec is None:
            raise BootError("run directory %s is not staged" % rundir)
        state = _start_supervisor(rundir, args["supervisor"])
        # The retention count includes this run: once it ends the host holds keep_runs.
        _prune(os.path.dirname(os.path.dirname(rundir)), int(args.get("keep_runs", 50)) - 1)
        return {"ok": True, "state": state, "rundir": rundir}
    except (BootError, OSError) as exc:
        return {"ok": False, "error": str(exc), "rundir": rundir}

"""Stage one node's run directory, then fork its supervisor, detached from SSH.

The launch session (``host_session.py``) runs ``stage`` after the go and ``start`` once every node
has staged; ``discard`` removes a node that staged but will not start.

args: {"rundir", "spec": SpecRecord, "env": {...}, "payload": {"kind": "file"|"tar"|"none",
       "name", "size", "sha256"}, "supervisor": text of RUNDIR/supervisor.py,
       "remote_script": path|None, "keep_runs": int, "rank": source of rank.py,
       "agent": source of agent.py (torchrun starts through it, remote/rankside/agent.py),
       "site": source of the ranks' sitecustomize.py (remote/rankside/ranksite.py),
       "wire": source of standby_messages.py (the agent shim reads its go with it),
       "bound": "srun" or "caller": the node ends with this session (see bound.py),
       "workspace": the ranks' cwd when it outlives the run (remote/node/workspace.py), or None,
       "peer_key": the supervisors' shared secret (hex)}
"supervisor", "rank", "agent", "site" and "wire" come inline or, with "packed": N, as the N bytes
after the go line (``unpack_files``): 238 KB of text are 64 KB so, per host and launch.
The code stream holds exactly payload["size"] bytes; it is stored as it arrives.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import zlib
from typing import IO, Any, Dict, Optional

from sshddp.protocol import contract
from sshddp.protocol.contract import Secrets
from sshddp.remote.common import (
    atomic_write_json,
    create,
    home_path,
    listdir,
    read_json,
    try_lock,
    write_new,
)
from sshddp.remote.node.workspace import WorkspaceError, fill, make_link
from sshddp.remote.workdir import Unsafe, make_rundir, moved

Answer = Dict[str, Any]
START_TIMEOUT = 20.0  # seconds the forked supervisor has to write state.json
CHUNK = 1 << 20  # the code is read, hashed and stored in chunks of this size
READ_BYTES = 1 << 16  # tarfile's reads and copies (its stream joins its buffer per read)


class BootError(Exception):
    pass


class _Code:
    """The shipped code as it arrives on stdin: exactly ``size`` bytes, hashed as read."""

    def __init__(self, stream: IO[bytes], size: int) -> None:
        self.stream = stream
        self.left = size
        self.size = size
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        want = self.left if n is None or n < 0 else min(n, self.left)
        if want <= 0:
            return b""
        data = self.stream.read(want)
        if not data:
            raise BootError(
                f"the code transfer was cut short ({self.size - self.left} of {self.size} bytes)"
            )
        self.left -= len(data)
        self.sha.update(data)
        return data

    def finish(self, expected: str) -> str:
        """Read what is left (an archive's padding), then check the whole SHA-256."""
        while self.read(CHUNK):
            pass
        digest = self.sha.hexdigest()
        if digest != expected:
            raise BootError(
                f"SHA-256 mismatch of the shipped code: got {digest}, expected {expected}"
            )
        return digest


def _receive_code(rundir: str, payload: dict[str, Any], stream: IO[bytes]) -> None:
    """Store the code as it streams in, never all of it in memory; nothing of it runs
    before its SHA-256 is checked (a mismatch discards the run directory)."""
    code = os.path.join(rundir, contract.CODE)
    os.mkdir(code, 0o700)
    if payload.get("kept"):  # handed on before the go: the host's kept copy, checked again
        _receive_kept(code, rundir, payload)
        return
    incoming = _Code(stream, int(payload["size"]))
    _store_code(code, rundir, payload, incoming)


def _receive_kept(code: str, rundir: str, payload: dict[str, Any]) -> None:
    from sshddp.remote import hostpath
    from sshddp.remote.node import host_handoff

    path = ""
    try:
        path = host_handoff.kept(payload["kept"], payload["sha256"])
        with hostpath.open_read(path, "the kept payload") as fh:
            _store_code(code, rundir, payload, _Code(fh, int(payload["size"])))
    except BootError:
        if path and os.path.lexists(path):  # never trusted again
            os.unlink(path)
        raise
    except FileNotFoundError:
        raise BootError(f"the kept copy of the code {path} is gone") from None
    except hostpath.Unsafe as exc:
        raise BootError(str(exc)) from None


def _store_code(code: str, rundir: str, payload: dict[str, Any], incoming: _Code) -> None:
    if payload["kind"] == "file":
        with os.fdopen(create(os.path.join(code, payload["name"])), "wb") as fh:
            while True:
                data = incoming.read(CHUNK)
                if not data:
                    break
                fh.write(data)
    else:
        _unpack(incoming, code)
    digest = incoming.finish(payload["sha256"])
    write_new(os.path.join(rundir, contract.CODE_SHA256), (digest + "\n").encode())


def _unpack(incoming: _Code, code: str) -> None:
    """Extract a --workdir archive as it streams in: plain files, directories and symbolic
    links that stay inside ``code`` (a fresh 0700 directory), none written through a link;
    anything else is refused before it is written."""
    import tarfile  # only a --workdir needs it: a launch session skips the import otherwise
    import zlib

    safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    try:
        stream = {"bufsize": READ_BYTES, "copybufsize": READ_BYTES}
        with tarfile.open(fileobj=incoming, mode="r|*", **stream) as tar:  # type: ignore[call-overload]
            for member in tar:
                parts = member.name.split("/")
                if (
                    member.name.startswith("/")
                    or ".." in parts
                    or not (member.isfile() or member.isdir() or member.issym())
                    or os.path.realpath(os.path.join(code, *parts[:-1]))
                    != os.path.join(os.path.realpath(code), *parts[:-1])  # through a link
                ):
                    raise BootError(f"refusing archive member {member.name!r}")
                if member.issym():
                    _link(member.name, member.linkname, code)
                else:
                    tar.extract(member, code, **safe)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise BootError(f"the shipped archive is damaged: {exc}") from exc


def _link(name: str, target: str, code: str) -> None:
    try:
        make_link(target, os.path.join(code, name), code)
    except WorkspaceError as exc:
        raise BootError(f"refusing archive member {name!r}: {exc}") from exc


_STAGING: list[int] = []  #: the staging locks this launch session holds, for its life


def _hold_staging(rundir: str) -> None:
    """Lock RUNDIR/staging.lock for as long as this session lives: its supervisor takes the
    node over, or the session removes what it staged, or it dies and the lock goes with it
    (``_abandoned``)."""
    import fcntl

    fd = create(os.path.join(rundir, contract.STAGING), flags=os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _STAGING.append(fd)


#: seconds: a run directory is made just before staging locks it
ABANDONED_AFTER = 60.0


def _abandoned(node: str, now: float) -> bool:
    """A node directory whose launch session died before its supervisor started: never
    started (no state or exit record), and nobody holds its staging lock."""
    if any(os.path.exists(os.path.join(node, f)) for f in (contract.STATE, contract.EXIT)):
        return False
    try:
        if now - os.path.getmtime(node) < ABANDONED_AFTER:
            return False
        fd = try_lock(os.path.join(node, contract.STAGING), os.O_RDONLY, 0)
    except OSError:  # no lock file: an older sshddp's node, left alone
        return False
    if fd is None:  # its session still stages it
        return False
    os.close(fd)
    return True


def _prune(runs_root: str, keep: int) -> None:
    """Retention: keep the newest ``keep`` finished run directories under runs_root, and
    remove every run directory none of whose nodes ever started (their sessions died)."""
    finished: list[tuple[float, str]] = []
    stale: list[tuple[float, str]] = []
    now = time.time()
    for name in listdir(runs_root):
        path = os.path.join(runs_root, name)
        nodes = [os.path.join(path, n) for n in listdir(path) if n.startswith("n")]
        if nodes and all(_abandoned(n, now) for n in nodes):
            stale.append((0.0, path))
        elif nodes and all(os.path.exists(os.path.join(n, contract.EXIT)) for n in nodes):
            finished.append((os.path.getmtime(path), path))
    finished.sort(reverse=True)
    stale += finished[keep:]
    if stale:
        import shutil  # here: a start that removes nothing is 3 ms of CPU sooner without it

        for _, path in stale:
            shutil.rmtree(path, ignore_errors=True)


def _start_supervisor(
    rundir: str,
    standalone: str,
    secrets: Secrets,
    bound: bool = False,
) -> dict[str, Any]:
    """Fork the node's supervisor off this process, detached from the SSH channel: its own
    session, none of our descriptors. A fork, not a new interpreter: at 8 hosts on 2 cores
    one fresh Python per host took 90 ms of the 0.6 s it took to start torchrun everywhere.
    Its code is also left as RUNDIR/supervisor.py (``python -S supervisor.py RUNDIR``). This
    process carries the run id in its environment, so the supervisor's /proc shows it too."""
    write_new(os.path.join(rundir, contract.SUPERVISOR), standalone.encode())
    log_path = os.path.join(rundir, contract.SUPERVISOR_LOG)
    log = create(log_path)
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid() if bound else None
    if os.fork() == 0:
        supervise(rundir, log, parent, secrets)  # never returns
    os.close(log)
    deadline = time.time() + START_TIMEOUT
    while time.time() < deadline:
        # state.json first: a node whose program started and has ended already is followed
        # like any other (its log and exit.json come with the follow); exit.json alone
        # says the program never started.
        state = read_json(os.path.join(rundir, contract.STATE)) or read_json(
            os.path.join(rundir, contract.EXIT)
        )
        if state:
            return dict(state)
        time.sleep(0.005)  # once a launch, within START_TIMEOUT: the node's start, 5 ms sooner
    raise BootError(f"the supervisor did not start within {START_TIMEOUT:.0f} s; see {log_path}")


def _detach(rundir: str, log: int) -> None:
    """Leave the SSH channel behind: own session, stdin /dev/null, output to the log, and
    every other descriptor (the channel's pipes, the probe's sockets) closed."""
    os.setsid()
    os.chdir(rundir)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for name in listdir("/proc/self/fd"):
        if name.isdigit() and int(name) > 2:
            try:
                os.close(int(name))
            except OSError:
                pass


def supervise(rundir: str, log: int, parent: Optional[int], secrets: Secrets) -> None:
    """The forked child: become the supervisor (bound to ``parent``, the session, over
    srun), then exit without running anything of the session's again."""
    status = 1
    try:
        _detach(rundir, log)
        from sshddp.remote.node.supervisor import run_supervisor

        run_supervisor(rundir, parent, secrets)
        status = 0
    except BaseException:  # it goes to supervisor.log, never to the session
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def unpack_files(args: dict[str, Any], stream: IO[bytes]) -> dict[str, Any]:
    """``args`` with the files that follow the go line on ``stream`` when ``args["packed"]``
    counts them ("supervisor", "rank", "agent", "site", "wire", as zlib-compressed JSON); else as
    they are (the files given inline)."""
    size = args.get("packed")
    if not size:
        return args
    data = stream.read(int(size))
    if len(data) != int(size):
        raise BootError(f"the boot files were cut short: {len(data)} of {size} bytes")
    return {**args, **json.loads(zlib.decompress(data).decode("utf-8"))}


def stage(args: dict[str, Any], stream: IO[bytes]) -> Answer:
    """Put the run directory in place: a new one (an existing one is refused, as are a
    workdir or runs/ that others may write to or move), then the code from ``stream`` (its
    SHA-256 checked), the rank shim and spec.json, every file new and owner-only; no secret
    (``start`` hands those to the supervisor in memory). Nothing runs yet, and a failed stage
    leaves nothing. The answer: {"ok": true, "rundir": its real path, the only one used from
    here on} or {"ok": false, "error", "rundir"}."""
    os.umask(0o077)
    rundir = os.path.expanduser(args["rundir"])
    try:
        real = make_rundir(rundir)
    except Unsafe as exc:  # nothing of ours is there to remove
        return {"ok": False, "rundir": rundir, "error": str(exc)}
    try:
        _hold_staging(real)
        _stage_files(real, _moved(args, rundir, real), stream)
        return {"ok": True, "rundir": real}
    except (BootError, OSError) as exc:
        discard(real)
        return {"ok": False, "error": _said(exc), "rundir": real}


def _moved(args: dict[str, Any], rundir: str, real: str) -> dict[str, Any]:
    """``args`` with the spec's cwd and the workspace under the workdir's real path."""
    spec = dict(args["spec"])
    if spec.get("cwd"):
        spec["cwd"] = moved(spec["cwd"], rundir, real)
    space = args.get("workspace")
    return {**args, "spec": spec, "workspace": moved(space, rundir, real) if space else None}


def _said(exc: BaseException) -> str:
    if isinstance(exc, FileExistsError):
        return f"{exc.filename} was there before sshddp made it (planted?); refusing to follow it"
    return str(exc)


def _stage_files(rundir: str, args: dict[str, Any], stream: IO[bytes]) -> None:
    spec = args["spec"]
    payload = args["payload"]
    if payload["kind"] != "none":
        _receive_code(rundir, payload, stream)
        if args.get("workspace"):  # the ranks run in it: it keeps what earlier runs wrote
            fill(os.path.join(rundir, contract.CODE), args["workspace"])
    remote = args.get("remote_script")
    if remote and not os.path.isfile(home_path(remote)):
        raise BootError(f"the script {remote} does not exist on this host")
    write_new(os.path.join(rundir, contract.RANK_SHIM), args["rank"].encode())
    _put_torchrun_shims(rundir, args)
    atomic_write_json(os.path.join(rundir, contract.SPEC), spec)


def _put_torchrun_shims(rundir: str, args: dict[str, Any]) -> None:
    """What torchrun starts with: the agent shim, the standby wire's module beside it and
    the ranks' sitecustomize (``args["agent"]``, ``args["wire"]``, ``args["site"]``)."""
    write_new(os.path.join(rundir, contract.AGENT_SHIM), args["agent"].encode())
    write_new(os.path.join(rundir, contract.STANDBY_WIRE), args["wire"].encode())
    os.mkdir(os.path.join(rundir, contract.SITE), 0o700)
    write_new(os.path.join(rundir, contract.SITE, "sitecustomize.py"), args["site"].encode())


def discard(rundir: str) -> None:
    """Remove a staged node that will not start (and its run's directory, once empty)."""
    import shutil

    shutil.rmtree(rundir, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(rundir))
    except OSError:
        pass


def start(args: dict[str, Any], rundir: str) -> Answer:
    """Start the supervisor of the node staged in ``rundir`` (stage()'s answer), handing it
    the node's environment and the peers' key in memory. The answer: {"ok": true, "state",
    "rundir"} or {"ok": false, "error", "rundir"}."""
    secrets: Secrets = {"env": dict(args["env"]), "peer_key": args.get("peer_key")}
    try:
        if read_json(os.path.join(rundir, contract.SPEC)) is None:
            raise BootError(f"run directory {rundir} is not staged")
        bound = bool(args.get("bound"))
        state = _start_supervisor(rundir, args["supervisor"], secrets, bound)
        # The retention count includes this run: once it ends the host holds keep_runs.
        _prune(os.path.dirname(os.path.dirname(rundir)), int(args["keep_runs"]) - 1)
        return {"ok": True, "state": state, "rundir": rundir}
    except (BootError, OSError) as exc:
        return {"ok": False, "error": str(exc), "rundir": rundir}

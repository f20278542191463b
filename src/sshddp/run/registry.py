"""The local run registry: what this user's runs were, for ps, attach, logs and stop.

One JSON file per run under ``$SSHDDP_STATE_DIR``, else ``$XDG_STATE_HOME/sshddp``, else
``~/.local/state/sshddp``, owner-only. A ``RunRecord`` holds the hosts, the plan and the
log directory, never an environment value (secrets stay out of it), and, as soon as anyone
learns that the run ended (launch, attach, logs, ps or stop), every node's end.

A launch creates its record before it contacts any host, atomically (written aside, then
hard-linked into place): of two launches with the same name, one creates it and the other
is refused before anything starts. Until its nodes may start, the record names the
launching process (pid and start time, as ``stop`` knows a supervisor): a record whose
launcher is gone never started anything, and is dropped. Every problem with the directory
or a record is a ``StateError`` that names the path.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Optional

from sshddp import defaults
from sshddp.errors import RunNotFound, StateError, UsageError
from sshddp.model.inventory import Host
from sshddp.model.layout import NodeLayout, RunLayout, first_ranks
from sshddp.model.plan import LaunchPlan
from sshddp.model.state import NodeResult, NodeState, RunResult
from sshddp.protocol.contract import ExitRecord

VERSION = 2  #: of the file format; a record without it was written by version 1
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG}
_LOCK = ".lock"


@dataclass(frozen=True)
class NodeRecord:
    """One node of a recorded run: enough to reach it and find its run directory."""

    node_rank: int
    nproc: int
    rundir: str
    host: Host  #: as the inventory gave it, with the env's names only (values are not kept)
    cwd: str = ""  #: the ranks' working directory on the host ("" in older records)


@dataclass(frozen=True)
class NodeEnd:
    """How a node ended, as whoever first learned it saw."""

    node_rank: int
    state: str
    returncode: Optional[int]
    reason: str
    ended: Optional[float] = None  #: when (epoch seconds, the host's clock), if known
    attempt: int = 1  #: the attempt it ended in (``--max-restarts``)
    attempts: int = 1  #: how many attempts the run could make
    earlier: tuple[str, ...] = ()  #: why each earlier attempt ended, oldest first
    seat: Optional[int] = None  #: a spare's: the node rank it took mid-run


@dataclass(frozen=True)
class Launcher:
    """The process launching a run, until the run's nodes may start."""

    pid: int
    start: Optional[int]  #: clock ticks since boot (Linux): with the pid, one process

    @classmethod
    def me(cls) -> Launcher:
        pid = os.getpid()
        return cls(pid, _proc_start(pid))

    def alive(self) -> bool:
        """Whether that very process still runs (not one that reused its pid)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        start = _proc_start(self.pid)
        return self.start is None or start == self.start


@dataclass(frozen=True)
class RunRecord:
    """A run, as this machine recorded it at launch (and at its end)."""

    run_id: str
    created: float  #: when it was launched (epoch seconds)
    inventory: str  #: absolute path of the inventory file
    ssh_config: Optional[str]
    log_dir: str  #: absolute path of the run's local logs
    rdzv: tuple[str, int]
    world_size: int
    grace: float
    heartbeat_timeout: float
    code: str  #: what torchrun ran: a script path or a module
    args: tuple[str, ...]
    nodes: tuple[NodeRecord, ...]
    result: Optional[tuple[NodeEnd, ...]] = None  #: every node's end, once seen
    root_cause: Optional[int] = None  #: node rank of the first failure, once seen
    launcher: Optional[Launcher] = None  #: set while the launch has started nothing yet
    ended: Optional[float] = None  #: when the run ended (its last node), once seen
    cause: Optional[str] = None  #: what ended the run from outside (its Slurm job), once seen
    quarantine_for: Optional[float] = None  #: --quarantine-for, seconds (None: the default)
    judged: bool = False  #: its end's quarantine is decided (only the first to learn decides)
    #: how the code reached the hosts (``model.share.Delivery.record``), once every node has it
    code_delivery: Optional[Mapping[str, Any]] = None

    @classmethod
    def of(
        cls,
        plan: LaunchPlan,
        inventory: str,
        ssh_config: Optional[str],
        launcher: Optional[Launcher] = None,
    ) -> RunRecord:
        """The record of a run about to start."""
        nodes = tuple(NodeRecord(n.node_rank, n.nproc, n.rundir, n.host, n.cwd) for n in plan.nodes)
        return cls(
            run_id=plan.run_id,
            created=time.time(),
            inventory=os.path.abspath(inventory),
            ssh_config=os.path.abspath(ssh_config) if ssh_config else None,
            log_dir=os.path.abspath(plan.log_dir),
            rdzv=(plan.rdzv_addr, plan.rdzv_port),
            world_size=plan.world_size,
            grace=plan.grace,
            heartbeat_timeout=plan.heartbeat_timeout,
            code=plan.code.target,
            args=plan.script_args,
            nodes=nodes,
            launcher=launcher,
        )

    @property
    def launching(self) -> bool:
        """Its launch has not let any node start yet."""
        return self.launcher is not None

    @property
    def finished(self) -> bool:
        """Every node's end is recorded: nobody needs to ask the hosts again."""
        ends = self.result or ()
        return len(ends) == len(self.nodes) and all(NodeState.of(e.state).final for e in ends)

    @property
    def end_known(self) -> bool:
        """Finished, and how: not only "gone" (run directories removed before anyone here
        learned how the run ended)."""
        return self.finished and any(e.state != NodeState.GONE.value for e in self.result or ())

    def ended_with(self, result: RunResult) -> RunRecord:
        """This record with the run's end as ``result`` saw it."""
        ends = tuple(_end_of_result(n) for n in result.nodes)
        return replace(self._with_ends(ends, result.root_cause), cause=result.cause)

    def ended_from(self, states: Sequence[ExitRecord]) -> RunRecord:
        """This record with every node's status as its host reported it (node rank order)."""
        ends = tuple(_end_of(n.node_rank, s) for n, s in zip(self.nodes, states))
        bad = [e for e in ends if NodeState.of(e.state).bad]
        first = min(bad, key=lambda e: (e.ended or float("inf"), e.node_rank), default=None)
        return self._with_ends(ends, None if first is None else first.node_rank)

    def _with_ends(self, ends: tuple[NodeEnd, ...], root_cause: Optional[int]) -> RunRecord:
        times = [e.ended for e in ends if e.ended]
        done = all(NodeState.of(e.state).final for e in ends)
        ended = (max(times) if times else time.time()) if done else None
        return replace(self, result=ends, root_cause=root_cause, launcher=None, ended=ended)

    def recorded_result(self) -> RunResult:
        """The run's end as recorded, for a report when the hosts hold nothing more."""
        hosts = {n.node_rank: n.host.host for n in self.nodes}
        nodes = [
            NodeResult(
                e.node_rank,
                hosts.get(e.node_rank, "?"),
                NodeState.of(e.state),
                e.returncode,
                reason=e.reason,
                ended=e.ended,
                attempt=e.attempt,
                attempts=e.attempts,
                earlier=e.earlier,
                seat=e.seat,
            )
            for e in self.result or ()
        ]
        return RunResult(self.run_id, nodes, self.root_cause, log_dir=Path(self.log_dir))

    def layout(self) -> RunLayout:
        """The run's layout, to follow, fetch and stop it and to name each node's ranks."""
        first = first_ranks((n.node_rank, n.nproc) for n in self.nodes)
        nodes = tuple(
            NodeLayout(n.host, n.node_rank, n.nproc, first[n.node_rank], n.rundir, n.cwd)
            for n in self.nodes
        )
        # a spare's ranks come after the run's world (``plan._spares``)
        spares = frozenset(n.node_rank for n in nodes if n.first_rank >= self.world_size)
        return RunLayout(self.run_id, self.log_dir, nodes, self.grace, spares)


def record_json(record: RunRecord) -> dict[str, Any]:
    """The record as its file holds it."""
    launcher = record.launcher
    return {
        "version": VERSION,
        "run_id": record.run_id,
        "created": record.created,
        "inventory": record.inventory,
        "ssh_config": record.ssh_config,
        "log_dir": record.log_dir,
        "rdzv": list(record.rdzv),
        "world_size": record.world_size,
        "grace": record.grace,
        "heartbeat_timeout": record.heartbeat_timeout,
        "code": record.code,
        "args": list(record.args),
        "nodes": [_node_json(n) for n in record.nodes],
        "result": None if record.result is None else _result_json(record),
        "launcher": None if launcher is None else [launcher.pid, launcher.start],
        "ended": record.ended,
        "quarantine_for": record.quarantine_for,
        "judged": record.judged,
        "code_delivery": None if record.code_delivery is None else dict(record.code_delivery),
    }


def record_of(data: Mapping[str, Any]) -> RunRecord:
    """The record a file holds (KeyError, TypeError, ValueError when it is malformed)."""
    result = data.get("result") or None
    launcher = data.get("launcher")
    return RunRecord(
        run_id=str(data["run_id"]),
        created=float(data.get("created", 0)),
        inventory=data.get("inventory", ""),
        ssh_config=data.get("ssh_config"),
        log_dir=str(data["log_dir"]),
        rdzv=(data["rdzv"][0], int(data["rdzv"][1])),
        world_size=int(data["world_size"]),
        grace=float(data.get("grace", defaults.GRACE)),
        heartbeat_timeout=float(data.get("heartbeat_timeout", defaults.HEARTBEAT_TIMEOUT)),
        code=data["code"],
        args=tuple(data["args"]),
        nodes=tuple(_node_of(n) for n in data["nodes"]),
        result=None if result is None else tuple(_end_from_json(n) for n in result["nodes"]),
        root_cause=None if result is None else result.get("root_cause"),
        cause=None if result is None else result.get("cause"),
        launcher=None if not launcher else Launcher(int(launcher[0]), launcher[1]),
        ended=data.get("ended"),
        quarantine_for=data.get("quarantine_for"),
        judged=bool(data.get("judged", False)),
        code_delivery=data.get("code_delivery"),
    )


def _node_json(node: NodeRecord) -> dict[str, Any]:
    host = {f.name: getattr(node.host, f.name) for f in fields(node.host)}
    host["env"] = sorted(node.host.env)  # names only
    return {
        "node_rank": node.node_rank,
        "nproc": node.nproc,
        "rundir": node.rundir,
        "host": host,
        "cwd": node.cwd,
    }


def _node_of(data: Mapping[str, Any]) -> NodeRecord:
    host = Host(**{**data["host"], "env": {}})  # env values are not kept, nor needed
    rank, nproc, rundir = int(data["node_rank"]), int(data["nproc"]), str(data["rundir"])
    return NodeRecord(rank, nproc, rundir, host, str(data.get("cwd", "")))


def _end_of(node_rank: int, status: ExitRecord) -> NodeEnd:
    """A node's end from the status its host reported (exit.json's fields)."""
    seen = NodeResult(node_rank, "")
    seen.apply({"state": NodeState.UNKNOWN.value, **status})
    return _end_of_result(seen)


def _end_of_result(n: NodeResult) -> NodeEnd:
    """A node's end as a coordinator's result holds it."""
    state = n.state.value
    return NodeEnd(
        n.node_rank,
        state,
        n.returncode,
        n.reason,
        n.ended,
        n.attempt,
        n.attempts,
        n.earlier,
        n.seat,
    )


def _end_json(end: NodeEnd) -> dict[str, Any]:
    data = {
        "node_rank": end.node_rank,
        "state": end.state,
        "returncode": end.returncode,
        "reason": end.reason,
        "ended": end.ended,
    }
    if end.attempts > 1:  # a run with restarts: which attempt, and why the others ended
        data.update(attempt=end.attempt, attempts=end.attempts, earlier=list(end.earlier))
    if end.seat is not None:
        data["seat"] = end.seat
    return data


def _end_from_json(data: Mapping[str, Any]) -> NodeEnd:
    return NodeEnd(**{**data, "earlier": tuple(str(e) for e in data.get("earlier") or ())})


def _result_json(record: RunRecord) -> dict[str, Any]:
    nodes = [_end_json(e) for e in record.result or ()]
    return {"nodes": nodes, "root_cause": record.root_cause, "cause": record.cause}


def _proc_start(pid: int) -> Optional[int]:
    """A live process's start time (clock ticks since boot), from /proc; None elsewhere or
    when it is gone (a zombie is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields_ = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields_[0] in ("Z", "X") else int(fields_[19])


# --- the files --------------------------------------------------------------------------------


def state_dir() -> Path:
    explicit = os.environ.get("SSHDDP_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(xdg) / "sshddp"


def runs_dir() -> Path:
    return state_dir() / "runs"


def _path(run_id: str) -> Path:
    return runs_dir() / f"{run_id}.json"


def state_error(exc: OSError, path: Path, doing: str, what: str = "the run registry") -> StateError:
    """One paragraph: which path, what went wrong, what to do."""
    full = exc.errno in _FULL
    fix = "free space there" if full else "make it a writable directory"
    return StateError(
        f"{what}: cannot {doing} {path} ({exc.strerror or exc}); {fix}, or set "
        "SSHDDP_STATE_DIR to another directory",
        full=full,
    )


def _directory() -> Path:
    """The registry's directory, made owner-only if it is not there yet."""
    directory = runs_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not directory.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    except OSError as exc:
        raise state_error(exc, directory, "create the directory") from exc
    return directory


def made_state_dir() -> Path:
    """The state directory, with the registry's owner-only directory made in it."""
    return _directory().parent


def _write_aside(record: RunRecord) -> Path:
    """The record in a new owner-only file next to its place; the caller moves it there."""
    return write_aside(_directory() / f"{record.run_id}.json", record_json(record), "run record")


def write_aside(path: Path, data: Any, what: str) -> Path:
    """``data`` as JSON in a new owner-only file next to ``path`` (its directory exists);
    the caller moves it there."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
    except OSError as exc:
        _unlink(tmp)
        raise state_error(exc, tmp, f"write the {what}") from exc
    return tmp


def replace_file(tmp: Path, path: Path, what: str) -> None:
    """Move ``tmp`` (``write_aside``'s) over ``path`` at once: a crash leaves the old file or
    the new one, never half of one."""
    try:
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise state_error(exc, path, f"write the {what}") from exc


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def exists(run_id: str) -> bool:
    """Whether a record of that id is there (a directory that cannot be read: as if not;
    ``create`` then says what is wrong with it)."""
    try:
        return _path(run_id).exists()
    except OSError:
        return False


def create(record: RunRecord) -> None:
    """Record a new run, atomically: a ``UsageError`` if a run of that id exists already."""
    tmp = _write_aside(record)
    path = _path(record.run_id)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise UsageError(
            f"--name {record.run_id}: a run with that id exists already (see `sshddp ps "
            "--all`); pick another"
        ) from None
    except OSError as exc:
        raise state_error(exc, path, "write the run record") from exc
    finally:
        _unlink(tmp)


def save(record: RunRecord) -> None:
    """Write atomically, owner-only."""
    replace_file(_write_aside(record), _path(record.run_id), "run record")


def forget(run_id: str) -> None:
    """Remove a run's record (a launch that started nothing)."""
    path = _path(run_id)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise state_error(exc, path, "remove the run record") from exc


@contextmanager
def locked() -> Iterator[None]:
    """Hold the registry's lock: read, change and write one record (or the quarantine
    file) as one step."""
    import fcntl

    path = _directory() / _LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise state_error(exc, path, "open the lock") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def update(run_id: str, change: Callable[[RunRecord], Optional[RunRecord]]) -> Optional[RunRecord]:
    """Replace the run's record by ``change(record)`` (nothing when it returns None), with
    no other update in between; the new record, if any."""
    with locked():
        try:
            record = load(run_id)
        except RunNotFound:
            return None
        new = change(record)
        if new is not None:
            save(new)
        return new


def record_end(run_id: str, change: Callable[[RunRecord], RunRecord]) -> Optional[RunRecord]:
    """Keep a run's end, unless its record already holds one that is final; the record
    with the end it now holds when this call made it final (else None: only the first to
    learn of an end acts on it)."""
    new = update(run_id, lambda r: None if r.finished else change(r))
    return new if new is not None and new.finished else None


def drop_if_abandoned(run_id: str) -> bool:
    """Remove the record of a launch that died before any node could start; True if so."""
    dropped = False

    def drop(record: RunRecord) -> None:
        nonlocal dropped
        if record.launcher is not None and not record.launcher.alive():
            forget(run_id)
            dropped = True

    update(run_id, drop)
    return dropped


def load(run_id: str) -> RunRecord:
    path = _path(run_id)
    try:
        record = record_of(json.loads(_read_record(path)))
        if record.run_id != run_id:
            raise ValueError(f"it names run {record.run_id!r}")
        return record
    except FileNotFoundError:
        raise RunNotFound(f"no run {run_id!r} in {runs_dir()}") from None
    except NotAStateFile as exc:
        raise StateError(f"the run record {path} {exc}; move it away or delete it") from None
    except OSError as exc:
        raise state_error(exc, path, "read the run record") from exc
    # RecursionError: JSON nested deeper than the parser goes
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        raise StateError(
            f"the run record {path} is malformed ({type(exc).__name__}: {exc}); move it "
            "away or delete it"
        ) from None


class NotAStateFile(Exception):
    """What sits at a state file's path cannot be one: said as the end of a sentence."""


def _read_record(path: Path) -> bytes:
    return read_state_file(path, "a run record")


def read_state_file(path: Path, what: str) -> bytes:
    """A state file's bytes (``what``: "a run record"): a regular file of this user's, never
    through a link, never more than ``RUN_RECORD_MAX`` (a FIFO there would hang the read, a
    link to a device never end it)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotAStateFile("is a symbolic link, which sshddp does not follow") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAStateFile("is not a regular file")
        if info.st_uid != os.getuid():
            raise NotAStateFile(f"belongs to another user (uid {info.st_uid})")
        data = _read_up_to(fd, defaults.RUN_RECORD_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > defaults.RUN_RECORD_MAX:
        raise NotAStateFile(f"is larger than {what} may be ({defaults.RUN_RECORD_MAX} bytes)")
    return data


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(limit - size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def run_ids() -> list[str]:
    """Every recorded run id, newest first, from the file names alone (for completion)."""
    try:
        paths = [(p.stat().st_mtime, p.stem) for p in runs_dir().glob("*.json")]
    except OSError:
        return []
    return [stem for _, stem in sorted(paths, reverse=True)]


def all_runs() -> tuple[list[RunRecord], list[str]]:
    """Every readable record, oldest first, and what is wrong with each one that is not:
    one bad record never hides the others."""
    try:
        ids = sorted(p.stem for p in runs_dir().glob("*.json"))
    except OSError as exc:
        raise state_error(exc, runs_dir(), "read the directory") from exc
    records, problems = [], []
    for run_id in ids:
        try:
            records.append(load(run_id))
        except RunNotFound:  # removed meanwhile
            continue
        except StateError as exc:
            problems.append(exc.message)
    return sorted(records, key=lambda r: r.created), problems


def resolve(prefix: str) -> RunRecord:
    """The run whose id is ``prefix`` or starts with it; exactly one, or RunNotFound."""
    directory = runs_dir()
    try:
        ids = [p.stem for p in directory.glob("*.json")] if directory.is_dir() else []
    except OSError as exc:
        raise state_error(exc, directory, "read the directory") from exc
    if prefix in ids:
        return load(prefix)
    matches = sorted(i for i in ids if i.startswith(prefix)) if prefix else []
    if len(matches) == 1:
        return load(matches[0])
    if not matches:
        raise RunNotFound(
            f"no run {prefix!r} in {directory}; `sshddp ps --all` lists the runs this machine knows"
        )
    raise RunNotFound(
        f"run id prefix {prefix!r} is ambiguous: it matches {', '.join(matches[:8])}; type more"
    )

"""What every host-side module shares: state files, the process table, precise teardown.

Files: every file sshddp makes on a host is new (``create``: ``O_EXCL | O_NOFOLLOW``, 0600),
so a file or symlink planted where it goes is refused, never followed or truncated.

Processes: a process is named by its pid *and* its start time (clock ticks since boot, on
this boot), so a pid that was reused never stands for it. Teardown signals only what it can
prove is the run's: a process carrying the node's marker, or a member of torchrun's process
group while torchrun (pid and start time) still leads it, or one already proven so. Where the
Python has pidfds (3.9+, Linux 5.3+) the identity check and the signal cannot race.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, Optional, TextIO, Tuple

from sshddp.protocol.contract import MARK_VAR
from sshddp.remote import hostpath

AGENT_GRACE = 0.2  # seconds torchrun may outlive its ranks at teardown
BOOT_ID = "/proc/sys/kernel/random/boot_id"

#: pid -> start time of processes proven to be a node's
Procs = Dict[int, int]
#: torchrun's process group: (pgid, its leader's start time); the leader is torchrun
Group = Tuple[int, int]


create = hostpath.create  #: a new file, never through what is there (``hostpath.create``)


def try_lock(path: str, flags: int, mode: int) -> Optional[int]:
    """``path`` opened with ``flags`` (never through a symlink) and locked for this process
    alone (``flock``, without waiting), as an open descriptor; None when another process
    holds the lock. OSError when it cannot be opened."""
    import fcntl

    fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def write_new(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to a new file (see ``create``)."""
    fd = create(path, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def atomic_write_json(path: str, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON, whole or not at all: written to a new file of
    an unguessable name (``create``), synced, then renamed over ``path``."""
    tmp = _write_temp(path, obj)
    try:
        hostpath.rename(tmp, path)
    except BaseException:
        unlink(tmp)
        raise


def publish_json(path: str, obj: Any) -> bool:
    """Write ``obj`` as JSON to ``path``, whole, only where there is nothing yet: a final
    record (exit.json) is never replaced, whoever comes later. False when one was there.
    The whole file appears at once: a hard link of a synced temporary, which fails if
    ``path`` exists (a file system without hard links: checked, then renamed)."""
    tmp = _write_temp(path, obj)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        if os.path.lexists(path):
            return False
        hostpath.rename(tmp, path)
        return True
    finally:
        unlink(tmp)


def _write_temp(path: str, obj: Any) -> str:
    """``obj`` as JSON in a new, synced file of an unguessable name beside ``path``."""
    for _ in range(100):
        tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(6).hex()}"
        try:
            fd = create(tmp)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"cannot create a temporary file beside {path}")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        unlink(tmp)
        raise
    return tmp


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def read_json(path: str) -> Any:
    """The file's JSON value, or None when it is missing or not (yet) whole."""
    try:
        with hostpath.open_read(path, "record", binary=False) as fh:
            return json.load(fh)
    except (OSError, ValueError, hostpath.Unsafe):
        return None


def read_json_lines(path: str, last: int = 0) -> list[Any]:
    """The JSON objects of a file of one per line, oldest first (of its last ``last`` bytes
    when given); a line that is not whole (cut by that seek, being written, cut short by a
    full disk) is left out."""
    try:
        with hostpath.open_read(path, "record") as fh:
            if last:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - last))
            lines = fh.read().splitlines()
    except (OSError, hostpath.Unsafe):
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def home_path(path: str) -> str:
    """A path on this host as torchrun will see it: ``~`` expanded, relative to $HOME (the
    run's cwd for a script that lives on the host), whatever this process's cwd is."""
    return os.path.join(os.path.expanduser("~"), os.path.expanduser(path))


def temp_dir() -> str:
    """The temporary directory, as ``tempfile.gettempdir()`` picks it: the first of $TMPDIR,
    $TEMP, $TMP, /tmp, /var/tmp and /usr/tmp that is a directory this user may write in, else
    the working directory. tempfile imports shutil and random, 3 ms of every session's start
    where it looks for its locks."""
    named = [os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP")]
    for folder in [n for n in named if n] + ["/tmp", "/var/tmp", "/usr/tmp"]:
        if os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
            return os.path.abspath(folder)
    return os.getcwd()


def which(name: str) -> Optional[str]:
    """The executable ``name`` on PATH, as ``shutil.which`` finds it: that module, with the
    bz2 and lzma it imports, would add 3 ms of CPU to every session's start."""
    for folder in os.get_exec_path():
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def python_first(path: Optional[str]) -> str:
    """``path`` (a PATH) with this interpreter's directory first, as in its venv activated:
    a command resolves to the venv's (``accelerate``, ``deepspeed``, ``python3``)."""
    return os.pathsep.join([os.path.dirname(sys.executable), path or os.defpath])


def listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def emit(obj: Any, stream: Optional[TextIO] = None) -> None:
    """One JSON line: how host-side code answers the coordinator."""
    out = stream or sys.stdout
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state, pgid, start time) of a process from /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid: int) -> Optional[int]:
    """When the process started (clock ticks since boot): with its pid this names one
    process for good, whatever process later reuses the pid. None when it is gone."""
    st = _stat(pid)
    return st[2] if st else None


def boot_id() -> Optional[str]:
    """This boot's id: start times count from the boot, so they name a process only on it."""
    try:
        with open(BOOT_ID) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def same_process(pid: object, start: object, boot: object = None) -> bool:
    """``pid`` is still the live process that had start time ``start`` (on boot ``boot``,
    when one was recorded): not a process that reused the pid, nor a zombie."""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(start, int):
        return False
    if boot is not None and boot != boot_id():
        return False
    st = _stat(pid)
    return st is not None and st[2] == start and st[0] not in ("Z", "X")


def send_signal(pid: int, start: int, sig: int) -> bool:
    """Signal ``pid`` only if it still is the process that started at ``start``; whether
    it was signalled. With a pidfd the check and the signal cannot race: the pidfd names
    the process that had the pid when it was opened, and the start time read after that
    proves it is the one we mean."""
    opener = getattr(os, "pidfd_open", None)
    sender = getattr(signal, "pidfd_send_signal", None)
    if opener is None or sender is None:
        if start_time(pid) != start:
            return False
        return _kill(pid, sig)
    try:
        fd = opener(pid)
    except OSError:
        return False
    try:
        if start_time(pid) != start:
            return False
        sender(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _kill(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def frozen(pid: object) -> bool:
    """The process is stopped (SIGSTOP, SIGTSTP): it does nothing until a SIGCONT."""
    st = _stat(pid) if isinstance(pid, int) and pid > 0 else None
    return st is not None and st[0] == "T"


def pgid_of(pid: int) -> Optional[int]:
    st = _stat(pid)
    return st[1] if st else None


def _is_zombie(pid: int) -> bool:
    st = _stat(pid)
    return st is None or st[0] in ("Z", "X")


def _has_env(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:
        return False


def run_pids(
    group: Optional[Group],
    mark: str,
    known: Optional[Procs] = None,
    among: Optional[list[int]] = None,
) -> Procs:
    """Live processes of a node's run (pid -> start time): every process whose environment
    carries the node's run marker (children that called setsid too), and the members of
    torchrun's process group ``group`` while torchrun still leads it (its start time
    matches) or that ``known`` already proved the run's. Once torchrun is gone its group
    number may be reused, so a process merely in a group of that number is not the run's.
    Every process of the host is looked at, or only those of ``among``: teardown passes
    none, since a process that left the tree (double-forked) still carries the marker."""
    needle = (f"{MARK_VAR}={mark}").encode()
    leader = group is not None and start_time(group[0]) == group[1]
    known = known or {}
    found: Procs = {}
    me = os.getpid()
    for pid in all_pids() if among is None else among:
        if pid == me:
            continue
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        in_group = group is not None and st[1] == group[0]
        if (in_group and (leader or known.get(pid) == st[2])) or _has_env(pid, needle):
            found[pid] = st[2]
    if leader and group is not None and start_time(group[0]) != group[1]:
        # torchrun went away during the scan: keep only what is proven without it
        found = {p: s for p, s in found.items() if known.get(p) == s or _has_env(p, needle)}
    return found


def all_pids() -> list[int]:
    """Every process of the host (as far as this /proc shows them)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(root: int) -> Optional[list[int]]:
    """Every live descendant of process ``root`` (children, theirs, ...), read from each
    thread's /proc/PID/task/TID/children: as many reads as the tree has threads, where
    ``all_pids`` then reads every process of the host. A process that left the tree (it
    double-forked, or its parent died) is not among them. None where the kernel has no such
    file (Linux before 3.5, or built without CONFIG_PROC_CHILDREN)."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return None
    found: list[int] = []
    seen = {root}
    todo = [root]
    while todo:
        for child in _children(todo.pop()):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid``; none once it is gone."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.extend(int(k) for k in fh.read().split())
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return kids


def pid_alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def signal_all(procs: Procs, sig: int) -> None:
    for pid, start in procs.items():
        send_signal(pid, start, sig)


def kill_run(group: Optional[Group], mark: str, grace: float, agent: bool = True) -> float:
    """SIGTERM every process of the node's run, SIGKILL what is left after ``grace`` s
    (``RunStop``, driven to its end here); the seconds it took."""
    stop = RunStop(group, mark, grace, agent)
    while not stop.step():
        time.sleep(stop.wait())
    return stop.elapsed()


TERM_TICK = 0.02  # seconds between looks at the run's processes while they have their grace
KILL_TICK = 0.01  # seconds between SIGKILLs and the look that follows each
KILL_TRIES = 500  # SIGKILLs sent at most (a process that forks as fast as it is killed)


class RunStop:
    """The stop of one node's run, a step at a time, so that its caller (the supervisor's
    loop) goes on with its own work between steps: SIGTERM every process of the run, wait
    up to ``grace`` s for them to go, then SIGKILL what is left until nothing is.

    ``group`` is torchrun's process group and torchrun's start time (see ``run_pids``).
    ``agent``: the group is torchrun's alone, its workers run in sessions of their own, so
    once they are gone the rest is cut short; a node launcher's workers share its group,
    and it gets the whole grace. ``clock``, ``find`` (the run's live processes, given those
    known), ``send`` and ``group_of`` are the process table's, replaceable in tests.
    """

    def __init__(
        self,
        group: Optional[Group],
        mark: str,
        grace: float,
        agent: bool = True,
        clock: Callable[[], float] = time.time,
        find: Optional[Callable[[Procs], Procs]] = None,
        send: Optional[Callable[[Procs, int], None]] = None,
        group_of: Optional[Callable[[int], Optional[int]]] = None,
    ) -> None:
        self.clock = clock
        self.find = find or (lambda known: run_pids(group, mark, known))
        self.send = send or signal_all
        self.group_of = group_of or pgid_of
        self.pgid = group[0] if group else None
        self.agent = agent
        self.start = clock()
        self.procs = self.find({})
        self.known = dict(self.procs)
        self.deadline = self.start + grace  #: the end of the grace
        self.graced = grace > 0 and bool(self.procs)  #: the processes have their grace
        if self.graced:
            self.send(self.procs, signal.SIGTERM)
        self.due = self.start + (TERM_TICK if self.graced else 0.0)  #: the next step's time
        self.workers_gone: Optional[float] = None
        self.kills = 0
        self.killed = False  #: a SIGKILL went out since the last look
        self.done = False

    def hurry(self) -> None:
        """Skip the rest of the grace: SIGKILL at the next step."""
        if self.graced:
            self.graced = False
            self.due = min(self.due, self.clock())

    def wait(self) -> float:
        """Seconds until the next step has something to do."""
        return 0.0 if self.done else max(0.0, self.due - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.start

    def step(self) -> bool:
        """One step, if one is due; True once no process of the run is left (or the
        SIGKILLs ran out)."""
        if not self.done and self.clock() >= self.due:
            if self.graced:
                self._look_graced()
            if not self.graced:
                self.done = self._kill()
        return self.done

    def _look(self) -> None:
        self.procs = self.find(self.known)
        self.known.update(self.procs)

    def _look_graced(self) -> None:
        """The processes after SIGTERM: once the ranks are gone, torchrun's own cleanup
        (seconds of Python teardown) protects nothing: it gets AGENT_GRACE, then SIGKILL."""
        self._look()
        now = self.clock()
        if self.agent and self.workers_gone is None and not self._workers():
            self.workers_gone = now
        over = self.workers_gone is not None and now - self.workers_gone > AGENT_GRACE
        if not self.procs or now >= self.deadline or over:
            self.graced = False
        else:
            self.due = now + TERM_TICK

    def _workers(self) -> list[int]:
        """The run's processes outside torchrun's group: its ranks (and theirs)."""
        return [p for p in self.procs if self.group_of(p) != self.pgid]

    def _kill(self) -> bool:
        if self.killed:
            self._look()
            self.killed = False
        if not self.procs or self.kills >= KILL_TRIES:
            return True
        self.send(self.procs, signal.SIGKILL)
        self.kills += 1
        self.killed = True
        self.due = self.clock() + KILL_TICK
        return False


def os_error_said(exc: OSError, workdir: str) -> str:
    """What went wrong writing under the workdir, naming the file and, when it is full,
    the disk."""
    where = exc.filename or workdir
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        mount = hostpath.mount_of(where)
        free = size_said(_free_bytes(mount))
        return (
            f"no space left on the disk at {mount} ({free} free) writing {where}: "
            f"free some space there, or point `workdir:` of this host elsewhere"
        )
    return f"cannot write {where}: {exc.strerror or exc}"


def _free_bytes(mount: str) -> int:
    try:
        got = os.statvfs(mount)
    except OSError:
        return 0
    return got.f_bavail * got.f_frsize


def size_said(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"

"""Every thread's stack of every process of a node's run, read without stopping it.

args: {"rundir", "native": bool, "timeout": float}
Prints one JSON line: the node's ``NodeStacks`` record (``contract``). ``collect`` does the
same as a function, for code already on the host (a supervisor's watchdog):
``collect(rundir) -> NodeStacks``.

Which process is which: the node's processes are found as teardown finds them (torchrun's
process group and the node's marker, ``common.run_pids``). torchrun itself is the node's
agent (under a node launcher, the node's one process is its launcher); a process with RANK
in its environment is that rank when torchrun started it, else a worker of that rank (it
inherited RANK: a DataLoader worker, a ``python`` subprocess). A process without RANK that
joined the planned world (joined/p<pid>: an ``mp.spawn`` worker, a Lightning process) is
the rank it joined as. Every Python process of the node registered faulthandler on
SIGRTMIN+6 at start-up (``ranksite``), writing to STACKS/<pid>-<start time>. A process is
signalled only when it catches that signal and holds that very file open, so no process
ever gets a signal whose default action would end it, and each dump is read from where its
file ended before. With ``native``, ``py-spy dump --native`` reads each process instead
where py-spy is installed (``pyspy``); a process it cannot read falls back to the signal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import stat
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional, Tuple

from sshddp.protocol import contract
from sshddp.protocol.contract import FrameRecord, NodeStacks, ProcessStacks, ThreadRecord
from sshddp.remote import hostpath
from sshddp.remote.calls.frames import cwd_of, note, python_frame
from sshddp.remote.common import emit, listdir, pid_alive, read_json, run_pids, start_time
from sshddp.remote.node.host_follow import node_status
from sshddp.remote.node.joined import ranks_by_pid
from sshddp.remote.node.stop import torchrun_group

DUMP_TIMEOUT = 2.0  #: seconds the signalled processes have to write their dumps
SETTLE = 0.05  #: a dump is whole once its file has not grown for this long
POLL = 0.01  #: seconds between looks for the dumps, within DUMP_TIMEOUT, once a `stacks`
MAX_DUMP = 4 << 20  #: bytes read of one dump
MAX_CMDLINE = 300

_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent call first\):$"
)
_STACK = "Stack (most recent call first):"
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')


class Proc(NamedTuple):
    """A process of the node, as /proc shows it."""

    pid: int
    ppid: int
    start: int  #: clock ticks since boot: with the pid, names the process for good
    state: str  #: e.g. "S (sleeping)"
    caught: int  #: the mask of signals it has a handler for (SigCgt)
    rank: Optional[int]
    local_rank: Optional[int]
    cmdline: str
    exe: str  #: the executable's file name, "" when unreadable


Found = Tuple[Proc, ProcessStacks]


def dump_signal() -> int:
    """The signal every Python process of a node dumps its stacks on."""
    return int(signal.SIGRTMIN) + contract.STACKS_SIGNAL_OFFSET


def main(args: dict[str, Any]) -> None:
    native = bool(args.get("native"))
    emit(collect(args["rundir"], native, float(args.get("timeout", DUMP_TIMEOUT))))


def collect(
    rundir: str,
    native: bool = False,
    timeout: float = DUMP_TIMEOUT,
    only: Optional[set[int]] = None,
    unasked: bool = False,
) -> NodeStacks:
    """Every process of the node's run with every thread's stack, or why it has none;
    ``native``: through py-spy where it is installed; ``only``: ask these pids alone
    (the others keep no stacks); ``unasked``: for a sampler no user asked for, through each
    process's stacks thread (``by_request``), never the signal. Takes as long as the
    slowest process takes to dump (milliseconds), at most ``timeout`` (plus py-spy's own
    time)."""
    began = time.time()
    rundir = os.path.expanduser(rundir)
    spec = read_json(os.path.join(rundir, contract.SPEC))
    answer: NodeStacks = {
        "schema": contract.SCHEMA,
        "node_rank": spec["node_rank"] if spec else -1,
        "state": node_status(rundir)["state"],
        "processes": [],
        "py_spy": None,
        "note": "",
        "elapsed": 0.0,
    }
    if spec is not None:
        state = read_json(os.path.join(rundir, contract.STATE)) or {}
        found = processes(spec["mark"], state, joined_ranks(rundir, spec), launcher_of(spec))
        if native:
            _native(answer, found)
        asked = [(p, r) for p, r in found if not r["threads"] and (only is None or p.pid in only)]
        (by_request if unasked else by_signal)(rundir, asked, timeout)
        prune(os.path.join(rundir, contract.STACKS))
        answer["processes"] = [_without_ours(record) for _, record in found]
    answer["elapsed"] = round(time.time() - began, 3)
    return answer


def _without_ours(record: ProcessStacks) -> ProcessStacks:
    """The process's threads less sshddp's own stacks thread (``ranksite._serve``, blocked
    reading its FIFO): it is no part of the program."""
    record["threads"] = [t for t in record["threads"] if not any(_ours(f) for f in t["frames"])]
    return record


def _ours(frame: FrameRecord) -> bool:
    return frame["func"] == "_serve" and frame["file"].endswith(f"{contract.SITE}/sitecustomize.py")


def _native(answer: NodeStacks, found: list[Found]) -> None:
    """Read every Python process through py-spy, where this host has it."""
    from sshddp.remote.calls import pyspy  # subprocess and threads: only --native pays for them

    answer["py_spy"] = pyspy.find() or ""
    answer["note"] = "" if answer["py_spy"] else pyspy.missing()
    if answer["py_spy"]:
        pyspy.dump_all(answer["py_spy"], [r for p, r in found if is_python(p, dump_signal())])


def joined_ranks(rundir: str, spec: dict[str, Any]) -> dict[int, int]:
    """The ranks of the node's processes that have no RANK of their own (``joined``)."""
    nprocs = (spec.get("watch") or {}).get("nprocs")
    return ranks_by_pid(rundir, sum(nprocs) if nprocs else None)


def launcher_of(spec: dict[str, Any]) -> str:
    """What runs the node (spec.json's ``launcher``; torchrun's without one)."""
    return str(spec.get("launcher") or contract.LAUNCH_TORCHRUN)


def processes(
    mark: str,
    state: dict[str, Any],
    ranks: Optional[dict[int, int]] = None,
    launcher: str = contract.LAUNCH_TORCHRUN,
) -> list[Found]:
    """The node's live processes, each with its role and an empty stack record. A process
    without RANK that joined the planned world is the rank it joined as (``ranks``: a node
    launcher's worker); the node's process (state.json's pid) is its torchrun agent, or
    under a node launcher the LAUNCHER, or a rank where it joined the world itself
    (Lightning's first process trains)."""
    ranks = ranks or {}
    procs = {}
    group, _ = torchrun_group(state)  # None once torchrun no longer leads its group
    for pid in run_pids(group, mark):
        proc = describe(pid)
        if proc is not None and proc.rank is None and pid in ranks:
            proc = proc._replace(rank=ranks[pid])
        if proc is not None:
            procs[pid] = proc
    agent = state.get("pid")
    if agent in procs and procs[agent].rank is not None:
        agent = None
    found = []
    for pid in sorted(procs):
        proc = procs[pid]
        record = blank(proc, _launcher_role(role(proc, procs, agent), launcher))
        found.append((proc, record))
    return found


def _launcher_role(found: str, launcher: str) -> str:
    """The node's process is torchrun's agent only where torchrun runs the node."""
    if found == contract.AGENT and launcher != contract.LAUNCH_TORCHRUN:
        return contract.LAUNCHER
    return found


def role(proc: Proc, procs: dict[int, Proc], agent: Optional[int]) -> str:
    """RANK, WORKER, AGENT or OTHER: a rank is torchrun's child; a process that inherited
    a rank's RANK is that rank's worker."""
    if proc.pid == agent:
        return contract.AGENT
    if proc.rank is None:
        return contract.OTHER
    if agent in procs:
        return contract.RANK if proc.ppid == agent else contract.WORKER
    parent = procs.get(proc.ppid)  # no torchrun (its supervisor was lost): by ancestry
    return contract.WORKER if parent is not None and parent.rank == proc.rank else contract.RANK


def describe(pid: int) -> Optional[Proc]:
    """What /proc says of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            status = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        with open(f"/proc/{pid}/environ", "rb") as fb:
            env = _env(fb.read())
        with open(f"/proc/{pid}/cmdline", "rb") as fb:
            cmdline = fb.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        ppid, caught = int(status["PPid"]), int(status["SigCgt"], 16)
    except (OSError, KeyError, ValueError):
        return None
    start = start_time(pid)
    if start is None:
        return None
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = ""
    return Proc(
        pid=pid,
        ppid=ppid,
        start=start,
        state=status.get("State", "").strip(),
        caught=caught,
        rank=_int(env.get(b"RANK")),
        local_rank=_int(env.get(b"LOCAL_RANK")),
        cmdline=cmdline[:MAX_CMDLINE],
        exe=exe,
    )


def _env(data: bytes) -> dict[bytes, bytes]:
    pairs = (item.partition(b"=") for item in data.split(b"\0"))
    return {name: value for name, sep, value in pairs if sep and name in (b"RANK", b"LOCAL_RANK")}


def _int(value: Optional[bytes]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def dump_path(rundir: str, proc: Proc) -> str:
    return os.path.join(rundir, contract.STACKS, f"{proc.pid}-{proc.start}")


def catches(proc: Proc, signum: int) -> bool:
    return bool((proc.caught >> (signum - 1)) & 1)


def is_python(proc: Proc, signum: int) -> bool:
    """A Python interpreter, or a process with sshddp's dump handler (Python embedded)."""
    return proc.exe.startswith(("python", "pypy")) or catches(proc, signum)


def refusal(proc: Proc, path: str, signum: int) -> str:
    """Why a process must not get the dump signal; "" when it may."""
    if not catches(proc, signum):
        if not is_python(proc, signum):
            return f"not a Python process ({proc.exe or 'unknown executable'})"
        return (
            "a Python process without sshddp's dump handler (it started without the "
            "node's sitecustomize: python -S or -I, or a cleared PYTHONPATH)"
        )
    if not holds(proc.pid, path):
        return "its handler of the dump signal is not sshddp's (it does not hold its dump file)"
    return ""


def holds(pid: int, path: str) -> bool:
    """Whether the process has ``path`` open (its faulthandler writes there)."""
    fd_dir = f"/proc/{pid}/fd"
    for name in listdir(fd_dir):
        try:
            if os.readlink(os.path.join(fd_dir, name)) == path:
                return True
        except OSError:
            continue
    return False


def by_signal(rundir: str, todo: list[Found], timeout: float) -> None:
    """Signal each process that has sshddp's dump handler, then read what each wrote. One
    collection at a time per node (two terminals at once): each reads exactly one dump."""
    signum = dump_signal()

    def ask(proc: Proc, path: str) -> str:
        why = refusal(proc, path, signum)
        if why:
            return why
        try:
            os.kill(proc.pid, signum)
        except OSError:
            return "it exited before it could dump its stacks"
        return ""

    _gather(rundir, todo, timeout, ask)


def by_request(rundir: str, todo: list[Found], timeout: float) -> None:
    """Ask each process's stacks thread (``ranksite``: a process that called
    init_process_group answers on <dump file>.ask) for its stacks, then read what each wrote.
    No signal: what the samplers that run unasked use, every second for as long as the run
    lasts, since faulthandler's signal handler can crash CPython 3.11 mid-import. A process
    with no such thread is not asked."""
    _gather(rundir, todo, timeout, _request)


def _request(proc: Proc, path: str) -> str:
    try:  # no reader (the process is gone): ENXIO at once, never a wait
        fd = os.open(path + contract.STACKS_ASK_SUFFIX, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return "it has no stacks thread (it has not called init_process_group)"
    try:
        info = os.fstat(fd)
        if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.geteuid():
            return "its stacks FIFO is not the one its process made"
        os.write(fd, b"?")
    except OSError:  # full: asked already, and not yet answered
        return "it has not answered the last request for its stacks"
    finally:
        os.close(fd)
    return ""


def _gather(
    rundir: str, todo: list[Found], timeout: float, ask: Callable[[Proc, str], str]
) -> None:
    files: dict[int, tuple[str, int]] = {}
    with _one_at_a_time(os.path.join(rundir, contract.STACKS)):
        for proc, record in todo:
            path = dump_path(rundir, proc)
            offset = _size(path)
            why = ask(proc, path)
            if why:
                record["error"] = _with(record["error"], why)
                continue
            files[proc.pid] = (path, offset)
        wait_written(files, timeout)
        for proc, record in todo:
            if proc.pid in files:
                _read_dump(record, *files[proc.pid], proc, timeout)
                _empty(files[proc.pid][0])


def blank(proc: Proc, role_name: str) -> ProcessStacks:
    """The record of process ``proc`` in role ``role_name``, before its stacks are read."""
    return {
        "pid": proc.pid,
        "ppid": proc.ppid,
        "role": role_name,
        "rank": proc.rank,
        "local_rank": proc.local_rank,
        "cmdline": proc.cmdline,
        "source": "",
        "threads": [],
        "raw": "",
        "error": "",
    }


def _empty(path: str) -> None:
    """A dump read is dropped: a rank sampled every second (``node_sampler``) keeps a small
    file. Its process appends to it, so its next dump starts at the new end."""
    hostpath.truncate(path)


@contextlib.contextmanager
def _one_at_a_time(directory: str) -> Iterator[None]:
    """An exclusive lock on DIRECTORY/.lock (none when it cannot be made: no dumps there)."""
    try:
        fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_dump(record: ProcessStacks, path: str, offset: int, proc: Proc, timeout: float) -> None:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            raw = fh.read(MAX_DUMP).decode("utf-8", "replace")
    except OSError:
        raw = ""
    record["raw"] = raw
    record["threads"] = parse_faulthandler(raw, cwd_of(proc.pid))
    if record["threads"]:
        record["source"] = "faulthandler"
    else:
        now = describe(proc.pid)
        state = f"its state: {now.state}" if now else "it has exited"
        record["error"] = _with(record["error"], f"no dump within {timeout:.1f} s ({state})")


def _with(first: str, then: str) -> str:
    return f"{first}; {then}" if first else then


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def wait_written(files: dict[int, tuple[str, int]], timeout: float) -> None:
    """Wait until every process's dump is whole, or its process is gone, or ``timeout``.

    faulthandler writes a dump in one go but with no end mark. It writes the main thread
    last (the oldest), and that stack ends with the outermost frame: ``<module>`` of the
    script, or runpy's ``_run_module_as_main`` under ``python -m``. A dump that ends
    otherwise is whole once its file has stayed the same size for SETTLE seconds."""
    deadline = time.time() + timeout
    seen: dict[int, tuple[int, float]] = {}  # pid -> (size, since)
    left = dict(files)
    while left and time.time() < deadline:
        time.sleep(POLL)
        now = time.time()
        for pid, (path, offset) in list(left.items()):
            size = _size(path)
            last = seen.get(pid)
            if size > offset and _ends_whole(path, size):
                del left[pid]
            elif last is None or last[0] != size:
                seen[pid] = (size, now)
            elif (size > offset and now - last[1] >= SETTLE) or not pid_alive(pid):
                del left[pid]


_OUTERMOST = (b" in <module>\n", b" in _run_module_as_main\n")


def _ends_whole(path: str, size: int) -> bool:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, size - 64))
            return fh.read(64).endswith(_OUTERMOST)
    except OSError:
        return False


def parse_faulthandler(text: str, cwd: str = "") -> list[ThreadRecord]:
    """faulthandler's dump as threads, the oldest first, each stack outermost first (as a
    traceback prints it), with each frame's source line read here (relative file names from
    ``cwd``)."""
    threads: list[ThreadRecord] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head or line == _STACK:
            threads.append(
                {
                    "id": head.group(2) if head else "",
                    "name": (head.group(3) or "") if head else "",
                    "status": "",
                    "current": bool(head) and line.startswith("Current"),
                    "frames": [],
                }
            )
        elif threads and line.strip():
            threads[-1]["frames"].append(_frame(line, cwd))
    for thread in threads:
        thread["frames"].reverse()
    threads.reverse()  # faulthandler starts with the newest thread
    return threads


def _frame(line: str, cwd: str) -> FrameRecord:
    match = _FRAME.match(line)
    if match is None:  # "  ..." where a deep stack was cut, "  <no Python frame>"
        return note(line.strip())
    number = match.group(2)
    return python_frame(match.group(1), int(number) if number.isdigit() else 0, match.group(3), cwd)


def prune(directory: str) -> None:
    """Remove the dump files (and stacks FIFOs) of processes that are gone."""
    for name in listdir(directory):
        pid, _, start = (
            name[: -len(contract.STACKS_ASK_SUFFIX)].partition("-")
            if name.endswith(contract.STACKS_ASK_SUFFIX)
            else name.partition("-")
        )
        if not (pid.isdigit() and start.isdigit()):
            continue
        if not pid_alive(int(pid)) or start_time(int(pid)) != int(start):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass

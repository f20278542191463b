"""Every Python process of a rank, set up like the rank: the sitecustomize of a node's tree.

The supervisor puts RUNDIR/site first on the ranks' PYTHONPATH, and boot leaves this file
there as ``sitecustomize.py``. So every Python process of the node imports it at start-up,
before any user code: torchrun's workers, and whatever they start in turn (``mp.spawn`` and
Lightning's workers, DataLoader workers, a ``python`` subprocess). It makes stdout and
stderr line-buffered, as the rank shim does for the ranks themselves: a spawned worker's
print is then live and one write per line, so its lines stay whole in the node's pipe,
without PYTHONUNBUFFERED (which writes a line's text and its newline separately). Then it
runs the sitecustomize it shadows, if the interpreter has one (a site's or a venv's).

It also makes every such process answer ``sshddp stacks``: ``faulthandler`` writes the stack
of every thread to RUNDIR/stacks/<pid>-<start time> when the process gets SIGRTMIN+6, even
while it is blocked inside C code (a collective, a socket, a lock). A real-time signal,
because no library of the stack uses one (scripts, torch, Lightning and Slurm use SIGUSR1,
SIGUSR2, SIGTERM, SIGINT, SIGCHLD, SIGHUP and SIGCONT), so a script's own handlers are never
touched. Registered without ``chain``: chaining re-raises the signal to the handler that was
there before, the default one, which ends a process on a real-time signal, and it drops
SA_RESTART, so a C call blocked in the receiving thread would fail with EINTR. A forked
child (a DataLoader worker) opens its own file.

And it tells the watchdogs and the report who joined a world: in every process of the
node, the first import of ``torch.distributed.distributed_c10d`` gets its
``init_process_group`` wrapped, through an import hook, so torch is never imported here. The
wrapper writes RUNDIR/joined/<rank> (a rank torchrun started: RANK set) or
RUNDIR/joined/p<pid> (a node launcher's worker) (``contract.JoinedRecord``) as the call
starts and again once it returns, with the rank and the world size the group then has.

And it gives a rank its own output: in a rank torchrun started (LOCAL_RANK set) whose stdout
is the node's pipe (SSHDDP_OUTPUT names it), stdout and stderr move onto the FIFO the
supervisor reads for that local rank, RUNDIR/out/<local rank> (``remote/rankside/rankout.py``; with
--tty the node's pty, and a link to the rank's own pty), before
any user code runs. What the rank starts inherits them, so its lines are the rank's too. A
process whose stdout is something else (a file, a pipe or a terminal of its own) is left alone.
Standalone: it imports nothing of sshddp. Python 3.8+.
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False  # every process of the node starts here: it never imports typing
if TYPE_CHECKING:
    from typing import IO, Any, Optional


def _line_buffered() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, ValueError):  # replaced or closed stream: leave it
            pass


def _chain() -> None:
    """Run the ``sitecustomize`` this one hides, as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


DUMP_SIGNAL_OFFSET = 6  #: dumps on SIGRTMIN+6 (sshddp.protocol.contract.STACKS_SIGNAL_OFFSET)
_dump: Optional[IO[bytes]] = None  # the open file faulthandler writes this process's stacks to


def _register_dumps() -> None:
    """faulthandler on SIGRTMIN+6 into RUNDIR/stacks/<pid>-<start time>, opened to append;
    the collector names the process by that file and reads what the signal added. A forked
    child holds the signal back until its own file is in place: meanwhile its dump would go
    to its parent's file."""
    signum = getattr(signal, "SIGRTMIN", None)
    rundir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # only in a node's run directory, staged
    if signum is None or not os.path.isfile(os.path.join(rundir, "spec.json")):
        return
    signum += DUMP_SIGNAL_OFFSET
    if _dump is None:  # not in a forked child: there faulthandler's handler is in place
        # faulthandler puts back the disposition it found when it lets go (at the
        # interpreter's end): ignored, so a dump asked for as the process exits (the
        # node's sampler asks every second) is dropped instead of ending it
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        _open_dump(os.path.join(rundir, "stacks"), signum)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})


def _open_dump(directory: str, signum: int) -> None:
    global _dump
    import faulthandler

    try:
        with open("/proc/self/stat") as fh:
            start = fh.read().rsplit(")", 1)[1].split()[19]
        os.makedirs(directory, 0o700, exist_ok=True)
        dump = open(os.path.join(directory, f"{os.getpid()}-{start}"), "ab", buffering=0)
    except (OSError, IndexError):  # no room, no /proc: this process has no dumps
        if _dump is not None:  # a forked child must not write into its parent's file
            faulthandler.unregister(signum)
        return
    faulthandler.register(signum, file=dump, all_threads=True, chain=False)
    if _dump is not None:
        _dump.close()  # the parent's file, inherited through fork: this copy only
    _dump = dump


ASK_SUFFIX = ".ask"  #: the FIFO a sampler asks on (sshddp.protocol.contract.STACKS_ASK_SUFFIX)
MAX_DEPTH = 100  #: frames written of one thread, as faulthandler's limit
_asked: Optional[tuple[int, int]] = None  # (pid, the FIFO's fd) once a process answers


def _answer_samplers(rundir: str) -> None:
    """Answer the node's samplers (``top``'s and the stall watchdog's, which ask every
    second or so for as long as the run lasts) from a thread of this process, not from a
    signal handler: each byte written to RUNDIR/stacks/<pid>-<start time>.ask makes the
    thread append every other thread's stack to the dump file, in faulthandler's format.
    It takes the GIL as any thread does, so it reads frames only where the interpreter is
    at rest: faulthandler's handler reads them wherever the signal lands, and CPython 3.11
    has crashed there (SIGSEGV in ``dump_traceback`` while a rank imported sympy under
    ``torch.optim``, after ``init_process_group``). A thread that cannot get the GIL (C
    code holding it) answers late or not at all: the sample is simply missing. ``sshddp
    stacks`` and a hang's report still use the signal, which answers even then, once."""
    global _asked
    if _dump is None or (_asked is not None and _asked[0] == os.getpid()):
        return
    import stat
    import threading

    path = os.path.join(rundir, "stacks", os.path.basename(_dump.name) + ASK_SUFFIX)
    try:
        try:
            os.unlink(path)  # of this very pid and start time: only this process's own
        except FileNotFoundError:
            pass
        os.mkfifo(path, 0o600)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # a reader of its own: never EOF
    except OSError:  # no room: samplers get no stacks from this process
        return
    info = os.fstat(fd)
    if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.geteuid():  # not the one made
        os.close(fd)
        return
    _asked = (os.getpid(), fd)
    thread = threading.Thread(target=_serve, args=(fd, _dump), name="sshddp-stacks", daemon=True)
    thread.start()


def _serve(fd: int, dump: IO[bytes]) -> None:
    import threading

    me = threading.get_ident()
    while True:
        try:
            if not os.read(fd, 512):  # blocks without the GIL
                return
        except OSError:
            return
        try:
            os.write(dump.fileno(), stacks_text(sys._current_frames(), me))
        except Exception:  # a closed dump file, no room: no answer this time
            continue


def stacks_text(frames: dict[int, Any], skip: int) -> bytes:
    """Every thread's stack but ``skip``'s, as faulthandler writes them: the newest thread
    first and the main thread last, each stack innermost first."""
    import threading

    main = threading.main_thread().ident
    chosen = sorted((t for t in frames if t != skip), key=lambda t: (t == main, t))
    blocks = []
    for ident in chosen:
        lines = [f"Thread 0x{ident:016x} (most recent call first):"]
        frame, depth = frames[ident], 0
        while frame is not None:
            if depth == MAX_DEPTH:
                lines.append("  ...")
                break
            code, line = frame.f_code, frame.f_lineno
            number = "???" if line is None else str(line)
            lines.append(f'  File "{code.co_filename}", line {number} in {code.co_name}')
            frame, depth = frame.f_back, depth + 1
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks).encode("utf-8", "backslashreplace")


C10D = "torch.distributed.distributed_c10d"


class _JoinHook:
    """A meta path finder that wraps ``init_process_group`` once its module is loaded."""

    def __init__(self, rundir: str, rank: Optional[int]) -> None:
        self.rundir = rundir
        self.rank = rank

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != C10D:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            execute(module)
            _wrap_init(module, self.rundir, self.rank)

        loader.exec_module = exec_module
        return spec


def _wrap_init(module: object, rundir: str, rank: Optional[int]) -> None:
    import functools

    init = getattr(module, "init_process_group", None)
    if init is None:
        return
    count = _Collectives(module)

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        _answer_samplers(rundir)
        entered = _write_joined(rundir, rank, {"entered": _now(), "joined": None})
        result = init(*args, **kwargs)
        group = _group_of(module)
        joined = {"entered": entered, "joined": _now(), "world": group[1]}
        _write_joined(rundir, rank, joined, group[0])
        count.start(lambda n: _write_joined(rundir, rank, {**joined, **n}, group[0]))
        return result

    module.init_process_group = init_process_group  # type: ignore[attr-defined]
    destroy = getattr(module, "destroy_process_group", None)
    if destroy is not None:

        @functools.wraps(destroy)
        def destroy_process_group(group=None):  # type: ignore[no-untyped-def]
            if group is None:
                count.record()
            return destroy(group)

        module.destroy_process_group = destroy_process_group  # type: ignore[attr-defined]


class _Collectives:
    """Records, once, how many collectives the process's groups ran (``collectives`` in its
    joined record): when it destroys its default group, else as it exits. Joining a group
    proves no cooperation: accelerate and a transformers Trainer on CPU hosts form one, then
    each process trains on its own and never runs a collective on it. A process that never
    gets there (killed, ``os._exit``, a multiprocessing worker) records nothing: unknown,
    and the report says nothing of it. Both functions are wrapped as c10d loads, so the
    names ``torch.distributed`` copies from it are the wrappers."""

    def __init__(self, module: object) -> None:
        self.module = module
        self.write: Any = None
        self.done = False

    def start(self, write: Any) -> None:
        import atexit

        if self.write is None:
            atexit.register(self.record)
        self.write = write
        self.done = False

    def record(self) -> None:
        if self.write is not None and not self.done:
            self.done = True
            self.write({"collectives": _collectives(self.module)})


def _collectives(module: Any) -> Optional[int]:
    """The most collectives any of the process's groups ran (c10d's sequence number, which
    every collective of a group advances); None for what torch won't say, or when its groups
    are gone already (destroyed through a name that is not the wrapper)."""
    try:
        groups = list(module._world.pg_map)
        return max(int(g._get_sequence_number_for_group()) for g in groups) if groups else None
    except Exception:  # a torch without them, or a group that cannot say
        return None


def _group_of(module: object) -> tuple[Optional[int], Optional[int]]:
    """(rank, world size) of the default group just formed; None for what torch won't say."""
    found: list[Optional[int]] = []
    for name in ("get_rank", "get_world_size"):
        try:
            found.append(int(getattr(module, name)()))
        except Exception:  # a torch without it, or a group it cannot describe
            found.append(None)
    return found[0], found[1]


def _now() -> float:
    import time

    return time.time()


JOINED_SCHEMA = 11  #: the records' schema (sshddp.protocol.contract.SCHEMA)


def _write_joined(
    rundir: str, rank: Optional[int], times: dict[str, Any], group_rank: Optional[int] = None
) -> float:
    """RUNDIR/joined/<rank> (p<pid> without RANK), replaced atomically; when the call
    started."""
    import json

    pid = os.getpid()
    name = str(rank) if rank is not None else f"p{pid}"
    known = rank if rank is not None else group_rank
    record: dict[str, Any] = {"schema": JOINED_SCHEMA, "rank": known, "pid": pid, "world": None}
    record.update(times)
    directory = os.path.join(rundir, "joined")
    try:
        os.makedirs(directory, 0o700, exist_ok=True)
        tmp = os.path.join(directory, f".{name}.{pid}")
        with open(tmp, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, os.path.join(directory, name))
    except OSError:  # no room: the watchdog sees this rank as not joined
        pass
    return float(record["entered"])


def _hook_init() -> None:
    rundir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(rundir, "spec.json")):
        return
    rank = os.environ.get("RANK", "")
    if C10D not in sys.modules:
        sys.meta_path.insert(0, _JoinHook(rundir, int(rank) if rank.isdigit() else None))


OUTPUT_VAR = "SSHDDP_OUTPUT"  #: the node pipe's DEV:INO (sshddp.protocol.contract.OUTPUT_VAR)


def _own_output() -> None:
    """Move fds 1 and 2, where they are the node's pipe, onto this rank's FIFO."""
    pipe, local = os.environ.get(OUTPUT_VAR, ""), os.environ.get("LOCAL_RANK", "")
    if not pipe or not local.isdigit() or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    rundir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    swap = [fd for fd in (1, 2) if _stream_id(fd) == pipe]
    if not swap:
        return
    try:  # non-blocking: no reader there (no such FIFO) fails at once rather than hang
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY  # --tty: a pty, never our terminal
        fifo = os.open(os.path.join(rundir, "out", local), flags)
    except OSError:
        return
    try:
        os.set_blocking(fifo, True)  # a full FIFO makes the rank wait, as the pipe did
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                pass
        for fd in swap:
            os.dup2(fifo, fd)
    finally:
        os.close(fifo)


def _stream_id(fd: int) -> str:
    import stat

    try:
        info = os.fstat(fd)
    except OSError:
        return ""
    shared = stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode)  # a pipe, or a pty
    return f"{info.st_dev}:{info.st_ino}" if shared else ""


_own_output()
_line_buffered()
_register_dumps()
_hook_init()
os.register_at_fork(after_in_child=_register_dumps)
_chain()

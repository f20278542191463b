"""How every node's torchrun starts: the agent shim, written into the run directory.

The supervisor runs ``python agent.py ARGS...`` where the plan says ``python -m
torch.distributed.run ARGS...``, and this runs torchrun exactly as ``-m`` would (same
sys.argv, sys.path[0] and ``__main__``). What it changes is only how the interpreter ends:
once torchrun has returned or raised, this does what the interpreter's own exit does that
anyone can see (the traceback or SystemExit message, non-daemon threads joined, atexit
handlers, stdout and stderr flushed), then leaves with ``os._exit``.

Why: an interpreter that imported torch takes about 0.4 s to tear its modules and torch's
C++ statics down after the last line of Python ran, and torchrun does its work
(stopping its workers, printing its failure summary) before that. Every teardown, stop and
restart waited that long for each node's torchrun to be gone; with this it is gone at once.
The ranks themselves end the normal way: their objects' finalizers are theirs to keep.

Standby (STANDBY_VAR set, with ``--max-restarts``): the supervisor starts the next attempt's
torchrun ahead. It imports torchrun (about a second, most of a fresh torchrun's start),
then waits on its stdin, a socket, for the supervisor's go (``standby_messages``, read from
beside this file: the attempt's environment, and the node's output as a descriptor). It
takes them and runs torchrun at once, with the command line and in the working directory
the go names. Without a go (the socket ends: no restart, or the supervisor is gone) it
leaves.

Node 0's store first (static rendezvous, every node but node 0): torchrun's rendezvous
connects to the store node 0's torchrun serves at the endpoint, and while nothing listens
there torch's connect waits between tries, longer each time: a node whose torch import ended
before node 0's did found the store up to half a second after it came up (measured: a
client started 0.6 s before the store connected 0.54 s after it), with every node idle
meanwhile. So after the import and before torchrun's own code, such a node tries the
endpoint itself until it accepts a connection (closed at once: the store takes it for a
client that left), for at most ``STORE_WAIT`` seconds; then torchrun connects at its first
try. It tries again after 5 ms, then twice as long each time up to ``STORE_STEP``: a node
that waits long tries 40 times a second (13 ms of CPU a second on the 2-core lab, mostly
wake-ups; every 10 ms took 27, from the cores the nodes' torch imports share; its own
sshddp code cannot be imported here, so the probe's connect loop is not reused), and finds
the store at most
``STORE_STEP`` after it came up. Another rendezvous backend, node 0, or an endpoint that
cannot be read: torchrun starts as it would.

torchrun's failure summary (``NAME FAILED``) names the program it started, by its own rule
the first argument of python's that is no option: the rank shim, for every sshddp run. Once
torchrun is imported, its rule is wrapped to name the script (or ``-m`` module) the shim
runs instead (``program_name``).
Standalone: it imports nothing of sshddp (the standby wire's module it loads by its path).
"""

from __future__ import annotations

import array
import atexit
import importlib
import importlib.util
import os
import runpy
import signal
import socket
import sys
import threading
import time
from typing import Any, Optional

MODULE = "torch.distributed.run"
STANDBY_VAR = "SSHDDP_AGENT_STANDBY"  #: set: wait for the supervisor's go (see above)
STORE_STEP = 0.025  #: most seconds between tries of node 0's store while it is not up
#: seconds a node waits for node 0's store before leaving it to torchrun's own tries, which
#: count against the rendezvous timeout from there (so a store that never comes is reported
#: at most this much later than without the wait)
STORE_WAIT = 10.0
RANK_SHIM = "rank.py"  #: the rank shim's file (sshddp.protocol.contract.RANK_SHIM)
#: the standby wire's module beside this file (sshddp.protocol.contract.STANDBY_WIRE)
STANDBY_WIRE = "standby_messages.py"
LAUNCHER_API = "torch.distributed.launcher.api"  #: where torchrun names its program


def exit_code(exc: SystemExit) -> int:
    """The status ``raise SystemExit(code)`` gives the interpreter; a message is printed."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """Everything the supervisor sends until it closes its end, and the descriptors that
    came with it."""
    data, ancillary, _flags, _addr = sock.recvmsg(1 << 16, socket.CMSG_SPACE(4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", payload[: len(payload) - len(payload) % 4]))
    chunks = [data]
    while data:
        data = sock.recv(1 << 16)
        chunks.append(data)
    return b"".join(chunks), fds


def preimport() -> None:
    """Import torchrun (and torch) ahead of running it. torch stays imported; torchrun's own
    module runs afresh as ``__main__``, as with ``-m`` (runpy warns of a module it is asked
    to run that is imported already). A failure (no torch, say) is left to that run, which
    fails again the same way, into the node's log."""
    try:
        importlib.import_module(MODULE)
        del sys.modules[MODULE]
    except Exception:
        pass


def program_name(name: str, args: list[object]) -> str:
    """What torchrun's summary names, ``name`` as its rule gives it from the program's
    ``args``: where that is the rank shim, the script or module the shim runs (its
    ``$$``, as torchrun must be given a ``$``, back to one)."""
    if os.path.basename(name) != RANK_SHIM or name not in args:
        return name
    rest = [str(arg) for arg in args[args.index(name) + 1 :]]
    if rest[:1] == ["-m"]:
        rest = rest[1:]
    return rest[0].replace("$$", "$") if rest else name


def name_the_program() -> None:
    """Wrap torchrun's rule for the name its failure summary gives (``program_name``), if
    torchrun is imported and has it (a private function: another torch may not)."""
    api = sys.modules.get(LAUNCHER_API)
    rule = getattr(api, "_get_entrypoint_name", None)
    if rule is None or getattr(rule, "__wrapped__", None) is not None:
        return

    def entrypoint_name(entrypoint: object, args: list[object]) -> str:
        return program_name(rule(entrypoint, args), args)

    entrypoint_name.__wrapped__ = rule  # type: ignore[attr-defined]
    api._get_entrypoint_name = entrypoint_name  # type: ignore[union-attr]


def store_endpoint(args: list[str]) -> Optional[tuple[str, int]]:
    """Node 0's store, from torchrun's arguments ``args``, when this node is another node of
    a static rendezvous; else None. The last of an option counts, as in argparse; the
    program's own arguments (from ``--no-python``, which sshddp always gives) are not read."""
    names = {
        "--node-rank": "rank",
        "--node_rank": "rank",
        "--rdzv-backend": "backend",
        "--rdzv_backend": "backend",
        "--rdzv-endpoint": "endpoint",
        "--rdzv_endpoint": "endpoint",
    }
    found: dict[str, str] = {}
    for at, arg in enumerate(args):
        if arg == "--no-python":
            break
        name, equals, value = arg.partition("=")
        if name not in names:
            continue
        if not equals:
            if at + 1 >= len(args):
                break
            value = args[at + 1]
        found[names[name]] = value
    if found.get("backend") != "static" or found.get("rank", "0").strip() in ("0", ""):
        return None
    host, colon, port = found.get("endpoint", "").rpartition(":")
    host = host.strip("[]")  # an IPv6 address: [addr]:port
    if not colon or not host or not port.isdigit():
        return None
    return host, int(port)


def await_store(host: str, port: int, limit: float = STORE_WAIT, step: float = STORE_STEP) -> bool:
    """Try ``host:port`` until it accepts a connection (True) or ``limit`` seconds have
    passed (False), 5 ms after the first try, then twice as long each time, up to ``step``
    seconds."""
    deadline = time.monotonic() + limit
    pause = min(0.005, step)
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    while True:
        for family, kind, proto, _name, address in addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                with socket.socket(family, kind, proto) as sock:
                    sock.settimeout(min(1.0, left))
                    sock.connect(address)
                return True
            except OSError:
                pass
        time.sleep(pause)
        pause = min(pause * 2, step)


def standby() -> bool:
    """Import torchrun, then wait for the go and take on its environment and output; False
    when none came."""
    preimport()
    sock = socket.socket(fileno=0)
    try:
        data, fds = receive(sock)
    finally:
        sock.close()
    null = os.open(os.devnull, os.O_RDONLY)  # torchrun's stdin, as the supervisor gives it
    os.dup2(null, 0)
    os.close(null)
    if not data or len(fds) != 1:
        return False
    go = standby_wire().decode_go(data)
    if go is None:  # no torchrun runs: the node's output says why (not what: the environment
        os.write(fds[0], b"sshddp: the standby's go was not one\n")  # may hold secrets)
        os._exit(1)
    os.environ.clear()
    os.environ.update(go["env"])
    for fd in (1, 2):
        os.dup2(fds[0], fd)
    os.close(fds[0])
    sys.stdout.reconfigure(line_buffering=os.isatty(1))  # type: ignore[union-attr]
    if go.get("argv"):  # [python, agent.py, torchrun's arguments...]
        sys.argv[1:] = go["argv"][2:]
    if go.get("cwd"):  # (a failure shows in the node's log: stderr is there now)
        os.chdir(go["cwd"])
        sys.path[0] = os.getcwd()  # as `python -m` has it there
    return True


def standby_wire() -> Any:
    """The standby wire's module (``standby_messages``), from beside this file: a run
    directory holds it next to the shim, and loading it by path puts no name on the ranks'
    import path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), STANDBY_WIRE)
    spec = importlib.util.spec_from_file_location("sshddp_standby_messages", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main() -> None:
    sys.path[0] = os.getcwd()  # as `python -m` has it (run_module sets sys.argv[0])
    standing_by = bool(os.environ.get(STANDBY_VAR))
    if standing_by and not standby():
        os._exit(0)
    code, interrupted = 0, False
    try:
        if not standing_by:
            preimport()
        store = store_endpoint(sys.argv[1:])
        if store is not None:
            await_store(*store)
        name_the_program()
        runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exit_code(exc)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finish(code, interrupted)


def finish(code: int, interrupted: bool) -> None:
    """End as the interpreter would, without its teardown of every module."""
    shutdown = getattr(threading, "_shutdown", None)
    for step in (shutdown, atexit._run_exitfuncs):
        try:
            if step is not None:
                step()
        except BaseException:  # the interpreter reports these and exits all the same
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if interrupted:  # a KeyboardInterrupt ends the interpreter by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


if __name__ == "__main__":
    main()

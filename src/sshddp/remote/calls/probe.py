"""Facts about this host for ``sshddp doctor`` and the launch preflight.

``probe(args)`` returns the facts and what it holds (``Holds``): a listener on the
rendezvous port, proving it free, so the other hosts can make a real TCP connection to the
rendezvous endpoint; and, when the port is picked here (``"auto"``: the first pair P, P+1
free from ``auto_from`` up), P+1 reserved for the supervisors until the node starts, so a
second run probing meanwhile never picks the same pair. The host's session
(``host_session.py``) answers with these facts first, for doctor and for a launch alike.

What the ranks would meet is looked at in the environment they will get: the login
environment with ``env`` (the inventory's and ``--env``) applied. The deep probe's torch
import (so ``CUDA_VISIBLE_DEVICES`` counts) and the script's imports run with it; ``watch``
names the variables whose login values are reported (never an ``env`` value: the
coordinator has those).

args: {"workdir", "deep": bool, "listen_port": int|"auto"|None, "auto_from": int,
       "connect": [addr, port]|None, "connect_timeout": float, "script": str|None,
       "env": {name: value}, "watch": {"names": [...], "prefixes": [...]},
       "route_to": addr|None, "imports": {"names": [...], "path0": str|None}|None,
       "gpu_uuids": bool, "health": host_health's args|None}
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Mapping, Optional, Tuple

from sshddp.remote.calls import host_health, host_imports, network
from sshddp.remote.common import home_path, listdir, temp_dir, try_lock, which
from sshddp.remote.workdir import inspect

Facts = Dict[str, Any]
Held = Tuple[socket.socket, Optional[threading.Thread]]
AUTO = "auto"  #: listen_port: pick a free pair here
AUTO_TRIES = 200  #: ports tried from auto_from up
DEEP_TIMEOUT = 120.0

_DEEP = r"""
import json, torch
out = {"cuda_available": False, "device_count": 0, "nccl": None, "gpu_names": []}
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    out["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(out["device_count"])]
    if out["cuda_available"]:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
out["distributed"] = torch.distributed.is_available()
print(json.dumps(out))
"""


class Holds:
    """What the probe holds on to: listeners (let go at the go) and a reserved port (let go
    just before the supervisor that binds it starts)."""

    def __init__(self) -> None:
        self.listeners: list[Held] = []
        self.reserved: list[Held] = []
        #: a picked pair's claims (``claim``): kept until this session ends, never released
        #: with the ports, so no other pick takes the pair before torchrun and the
        #: supervisor have bound it
        self.claims: list[int] = []

    def release_listeners(self) -> None:
        release(self.listeners)
        self.listeners = []

    def release_all(self) -> None:
        self.release_listeners()
        release(self.reserved)
        self.reserved = []


def _dist_versions(site: str) -> dict[str, str]:
    """{distribution name: version} from the *.dist-info names in one site directory
    (one listdir: importlib.metadata would scan every path entry per lookup)."""
    found = {}
    for name in listdir(site):
        if name.endswith(".dist-info") and "-" in name:
            dist, _, version = name[: -len(".dist-info")].rpartition("-")
            found[dist.lower().replace("-", "_")] = version
    return found


def _torch_facts(deep: Optional[subprocess.Popen[str]]) -> Optional[Facts]:
    """torch as installed; with the deep probe's process (importing torch meanwhile), what
    importing it says too."""
    facts: Facts = {"version": None, "cuda": None, "nccl_package": None}
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        if deep is not None:
            deep.kill()
            deep.communicate()
        return None
    torch_dir = os.path.dirname(spec.origin)
    dists = _dist_versions(os.path.dirname(torch_dir))
    facts["version"] = dists.get("torch", "unknown")
    facts["cuda"] = _cuda_from_version_py(os.path.join(torch_dir, "version.py"))
    for name in ("nvidia_nccl_cu13", "nvidia_nccl_cu12", "nvidia_nccl_cu11"):
        if name in dists:
            facts["nccl_package"] = dists[name]
            break
    if deep is not None:
        facts.update(_finish_json(deep, "torch_import"))
    return facts


def _start_deep(env: Mapping[str, str]) -> Optional[subprocess.Popen[str]]:
    """Import torch in a new interpreter with the ranks' environment; read by _finish_json.
    Started first, so the probe's other looks happen while torch imports."""
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _DEEP],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError:
        return None


def _cuda_from_version_py(path: str) -> Optional[str]:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("cuda"):
                    value = line.split("=", 1)[1].strip().strip("'\"")
                    return None if value == "None" else value
    except OSError:
        pass
    return None


def _finish_json(proc: subprocess.Popen[str], what: str) -> Facts:
    try:
        stdout, stderr = proc.communicate(timeout=DEEP_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.communicate()
        return {"error": f"{what}: {exc}"}
    if proc.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        return {"error": f"{what} exited {proc.returncode}: {' | '.join(tail)}"}
    try:
        value: Facts = json.loads(stdout.strip().splitlines()[-1])
        return value
    except (ValueError, IndexError):
        return {"error": f"{what} printed no JSON"}


def _nvidia_smi() -> Optional[Facts]:
    exe = which("nvidia-smi")
    if not exe:
        return None
    facts: Facts = {"gpus": [], "processes": [], "error": None}
    fields = "name,memory.total,driver_version,uuid"
    query = [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=15)
        for line in out.stdout.strip().splitlines():
            name, mem, driver, uuid = [x.strip() for x in line.split(",")[:4]]
            gpu = {"name": name, "memory_mib": int(float(mem)), "driver": driver, "uuid": uuid}
            facts["gpus"].append(gpu)
        if out.returncode != 0:
            facts["error"] = (out.stderr or out.stdout).strip()[:300]
        apps = [
            exe,
            "--query-compute-apps=pid,process_name,used_memory",
            "--format=csv,noheader,nounits",
        ]
        out = subprocess.run(apps, capture_output=True, text=True, timeout=15)
        for line in out.stdout.strip().splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 3:
                facts["processes"].append({"pid": parts[0], "name": parts[1], "mib": parts[2]})
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        facts["error"] = str(exc)
    return facts


def _disk(workdir: str) -> Facts:
    path = os.path.expanduser(workdir)
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        usage = os.statvfs(path or "/")
        return {"path": path, "free_bytes": usage.f_bavail * usage.f_frsize}
    except OSError as exc:
        return {"path": path, "error": str(exc)}


def _listen(port: int) -> tuple[Optional[Held], Optional[str]]:
    """Bind the port like torch's TCPStore does (all interfaces, SO_REUSEADDR)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        return None, f"{exc.strerror}"

    def accept_loop() -> None:
        while True:
            try:
                conn, _ = sock.accept()
                conn.close()
            except OSError:
                return

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    return (sock, thread), None


def _reserve(port: int) -> Optional[Held]:
    """Keep ``port`` from being bound by anyone else, without listening: a connection to it
    is refused (a supervisor connecting early retries), and without SO_REUSEADDR no other
    socket may bind it, whatever its options."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", port))
    except OSError:
        sock.close()
        return None
    return sock, None


def release(holders: list[Held]) -> None:
    """Close listeners from _listen (and reservations): the ports are free when this returns."""
    for sock, thread in holders:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        except OSError:
            pass
        sock.close()
        if thread is not None:
            thread.join(1.0)


def _connect(addr: str, port: int, timeout: float) -> Facts:
    deadline = time.time() + timeout
    last = "not tried"
    while time.time() < deadline:
        try:
            socket.create_connection((addr, port), timeout=max(0.2, deadline - time.time())).close()
            return {"ok": True, "addr": addr, "port": port}
        except OSError as exc:
            last = exc.strerror or str(exc)
            time.sleep(0.05)  # within the probe's timeout: a port that opens is seen soon
    return {"ok": False, "addr": addr, "port": port, "error": last}


def connect(order: Mapping[str, Any]) -> Facts:
    """The rendezvous connect asked for after the probe (the port was picked by node 0)."""
    addr, port = order["connect"]
    return _connect(addr, int(port), float(order.get("timeout", 3)))


def _hold_port(port: int, holds: Holds) -> Facts:
    """Listen on the rendezvous port; check that the supervisors' port above it is free."""
    listener, err = _listen(port)
    facts: Facts = {"port": port, "free": listener is not None, "error": err}
    holds.listeners += [listener] if listener else []
    # sshddp's supervisors use the next port: check it is free too, then let it go.
    peer, peer_err = _listen(port + 1)
    facts["peer_free"] = peer is not None
    facts["peer_error"] = peer_err
    release([peer] if peer else [])
    return facts


def claim(port: int) -> Optional[int]:
    """An exclusive lock on this host's claim file of ``port`` (in the temporary directory),
    as an open descriptor; None when another pick holds it. A pair is let go at the go (P,
    for torchrun) and at the start (P+1, for the supervisor) and bound again only later:
    meanwhile a second run's pick would find both ports free, so a pick also claims them,
    and keeps the claims while its session lives (a forked supervisor inherits them)."""
    path = os.path.join(temp_dir(), f"sshddp-port-{port}")
    try:
        return try_lock(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:  # made by another user and not readable: no claim, the bind decides
        return -1


def _claim_pair(port: int) -> Optional[list[int]]:
    """Claims on ``port`` and ``port + 1``, or None (nothing held) when either is taken."""
    first = claim(port)
    if first is None:
        return None
    second = claim(port + 1)
    if second is None:
        if first >= 0:
            os.close(first)
        return None
    return [fd for fd in (first, second) if fd >= 0]


def _pick_pair(first: int, holds: Holds) -> Facts:
    """The first P >= ``first`` with P and P+1 both free and claimed by no other pick: P
    listened on, P+1 reserved, both claimed."""
    for port in range(first, min(first + AUTO_TRIES, 65535)):
        claims = _claim_pair(port)
        if claims is None:
            continue
        listener, _ = _listen(port)
        reserved = _reserve(port + 1) if listener is not None else None
        if listener is None or reserved is None:
            release([listener] if listener is not None else [])
            for fd in claims:
                os.close(fd)
            continue
        holds.listeners.append(listener)
        holds.reserved.append(reserved)
        holds.claims += claims
        return {"port": port, "free": True, "error": None, "peer_free": True, "auto": first}
    last = min(first + AUTO_TRIES, 65535)
    error = f"no free pair of ports P, P+1 in {first}-{last}"
    return {"port": None, "free": False, "error": error, "auto": first}


def _ranks_env(extra: Optional[Mapping[str, str]]) -> dict[str, str]:
    """The environment the ranks get: this (login) one with the run's ``env`` applied."""
    env = dict(os.environ)
    env.update(extra or {})
    return env


def _watched(watch: Optional[Mapping[str, list[str]]]) -> dict[str, str]:
    """The login environment's values of the variables the checks look at."""
    if not watch:
        return {}
    names = set(watch.get("names") or [])
    prefixes = tuple(watch.get("prefixes") or [])
    return {
        k: v for k, v in os.environ.items() if k in names or (prefixes and k.startswith(prefixes))
    }


def _basics(args: Mapping[str, Any]) -> Facts:
    return {
        "hostname": socket.gethostname(),
        "os": f"{os.uname().sysname} {os.uname().release} {os.uname().machine}",
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "login_env": _watched(args.get("watch")),
        "cpus": _cpus(),
        "disk": _disk(os.path.join(args.get("workdir") or "~/.sshddp", "runs")),
        "workdir": inspect(os.path.expanduser(args.get("workdir") or "~/.sshddp")),
    }


def probe(args: dict[str, Any]) -> tuple[Facts, Holds]:
    """(facts, what is still held): the host's facts, the rendezvous port held if asked."""
    env = _ranks_env(args.get("env"))
    deep = _start_deep(env) if args.get("deep") else None
    health = host_health.start(args.get("health"), env)
    try:
        facts, holds = _looks(args, env, deep)
    except BaseException:
        host_health.stop(health)  # its commands never outlive the probe
        raise
    if health is not None:
        facts["health"] = host_health.finish(health)
    return facts, holds


def _looks(
    args: Mapping[str, Any], env: Mapping[str, str], deep: Optional[subprocess.Popen[str]]
) -> tuple[Facts, Holds]:
    facts = _basics(args)
    holds = Holds()
    listen = args.get("listen_port")
    if listen == AUTO:
        facts["port"] = _pick_pair(int(args.get("auto_from") or 29502), holds)
    elif listen:
        facts["port"] = _hold_port(int(listen), holds)
    if args.get("connect"):
        addr, port = args["connect"]
        facts["rendezvous"] = _connect(addr, int(port), float(args.get("connect_timeout", 3)))
    if args.get("route_to"):
        facts["net"] = network.facts(str(args["route_to"]))
    if args.get("imports"):
        ask = args["imports"]
        facts["imports"] = host_imports.find(list(ask["names"]), ask.get("path0"), env)
    facts["nvidia_smi"] = _nvidia_smi() if args.get("deep") or args.get("gpu_uuids") else None
    facts["gpu_dev_count"] = _count_gpu_devices()
    _script_facts(args, facts)
    facts["torch"] = _torch_facts(deep)
    if facts["torch"] is None:
        facts["pip"] = {m: importlib.util.find_spec(m) is not None for m in ("pip", "ensurepip")}
    return facts, holds


def _script_facts(args: Mapping[str, Any], facts: Facts) -> None:
    if args.get("script"):
        facts["script"] = {
            "path": args["script"],
            "exists": os.path.isfile(home_path(args["script"])),
        }


def _cpus() -> Optional[int]:
    """CPUs this host lets its processes use, as `nproc` counts them (the affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _count_gpu_devices() -> Optional[int]:
    try:
        return len([d for d in os.listdir("/proc/driver/nvidia/gpus")])
    except OSError:
        return None

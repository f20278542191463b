"""Facts about this host for ``sshddp doctor`` and the launch preflight.

``probe(args)`` returns the facts and, when asked, a listener held on the rendezvous port
(proving it free) so the other hosts can make a real TCP connection to the rendezvous
endpoint; ``release`` lets it go. The host's session (``session.py``) answers with these
facts first, for doctor and for a launch alike.

args: {"workdir", "deep": bool, "listen_port": int|None, "connect": [addr, port]|None,
       "connect_timeout": float, "script": str|None}
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Optional, Tuple

from sshddp.remote.common import home_path, listdir
from sshddp.remote.workdir import inspect

Facts = Dict[str, Any]
Held = Tuple[socket.socket, threading.Thread]

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


def _dist_versions(site: str) -> dict[str, str]:
    """{distribution name: version} from the *.dist-info names in one site directory
    (one listdir: importlib.metadata would scan every path entry per lookup)."""
    found = {}
    for name in listdir(site):
        if name.endswith(".dist-info") and "-" in name:
            dist, _, version = name[: -len(".dist-info")].rpartition("-")
            found[dist.lower().replace("-", "_")] = version
    return found


def _torch_facts(deep: bool) -> Optional[Facts]:
    facts: Facts = {"version": None, "cuda": None, "nccl_package": None}
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    torch_dir = os.path.dirname(spec.origin)
    dists = _dist_versions(os.path.dirname(torch_dir))
    facts["version"] = dists.get("torch", "unknown")
    facts["cuda"] = _cuda_from_version_py(os.path.join(torch_dir, "version.py"))
    for name in ("nvidia_nccl_cu13", "nvidia_nccl_cu12", "nvidia_nccl_cu11"):
        if name in dists:
            facts["nccl_package"] = dists[name]
            break
    if deep:
        facts.update(_run_json([sys.executable, "-c", _DEEP], 120, "torch_import"))
    return facts


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


def _run_json(argv: list[str], timeout: float, what: str) -> Facts:
    try:
        out = subprocess.run(argv, capture_output=True, timeout=timeout, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{what}: {exc}"}
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {"error": f"{what} exited {out.returncode}: {' | '.join(tail)}"}
    try:
        value: Facts = json.loads(out.stdout.strip().splitlines()[-1])
        return value
    except (ValueError, IndexError):
        return {"error": f"{what} printed no JSON"}


def _nvidia_smi() -> Optional[Facts]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    facts: Facts = {"gpus": [], "processes": [], "error": None}
    query = [exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=15)
        for line in out.stdout.strip().splitlines():
            name, mem, driver = [x.strip() for x in line.split(",")[:3]]
            facts["gpus"].append({"name": name, "memory_mib": int(float(mem)), "driver": driver})
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
        usage = shutil.disk_usage(path or "/")
        return {"path": path, "free_bytes": usage.free}
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


def release(holders: list[Held]) -> None:
    """Close listeners from _listen: the port is free again when this returns."""
    for sock, thread in holders:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        except OSError:
            pass
        sock.close()
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
            time.sleep(0.05)
    return {"ok": False, "addr": addr, "port": port, "error": last}


def probe(args: dict[str, Any]) -> tuple[Facts, list[Held]]:
    """(facts, listeners still held): the host's facts, the rendezvous port held if asked."""
    facts: Facts = {
        "hostname": socket.gethostname(),
        "os": f"{os.uname().sysname} {os.uname().release} {os.uname().machine}",
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "disk": _disk(os.path.join(args.get("workdir") or "~/.sshddp", "runs")),
        "workdir": inspect(os.path.expanduser(args.get("workdir") or "~/.sshddp")),
    }
    held: list[Held] = []
    if args.get("listen_port"):
        listener, err = _listen(int(args["listen_port"]))
        facts["port"] = {"port": args["listen_port"], "free": listener is not None, "error": err}
        held += [listener] if listener else []
        # sshddp's supervisors use the next port: check it is free too, then let it go.
        peer, peer_err = _listen(int(args["listen_port"]) + 1)
        facts["port"]["peer_free"] = peer is not None
        facts["port"]["peer_error"] = peer_err
        release([peer] if peer else [])
    if args.get("connect"):
        addr, port = args["connect"]
        facts["rendezvous"] = _connect(addr, int(port), float(args.get("connect_timeout", 3)))
    facts["torch"] = _torch_facts(bool(args.get("deep")))
    facts["nvidia_smi"] = _nvidia_smi() if args.get("deep") else None
    facts["gpu_dev_count"] = _count_gpu_devices()
    if args.get("script"):
        facts["script"] = {
            "path": args["script"],
            "exists": os.path.isfile(home_path(args["script"])),
        }
    return facts, held


def _count_gpu_devices() -> Optional[int]:
    try:
        return len([d for d in os.listdir("/proc/driver/nvidia/gpus")])
    except OSError:
        return None

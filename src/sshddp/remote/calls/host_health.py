"""The host's health for ``sshddp doctor --health``: facts only, judged by the coordinator
(``model/health``, ``protocol/gpu_health``, ``protocol/health_command``). Run alone
(``main``), it is the look a launch with spares takes at each host and spare before choosing
who runs (``run/quarantine/spares.py``); a waiting spare takes it at itself when node 0
needs it mid-run (``node/spare_health``).

``start`` sets the slow looks going as processes (the user's ``health:`` command,
``nvidia-smi -q``, with ``deep`` ``dcgmi diag -r 1``) so they run while the probe does the
rest; ``finish`` reads the kernel log's Xid lines and the InfiniBand ports, then collects
the processes, each within its timeout (killed with its process group past it). Nothing
needs root or an extra install: what cannot be read is said, never an error.

args: {"hardware": True (everything: doctor --health), "gpus" (a launch's subset: the GPUs'
       ``nvidia-smi -q``, on a host whose driver knows GPUs and has nvidia-smi) or False (the
       command alone), "command": str|None, "timeout": float, "deep": bool,
       "deep_timeout": float, "keep": int (bytes of each output kept, the last ones)}
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time
from typing import Any, Dict, Mapping, Optional

from sshddp.remote.common import emit, listdir, which

Facts = Dict[str, Any]
IB = "/sys/class/infiniband"
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  #: one entry per GPU the driver knows, answering or not
XID_MARK = b"NVRM: Xid"
KMSG_RECORDS = 100000  #: the most kernel log records read (the ring holds far fewer)
XID_KEPT = 50  #: the last Xid lines kept
KILLED_WAIT = 1.0  #: seconds a killed command is waited for


class Running:
    """A command started by ``start``: its process and the last ``keep`` bytes it wrote."""

    def __init__(self, proc: subprocess.Popen[bytes], keep: int, timeout: float) -> None:
        self.proc = proc
        self.keep = keep
        self.deadline = time.monotonic() + timeout
        self.tail = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            self.tail = (self.tail + chunk)[-self.keep :]

    def result(self) -> Facts:
        """{"exit": code (None past the timeout), "timed_out": bool, "output": its last
        ``keep`` bytes, as text}."""
        timed_out = False
        try:
            self.proc.wait(max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        # past the timeout the command too; else what it left running in its group, which
        # would outlive the probe (and hold the pipe open)
        _kill_group(self.proc.pid)
        _reap(self.proc)
        self.reader.join(KILLED_WAIT)  # one stuck in the kernel may hold the pipe: not waited
        code = None if timed_out else self.proc.returncode
        output = self.tail.decode("utf-8", "replace")
        return {"exit": code, "timed_out": timed_out, "output": output}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a killed process, briefly: one stuck in the driver (an nvidia-smi on a hung
    GPU, in uninterruptible sleep) dies only when the kernel lets it, and must not hold the
    probe meanwhile."""
    try:
        proc.wait(KILLED_WAIT)
    except subprocess.TimeoutExpired:
        pass


def _spawn(argv: list[str], env: Mapping[str, str], keep: int, timeout: float) -> Running:
    proc = subprocess.Popen(
        argv,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: a timeout kills what it started too
    )
    return Running(proc, keep, timeout)


def _user_command(command: str, env: Mapping[str, str], keep: int, timeout: float) -> Running:
    """The inventory's ``health:`` command, run by the shell as the user would run it."""
    return _spawn(["/bin/sh", "-c", command], env, keep, timeout)


def _system(name: str, argv: list[str], keep: int, timeout: float) -> Optional[Running]:
    """A system program found on PATH (nvidia-smi, dcgmi), or None when there is none."""
    exe = which(name)
    if exe is None:
        return None
    return _spawn([exe, *argv], os.environ, keep, timeout)


class HealthLooks:
    """What ``start`` set going."""

    def __init__(self, args: Mapping[str, Any], env: Mapping[str, str]) -> None:
        keep = int(args.get("keep") or 4096)
        timeout = float(args.get("timeout") or 8.0)
        command = args.get("command")
        self.user = _user_command(command, env, keep, timeout) if command else None
        mode = args.get("hardware", True)
        self.hardware = mode is True
        self.deep = self.hardware and bool(args.get("deep"))
        self.smi: Optional[Running] = None
        self.dcgm: Optional[Running] = None
        self.links: list[Facts] = []
        # a host without NVIDIA's driver pays one failed listdir for the launch's subset
        self.gpus = len(listdir(NVIDIA_GPUS)) if mode else 0
        if self.hardware or self.gpus:
            # the whole -q of 8 GPUs is about 100 KB; the coordinator parses its sections
            self.smi = _system("nvidia-smi", ["-q"], 1 << 20, timeout)
        if self.hardware:
            self.links = ib_ports()
        if self.deep:
            deep_timeout = float(args.get("deep_timeout") or 60.0)
            self.dcgm = _system("dcgmi", ["diag", "-r", "1"], 1 << 16, deep_timeout)


def start(args: Optional[Mapping[str, Any]], env: Mapping[str, str]) -> Optional[HealthLooks]:
    """Start the health looks asked for (None: none asked)."""
    return HealthLooks(args, env) if args else None


def stop(started: Optional[HealthLooks]) -> None:
    """Kill what ``start`` started (the probe failed)."""
    for running in (started.user, started.smi, started.dcgm) if started else ():
        if running is not None:
            _kill_group(running.proc.pid)
            _reap(running.proc)


def finish(started: Optional[HealthLooks]) -> Optional[Facts]:
    """The health facts: {"command": result|None, "smi": result|None, "kernel": {"xids":
    [...]} or {"unreadable": why}, "ib": [port, ...], "gpu_dev_count": int, and with deep
    "dcgm": result|None}; without hardware {"command": result}; with the launch's subset,
    where it ran nvidia-smi, "smi" and "gpu_dev_count" too."""
    if started is None:
        return None
    command = started.user.result() if started.user else None
    if not started.hardware:
        if started.smi is None:  # no GPU, or no nvidia-smi: doctor --health says which
            return {"command": command}
        return {"command": command, "smi": started.smi.result(), "gpu_dev_count": started.gpus}
    gpus = len(listdir(NVIDIA_GPUS))
    facts: Facts = {"gpu_dev_count": gpus, "ib": _ib_again(started.links)}
    # Xids are NVIDIA's: a host without its driver has none to read
    facts["kernel"] = kernel_xids() if gpus or started.smi else {"xids": []}
    facts["command"] = command
    facts["smi"] = started.smi.result() if started.smi else None
    if started.deep:
        facts["dcgm"] = started.dcgm.result() if started.dcgm else None
    return facts


def main(args: dict[str, Any]) -> None:
    """args: {"health": this module's args, "env": the run's env for the host}; answers
    ``finish``'s facts."""
    env = dict(os.environ)
    env.update(args.get("env") or {})
    emit({"health": finish(start(args["health"], env))})


def kernel_xids() -> Facts:
    """The kernel log's Xid lines since boot (the last XID_KEPT), from /dev/kmsg; or why it
    cannot be read (``kernel.dmesg_restrict``: root only)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return {"unreadable": f"/dev/kmsg: {exc.strerror or exc}"}
    xids: list[str] = []
    try:
        for _ in range(KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while read: go on from the next
                    continue
                break  # EAGAIN: the end of the log
            if not record:
                break
            if XID_MARK in record:
                xids.append(_kmsg_line(record))
    finally:
        os.close(fd)
    return {"xids": xids[-XID_KEPT:]}


def _kmsg_line(record: bytes) -> str:
    """A /dev/kmsg record ("prio,seq,usec,flags;text") as dmesg shows it: [seconds] text."""
    head, _, text = record.decode("utf-8", "replace").partition(";")
    fields = head.split(",")
    usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
    return f"[{usec / 1e6:.6f}] {text.splitlines()[0] if text else ''}"


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def ib_ports() -> list[Facts]:
    """Every InfiniBand/RoCE port under /sys/class/infiniband: its state, physical state,
    link layer and ``link_downed`` counter (None where unreadable)."""
    ports = []
    for dev in sorted(listdir(IB)):
        for port in sorted(listdir(os.path.join(IB, dev, "ports"))):
            base = os.path.join(IB, dev, "ports", port)
            downed = _read(os.path.join(base, "counters", "link_downed"))
            ports.append(
                {
                    "dev": dev,
                    "port": port,
                    "state": _read(os.path.join(base, "state")),
                    "phys_state": _read(os.path.join(base, "phys_state")),
                    "link_layer": _read(os.path.join(base, "link_layer")),
                    "link_downed": int(downed) if downed and downed.isdigit() else None,
                }
            )
    return ports


def _ib_again(first: list[Facts]) -> list[Facts]:
    """The ports read again: a ``link_downed`` that rose meanwhile is a link going down now."""
    before = {(p["dev"], p["port"]): p["link_downed"] for p in first}
    now = ib_ports()
    for port in now:
        port["link_downed_before"] = before.get((port["dev"], port["port"]))
    return now

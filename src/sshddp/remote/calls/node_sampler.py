"""The node's sampler: once a second, what each rank of the node uses (CPU, memory, output)
and what the host's GPUs do, appended to SAMPLES in the run directory (``sshddp top`` reads
the latest line; SAMPLES_OLD keeps the lines before, so the file stays bounded).

A daemon thread of the supervisor; it posts nothing and decides nothing, it only writes.
CPU and memory come from /proc (a rank counts with the workers that inherited its RANK),
GPUs from NVML through ctypes (no process per sample), else from ``nvidia-smi``; a host
without GPUs has none. The node's processes are found as teardown finds them (its run
marker) among the supervisor's descendants (a process that left the tree is teardown's
but not ``top``'s), again every RESCAN seconds; between scans only their /proc/PID/stat is
read.
Every STACK_EVERY seconds each rank's stacks are read, asked of the rank's stacks thread
(``host_stacks.by_request``: no signal, no process started, microseconds of the rank's
time; in faulthandler's format, as ``sshddp stacks`` reads them) and kept as
where it was: waiting in a collective or working, at which line (``waits``), the evidence
``top`` names a coupled run's straggler by.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from sshddp.protocol import contract
from sshddp.protocol.contract import (
    GpuSample,
    ProcessStacks,
    RankSample,
    SampleRecord,
    SpecRecord,
    StackSample,
    UsageRecord,
)
from sshddp.remote.calls.host_stacks import Proc, blank, by_request, describe, role
from sshddp.remote.calls.waits import classify
from sshddp.remote.common import descendants, read_json, read_json_lines, run_pids, which
from sshddp.remote.node.joined import entered
from sshddp.remote.node.stop import torchrun_group

EVERY = 1.0  #: seconds between samples
RESCAN = 5.0  #: seconds between looks for the node's processes
KEEP = 600  #: lines of SAMPLES before it becomes SAMPLES_OLD
STACK_EVERY = 1.0  #: seconds between two reads of the ranks' stacks
STACK_TIMEOUT = 0.5  #: seconds the ranks have to write their dumps
SMI_QUERY = "index,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
SMI_TIMEOUT = 5.0
_MIB = 1 << 20
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

CpuTimes = Dict[int, Tuple[float, int]]  #: pid -> (when read, utime + stime in ticks)


STOP_WAIT = 5.0  #: seconds a sample under way may take to finish once the node ends


class Sampler(threading.Thread):
    """Samples the node every EVERY seconds until the node ends (``stop``)."""

    def __init__(self, rundir: str, spec: SpecRecord) -> None:
        super().__init__(name="sampler", daemon=True)
        self.rundir = rundir
        self.spec = spec
        self.procs: dict[int, Proc] = {}
        self.roles: dict[int, str] = {}
        self.scanned = 0.0
        self.cpu: CpuTimes = {}
        self.output = OutputSeen(os.path.join(rundir, contract.INDEX))
        self.gpus: tuple[str, Callable[[], list[GpuSample]]] = ("", list)
        self.lines = 0
        self.stacked = 0.0
        self.stopped = threading.Event()

    def run(self) -> None:
        self.gpus = gpu_reader()  # here, not in the supervisor's start: NVML's init takes time
        while not self.stopped.is_set():
            try:
                self.write(self.sample(time.time()))
            except Exception:  # a sample lost is nothing next to the run it would stop
                pass
            self.stopped.wait(EVERY)

    def stop(self) -> None:
        """No sample after this returns: the node has ended, its run directory is final."""
        self.stopped.set()
        if self.is_alive():
            self.join(STOP_WAIT)

    def sample(self, now: float) -> SampleRecord:
        if now - self.scanned >= RESCAN or any(p not in self.cpu for p in self.procs):
            self._scan()
            self.scanned = now
        cpu, self.cpu = cpu_percent(self.cpu, list(self.procs), now)
        rss = {pid: rss_of(pid) for pid in self.procs}
        self.output.read(now)
        stacks: dict[int, StackSample] = {}
        if now - self.stacked >= STACK_EVERY - 0.05:
            stacks = rank_stacks(self.rundir, self.procs, self.roles)
            self.stacked = now
        return {
            "schema": contract.SCHEMA,
            "at": round(now, 3),
            "node_rank": self.spec["node_rank"],
            "cpu": _total(list(cpu.values())),
            "rss": sum(rss.values()),
            "ranks": rank_samples(self.procs, self.roles, cpu, rss, self.output, stacks),
            "gpus": self.gpus[1](),
            "gpu_source": self.gpus[0],
        }

    def _scan(self) -> None:
        state = read_json(os.path.join(self.rundir, contract.STATE)) or {}
        group, _ = torchrun_group(state)
        found = {}
        # the supervisor's descendants only: O(the node's processes), not O(the host's)
        for pid in run_pids(group, self.spec["mark"], among=descendants(os.getpid())):
            proc = describe(pid)
            if proc is not None:
                found[pid] = proc
        self.procs = found
        self.roles = {pid: role(p, found, state.get("pid")) for pid, p in found.items()}

    def write(self, record: SampleRecord) -> None:
        path = os.path.join(self.rundir, contract.SAMPLES)
        if self.lines >= KEEP:
            os.replace(path, os.path.join(self.rundir, contract.SAMPLES_OLD))
            self.lines = 0
        flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        if self.lines == 0:  # made new, as every file of the run directory is
            flags |= os.O_CREAT | os.O_EXCL
        fd = os.open(path, flags, 0o600)
        try:  # one write per line: a reader never sees half of one
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
        self.lines += 1


def usage(rundir: str) -> UsageRecord:
    """What the node's GPUs did over its kept samples (exit.json's ``usage``)."""
    samples = []
    for name in (contract.SAMPLES_OLD, contract.SAMPLES):
        samples.extend(read_json_lines(os.path.join(rundir, name)))
    return usage_of(samples)


def usage_of(samples: list[SampleRecord]) -> UsageRecord:
    """The mean utilisation of every GPU reading, and the fullest GPU of any sample."""
    utils: list[float] = []
    peak: tuple[int, Optional[int]] = (-1, None)
    gpus = 0
    for s in samples:
        readings = s.get("gpus") or []
        gpus = max(gpus, len(readings))
        for g in readings:
            if g.get("util") is not None:
                utils.append(float(g["util"]))  # type: ignore[arg-type]
            used = g.get("mem_used")
            if used is not None and used > peak[0]:
                peak = (used, g.get("mem_total"))
    return {
        "samples": len(samples),
        "waits": waits_of(samples),
        "gpus": gpus,
        "gpu_util": round(sum(utils) / len(utils), 1) if utils else None,
        "gpu_mem_peak": peak[0] if peak[0] >= 0 else None,
        "gpu_mem_total": peak[1] if peak[0] >= 0 else None,
    }


def waits_of(samples: list[SampleRecord]) -> dict[str, list[Any]]:
    """Each rank's stack samples: [samples, of them waiting, where it worked most]."""
    seen: dict[str, list[Any]] = {}
    places: dict[str, dict[str, int]] = {}
    for s in samples:
        for r in s.get("ranks") or []:
            stack = r.get("stack")
            if not stack:
                continue
            key = str(r["rank"])
            counts = seen.setdefault(key, [0, 0, ""])
            counts[0] += 1
            counts[1] += 1 if stack["wait"] else 0
            if not stack["wait"] and stack["where"]:
                mine = places.setdefault(key, {})
                mine[stack["where"]] = mine.get(stack["where"], 0) + 1
    for key, mine in places.items():
        seen[key][2] = max(mine, key=lambda w: mine[w])
    return seen


class OutputSeen:
    """How much each local rank wrote (node.idx, read as it grows), and when it last did."""

    def __init__(self, index: str) -> None:
        self.index = index
        self.offset = 0
        self.bytes: dict[int, int] = {}
        self.last: dict[int, float] = {}
        self.span: dict[int, list[int]] = {}  #: each rank's latest span: [offset, length]

    def read(self, now: float) -> None:
        try:
            with open(self.index, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        whole = len(data) - len(data) % contract.INDEX_BYTES
        self.offset += whole
        for offset, length, source in _records(data[:whole]):
            self.bytes[source] = self.bytes.get(source, 0) + length
            self.last[source] = now
            self.span[source] = [offset, length]


def _records(data: bytes) -> list[tuple[int, int, int]]:
    import struct

    return list(struct.iter_unpack(contract.INDEX_RECORD, data))


def rank_samples(
    procs: dict[int, Proc],
    roles: dict[int, str],
    cpu: dict[int, Optional[float]],
    rss: dict[int, int],
    output: OutputSeen,
    stacks: Optional[dict[int, StackSample]] = None,
) -> list[RankSample]:
    """One record per rank process of the node, its workers' use added to its own."""
    ranks: list[RankSample] = []
    for pid, proc in sorted(procs.items()):
        if roles.get(pid) != contract.RANK or proc.rank is None:
            continue
        mine = [
            p for p, q in procs.items() if q.rank == proc.rank and roles.get(p) != contract.AGENT
        ]
        local = proc.local_rank
        ranks.append(
            {
                "rank": proc.rank,
                "local_rank": local,
                "pid": pid,
                "cpu": _total([cpu.get(p) for p in mine]),
                "rss": sum(rss.get(p, 0) for p in mine),
                "out_bytes": output.bytes.get(local, 0) if local is not None else 0,
                "last_output": output.last.get(local) if local is not None else None,
                "last_span": output.span.get(local) if local is not None else None,
                "stack": (stacks or {}).get(pid),
            }
        )
    return sorted(ranks, key=lambda r: r["rank"])


def rank_stacks(
    rundir: str, procs: dict[int, Proc], roles: dict[int, str]
) -> dict[int, StackSample]:
    """Where each rank process of the node is now, by pid, as its stacks thread answers
    (``host_stacks.by_request``: no signal); only ranks that called init_process_group
    have one (``joined.entered``)."""
    ready = entered(rundir)
    now = [describe(pid) for pid in procs if roles.get(pid) == contract.RANK and pid in ready]
    # read again now, not at the last scan: a rank whose handler is gone is not signalled
    todo = [(proc, _empty(proc)) for proc in now if proc is not None]
    by_request(rundir, todo, STACK_TIMEOUT)
    found = {proc.pid: classify(record["threads"]) for proc, record in todo}
    return {pid: sample for pid, sample in found.items() if sample is not None}


def _empty(proc: Proc) -> ProcessStacks:
    return blank(proc, contract.RANK)


def _total(values: list[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return round(sum(known), 1) if known else None


def cpu_percent(
    before: CpuTimes, pids: list[int], now: float
) -> tuple[dict[int, Optional[float]], CpuTimes]:
    """Each process's CPU use since it was last read (% of one core; None the first
    time), and the times read now."""
    after: CpuTimes = {}
    use: dict[int, Optional[float]] = {}
    for pid in pids:
        ticks = cpu_ticks(pid)
        if ticks is None:
            continue
        after[pid] = (now, ticks)
        prev = before.get(pid)
        dt = now - prev[0] if prev else 0.0
        use[pid] = round(100.0 * (ticks - prev[1]) / _TICKS / dt, 1) if prev and dt > 0 else None
    return use, after


def cpu_ticks(pid: int) -> Optional[int]:
    """utime + stime of a process (clock ticks), from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def rss_of(pid: int) -> int:
    """Resident bytes of a process (/proc/PID/statm), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


# GPUs.


def gpu_reader() -> tuple[str, Callable[[], list[GpuSample]]]:
    """Where the GPUs are read from ("nvml", "nvidia-smi", "") and the reader."""
    nvml = Nvml.load()
    if nvml is not None:
        return "nvml", nvml.read
    smi = which("nvidia-smi")
    if smi is not None:
        return "nvidia-smi", lambda: smi_read(smi)
    return "", list


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class Nvml:
    """NVML's device queries through ctypes; each that fails leaves its value None."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    @staticmethod
    def load() -> Optional[Nvml]:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            return Nvml(lib) if lib.nvmlInit_v2() == 0 else None
        except (OSError, AttributeError):
            return None

    def read(self) -> list[GpuSample]:
        count = ctypes.c_uint(0)
        if self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return []
        return [self._device(i) for i in range(count.value)]

    def _device(self, index: int) -> GpuSample:
        lib, handle = self.lib, ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            return nvml_sample(index, b"", None, None, None, None)
        name = ctypes.create_string_buffer(96)
        util, mem = _Utilization(), _Memory()
        power, temp = ctypes.c_uint(), ctypes.c_uint()
        return nvml_sample(
            index,
            name.value if lib.nvmlDeviceGetName(handle, name, 96) == 0 else b"",
            (util.gpu, util.memory)
            if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)) == 0
            else None,
            (mem.total, mem.free, mem.used)
            if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == 0
            else None,
            power.value if lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)) == 0 else None,
            temp.value
            if lib.nvmlDeviceGetTemperature(handle, 0, ctypes.byref(temp)) == 0
            else None,
        )


def nvml_sample(
    index: int,
    name: bytes,
    util: Optional[tuple[int, int]],
    memory: Optional[tuple[int, int, int]],
    power_mw: Optional[int],
    temp_c: Optional[int],
) -> GpuSample:
    """One GPU's record from NVML's answers: utilisation (gpu, memory) %, memory (total,
    free, used) bytes, power in milliwatts, temperature in degrees."""
    return {
        "index": index,
        "name": name.decode("utf-8", "replace"),
        "util": float(util[0]) if util else None,
        "mem_used": int(memory[2]) if memory else None,
        "mem_total": int(memory[0]) if memory else None,
        "power": round(power_mw / 1000.0, 1) if power_mw is not None else None,
        "temp": float(temp_c) if temp_c is not None else None,
    }


def smi_read(smi: str) -> list[GpuSample]:
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=SMI_TIMEOUT,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return smi_samples(out.decode("utf-8", "replace"))


def smi_samples(text: str) -> list[GpuSample]:
    """The GPUs from ``nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,nounits``."""
    gpus: list[GpuSample] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 7 or not cells[0].isdigit():
            continue
        used, total = _number(cells[3]), _number(cells[4])
        gpus.append(
            {
                "index": int(cells[0]),
                "name": cells[1],
                "util": _number(cells[2]),
                "mem_used": int(used * _MIB) if used is not None else None,
                "mem_total": int(total * _MIB) if total is not None else None,
                "power": _number(cells[5]),
                "temp": _number(cells[6]),
            }
        )
    return gpus


def _number(cell: str) -> Optional[float]:
    """A cell's number; None for "[N/A]", "[Not Supported]" and the like."""
    try:
        return float(cell)
    except ValueError:
        return None

"""Benchmarks of sshddp against pdsh and plain OpenSSH, on real sshd servers on loopback.

Starts its own ``SshdCluster`` (scripts/sshddp_lab/sshd.py) in a temporary directory, runs every
benchmark and its baselines in the same run, interleaving the methods repetition by
repetition, and prints a markdown report (medians with min-max). ``--out`` also writes it
to a file (BENCHMARKS.md). Every "host" is this machine, so remote work competes with the
coordinator for the same cores: absolute numbers are pessimistic, the comparisons are fair.

    .venv/bin/python scripts/bench.py [--quick] [--reps N] [--out BENCHMARKS.md]
    .venv/bin/python scripts/bench.py --reps 1 --only launch --sizes 1   # a smoke run
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import importlib.metadata
import itertools
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Optional

import sshddp
from sshddp import scripts
from sshddp.checks import Context
from sshddp.doctor import probe_args
from sshddp.inventory import load_inventory
from sshddp.transport import SshOptions, ssh_hostname
from sshddp_lab.sshd import SshdCluster

ROOT = Path(__file__).resolve().parent.parent

# Hosts on 127.0.0.201.., clear of the test suite's .41.. and .101..; another run of this
# suite going on at the same time moves this one to the next free range.
FIRST_OCTETS = (200, 160, 60)
SSHD_PORT = 2222
FANOUT = 32  # sshddp's default --fanout; pdsh gets the same -f
POLL_S = 0.01  # /proc and log-size polling period
RUN_TIMEOUT_S = 180.0
LINE = b"sshddp benchmark log line ".ljust(63, b".") + b"\n"  # 64 bytes: 1 MiB = 16384 lines
TD_HOSTS, TD_NPROC = 3, 2  # teardown and node-loss runs
NL_HEARTBEAT_S = 3.0  # --heartbeat-timeout of the node-loss runs
L8_MB = 20  # MB each host's rank prints in the many-hosts log case

# The rank every benchmark runs. READY is printed at import, before torch or any
# process group, so launch latency measures the launcher, not the training script.
RANK_SCRIPT = f'''\
"""sshddp benchmark rank: READY at import, then latency / teardown / sleep / flood MB [all]."""
import os
import sys
import time

rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
print("READY %d %.6f" % (rank, time.time()), flush=True)
mode = sys.argv[1]
if mode == "latency":
    time.sleep(1.0)
elif mode == "teardown":
    if rank == world - 1:
        time.sleep(1.0)
        print("FAIL %.6f" % time.time(), flush=True)
        raise RuntimeError("injected failure (benchmark)")
    time.sleep(300)
elif mode == "sleep":
    time.sleep(300)
elif mode == "flood" and (rank == 0 or sys.argv[3:] == ["all"]):
    chunk = {LINE!r} * (1 << 20 >> 6)
    out = sys.stdout.buffer
    print("START %.6f" % time.time(), flush=True)
    for _ in range(int(sys.argv[2])):
        out.write(chunk)
    out.flush()
    print("END %.6f" % time.time(), flush=True)
'''


class BenchError(RuntimeError):
    """A benchmark run did not do what it should (wrong exit status, missing output)."""


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Stat:
    """Repeated measurements of one quantity."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def fmt(self, scale: float = 1.0, digits: int = 2) -> str:
        if not self.values:
            return "n/a"
        med, lo, hi = (v * scale for v in (self.median, min(self.values), max(self.values)))
        return f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"

    @property
    def noisy(self) -> bool:
        """Max more than 1.5x min: the machine was probably busy."""
        return bool(self.values) and max(self.values) > 1.5 * max(min(self.values), 1e-9)


def stat(values: Sequence[float]) -> Stat:
    return Stat(tuple(values))


def verdict(ok: bool, miss: str) -> str:
    return "met" if ok else f"**missed**: {miss}"


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Finished:
    """A command's outcome."""

    rc: int
    wall: float  #: seconds from Popen to exit
    cpu: float  #: user + sys seconds, with the children it reaped (wait4)
    maxrss_mb: float  #: its own peak RSS (VmHWM)
    threads: int  #: the most threads it had at once (sampled every 10 ms)
    lines: tuple[tuple[float, str], ...]  #: (perf_counter, text) of every stdout line
    stderr: str


class Watched:
    """A started command whose stdout lines are timestamped as they arrive."""

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        cwd: Path,
        on_line: Optional[Callable[[float, str], None]] = None,
        stdout_null: bool = False,
        timeout: float = RUN_TIMEOUT_S,
    ) -> None:
        self.argv = list(argv)
        self.on_line = on_line
        self.lines: list[tuple[float, str]] = []
        self.done = threading.Event()
        self._err: IO[bytes] = tempfile.TemporaryFile()
        self.t0 = time.perf_counter()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stderr=self._err,
            env=env,
            cwd=cwd,
            stdout=subprocess.DEVNULL if stdout_null else subprocess.PIPE,
            start_new_session=True,  # its own group: a timeout kills it and its children
        )
        self._rusage: Optional[resource.struct_rusage] = None
        self.end = 0.0
        self._hwm_kb = 0
        self._nthreads = 0
        self._threads = [
            threading.Thread(target=self._wait, daemon=True),
            threading.Thread(target=self._watch_rss, daemon=True),
        ]
        if not stdout_null:
            self._threads.append(threading.Thread(target=self._read, daemon=True))
        for t in self._threads:
            t.start()
        self._timer = threading.Timer(timeout, self._kill)
        self._timer.start()
        self.timed_out = False

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            now = time.perf_counter()
            text = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append((now, text))
            if self.on_line is not None:
                self.on_line(now, text)

    def _watch_rss(self) -> None:
        """Peak RSS (VmHWM) and thread count until exit. ``ru_maxrss`` from wait4 would
        also count the pages of this process that the child had between fork and exec."""
        path = f"/proc/{self.popen.pid}/status"
        while not self.done.is_set():
            with contextlib.suppress(OSError, ValueError), open(path) as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        self._hwm_kb = max(self._hwm_kb, int(line.split()[1]))
                    elif line.startswith("Threads:"):
                        self._nthreads = max(self._nthreads, int(line.split()[1]))
            time.sleep(POLL_S)

    def _wait(self) -> None:
        _, status, self._rusage = os.wait4(self.popen.pid, 0)
        self.end = time.perf_counter()
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        self.done.set()

    def _kill(self) -> None:
        if not self.done.is_set():
            self.timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)

    def finish(self) -> Finished:
        for t in self._threads:
            t.join()
        self._timer.cancel()
        self._err.seek(0)
        err = self._err.read().decode("utf-8", "replace")
        self._err.close()
        if self.timed_out:
            raise BenchError(f"timed out after {RUN_TIMEOUT_S:.0f} s: {shlex.join(self.argv)}")
        ru = self._rusage
        assert ru is not None
        return Finished(
            rc=int(self.popen.returncode),
            wall=self.end - self.t0,
            cpu=ru.ru_utime + ru.ru_stime,
            maxrss_mb=self._hwm_kb / 1024,
            threads=self._nthreads,
            lines=tuple(self.lines),
            stderr=err,
        )


def expect_rc(done: Finished, rc: int, what: str) -> Finished:
    if done.rc != rc:
        out = "\n".join(text for _, text in done.lines[-15:])
        raise BenchError(
            f"{what}: exit status {done.rc}, expected {rc}\nstdout:\n{out}\nstderr:\n"
            f"{done.stderr[-3000:]}"
        )
    return done


def free(port: int, addr: str = "") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((addr, port))
        except OSError:
            return False
    return True


def free_octet(hosts: int) -> int:
    """The first of FIRST_OCTETS whose addresses all have SSHD_PORT free."""
    for first in FIRST_OCTETS:
        addrs = [f"127.0.0.{first + i}" for i in range(1, hosts + 1)]
        if all(free(SSHD_PORT, addr) for addr in addrs):
            return first
    raise BenchError(f"port {SSHD_PORT} is taken on every address range {FIRST_OCTETS}")


def run_pids(name: str, value: str) -> list[int]:
    """Pids of live processes whose environment holds ``name=value`` (zombies have none)."""
    needle = f"{name}={value}".encode()
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def reap_leftovers() -> list[str]:
    """Processes of this suite's runs still alive 5 s after the last run (then killed)."""
    needle = b"SSHDDP_RUN_ID=bench-"
    deadline = time.monotonic() + 5
    while True:
        left = {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{entry}/environ").read_bytes()
                if any(item.startswith(needle) for item in env.split(b"\0")):
                    cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                    left[int(entry)] = cmd.decode("utf-8", "replace").strip()[:120]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kill_pids(list(left))  # started by this suite's runs, found by their run id
    return [f"pid {pid}: `{cmd}`" for pid, cmd in left.items()]


def kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- the bench


@dataclass
class Bench:
    """The cluster, the temporary directory and the helpers every benchmark shares."""

    tmp: Path
    cluster: SshdCluster
    env: dict[str, str]
    sshddp: list[str]
    rank_script: Path
    used_ports: set[int] = field(default_factory=set)
    counter: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def ssh_config(self) -> str:
        return str(self.cluster.ssh_config)

    def port(self) -> int:
        """A fresh rendezvous port P, P + 1 free too (sshddp also uses it), both never
        handed out before in this run."""
        while True:
            with socket.socket() as sock:
                sock.bind(("", 0))
                port = int(sock.getsockname()[1])
            pair = {port, port + 1}
            if port < 65535 and not pair & (self.used_ports | {SSHD_PORT}) and free(port + 1):
                self.used_ports |= pair
                return port

    def name(self, kind: str) -> str:
        return f"bench-{kind}-{next(self.counter)}"

    def inventory(self, name: str, hosts: int, nproc: int, port: int) -> Path:
        """An inventory of hosts h1..hN with its own remote workdir for this run."""
        text = self.cluster.inventory_yaml(
            list(range(1, hosts + 1)),
            nproc=nproc,
            rdzv_port=port,
            workdir=str(self.tmp / "work" / name),
            env={"GLOO_SOCKET_IFNAME": "lo"},
        )
        path = self.tmp / "inv" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def start(
        self,
        argv: Sequence[str],
        on_line: Optional[Callable[[float, str], None]] = None,
        stdout_null: bool = False,
    ) -> Watched:
        return Watched(argv, self.env, self.tmp, on_line, stdout_null)

    def launch_argv(
        self, name: str, port: int, inv: Path, *rank_args: str, options: Sequence[str] = ()
    ) -> list[str]:
        return [
            *self.sshddp,
            "launch",
            *options,
            "--ssh-config",
            self.ssh_config,
            "--log-dir",
            str(self.tmp / "logs"),
            "--name",
            name,
            "--port",
            str(port),
            str(inv),
            str(self.rank_script),
            *rank_args,
        ]

    def aliases(self, n: int) -> list[str]:
        return [h.alias for h in self.cluster.hosts[:n]]

    def pdsh(self, n: int, remote: str) -> list[str]:
        """pdsh over OpenSSH with the cluster's ssh_config; ``%h`` is the host alias."""
        return [
            "pdsh",
            "-R",
            "exec",
            "-f",
            str(FANOUT),
            "-w",
            ",".join(self.aliases(n)),
            "ssh",
            "-F",
            self.ssh_config,
            "%h",
            remote,
        ]


# --------------------------------------------------------------------------- 1. doctor


@dataclass(frozen=True)
class DoctorRow:
    hosts: int
    sshddp: Stat
    pdsh: Stat
    cpu: Stat  #: sshddp process user+sys seconds
    pdsh_cpu: Stat  #: pdsh + its ssh clients
    rss: Stat


def probe_headers(b: Bench, inv: Path, port: int) -> Path:
    """One stdin header per host, exactly what doctor sends it (host 1 also listens)."""
    inventory = load_inventory(str(inv))
    first = inventory.hosts[0]
    ctx = Context(
        rdzv_addr=ssh_hostname(first, SshOptions(ssh_config=b.ssh_config)), rdzv_port=port
    )
    out = b.tmp / "probe" / inv.stem
    out.mkdir(parents=True, exist_ok=True)
    for host in inventory.hosts:
        args = probe_args(host, ctx, deep=True, listen=host is first, rdzv_ok=True)
        (out / f"probe-{host.host}.hdr").write_bytes(scripts.header("probe", args))
    return out


def doctor_sshddp(b: Bench, n: int) -> Finished:
    port = b.port()
    inv = b.inventory(b.name("doctor"), n, 1, port)
    argv = [*b.sshddp, "doctor", "--ssh-config", b.ssh_config, "--port", str(port), str(inv)]
    return expect_rc(b.start(argv).finish(), 0, f"sshddp doctor ({n} hosts)")


def doctor_pdsh(b: Bench, n: int) -> Finished:
    port = b.port()
    inv = b.inventory(b.name("doctor-pdsh"), n, 1, port)
    headers = probe_headers(b, inv, port)
    python = scripts.python_command(sys.executable)
    remote = f"{python} < {shlex.quote(str(headers))}/probe-%h.hdr"
    done = expect_rc(b.start(b.pdsh(n, remote)).finish(), 0, f"pdsh probe ({n} hosts)")
    answers = [json.loads(t.split(": ", 1)[1]) for _, t in done.lines if re.match(r"h\d+: \{", t)]
    good = [a for a in answers if a["rendezvous"]["ok"] and "error" not in a["torch"]]
    if len(good) != n:
        raise BenchError(f"pdsh probe: {len(good)} of {n} hosts answered well: {done.lines}")
    return done


def bench_doctor(b: Bench, sizes: Sequence[int], reps: int) -> list[DoctorRow]:
    rows = []
    for n in sizes:
        runs: dict[str, list[Finished]] = {"sshddp": [], "pdsh": []}
        for rep in range(reps):
            for method in ("sshddp", "pdsh") if rep % 2 == 0 else ("pdsh", "sshddp"):
                fn = doctor_sshddp if method == "sshddp" else doctor_pdsh
                runs[method].append(fn(b, n))
        s, p = runs["sshddp"], runs["pdsh"]
        rows.append(
            DoctorRow(
                n,
                stat([r.wall for r in s]),
                stat([r.wall for r in p]),
                stat([r.cpu for r in s]),
                stat([r.cpu for r in p]),
                stat([r.maxrss_mb for r in s]),
            )
        )
        progress(
            f"doctor {n} hosts: sshddp {rows[-1].sshddp.fmt()} s, pdsh {rows[-1].pdsh.fmt()} s"
        )
    return rows


# --------------------------------------------------------------------------- 2. launch


class ReadyWatch:
    """Records when every rank has printed READY (and when a rank printed FAIL)."""

    def __init__(self, world: int, on_all: Optional[Callable[[], None]] = None) -> None:
        self.world = world
        self.ranks: set[int] = set()
        self.all_at: Optional[float] = None
        self.fail_ts: Optional[float] = None
        self.on_all = on_all

    def __call__(self, now: float, text: str) -> None:
        ready = re.search(r"READY (\d+) ", text)
        if ready and self.all_at is None:
            self.ranks.add(int(ready.group(1)))
            if len(self.ranks) == self.world:
                self.all_at = now
                if self.on_all is not None:
                    self.on_all()
        fail = re.search(r"FAIL (\d+\.\d+)", text)
        if fail:
            self.fail_ts = float(fail.group(1))


@dataclass(frozen=True)
class NodeCommand:
    host: str
    cwd: str
    env: str  #: ``K=V ...`` as --dry-run prints it (shell-quoted)
    command: str


def dry_run(b: Bench, name: str, port: int, inv: Path, *rank_args: str) -> list[NodeCommand]:
    """The per-node torchrun commands sshddp would run, from ``launch --dry-run``."""
    argv = b.launch_argv(name, port, inv, *rank_args)
    argv.insert(len(b.sshddp) + 1, "--dry-run")
    done = expect_rc(b.start(argv).finish(), 0, "sshddp launch --dry-run")
    blocks = "\n".join(t for _, t in done.lines).split("\n\n")
    nodes = [n for n in map(parse_node, blocks) if n is not None]
    if not nodes:
        raise BenchError(f"could not parse the --dry-run plan:\n{done.lines}")
    return nodes


def parse_node(block: str) -> Optional[NodeCommand]:
    """One ``node N: HOST`` block of the --dry-run text (its ``key: value`` lines)."""
    head = re.match(r"node \d+: (\S+)", block)
    if not head:
        return None
    fields = dict(re.findall(r"^  (\w[\w ]*):\s+(.*)$", block, re.M))
    env = fields.get("env", "-")
    return NodeCommand(head.group(1), fields["cwd"], "" if env == "-" else env, fields["command"])


def node_scripts(b: Bench, nodes: Sequence[NodeCommand], name: str, extra_env: str) -> Path:
    """A shell script per host that starts its torchrun as sshddp would (code pre-placed)."""
    out = b.tmp / "nodes" / name
    out.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        Path(node.cwd).mkdir(parents=True, exist_ok=True)
        shutil.copy(b.rank_script, node.cwd)
        argv = shlex.split(node.command)  # ... --no-python PYTHON RUNDIR/rank.py SCRIPT ...
        shim = Path(os.path.expanduser(argv[argv.index("--no-python") + 2]))
        shim.parent.mkdir(parents=True, exist_ok=True)
        shim.write_text(scripts.rank_source())
        line = f"cd {shlex.quote(node.cwd)} && exec env {extra_env} {node.env} {node.command}\n"
        (out / f"node-{node.host}.sh").write_text(line)
    return out


def baseline_argv(b: Bench, how: str, n: int, scripts_dir: Path) -> list[str]:
    """pdsh, or a plain ``ssh host cmd &`` loop, running each host's node script."""
    d = shlex.quote(str(scripts_dir))
    if how == "pdsh":
        return b.pdsh(n, f"sh {d}/node-%h.sh")
    cfg = shlex.quote(b.ssh_config)
    loop = f'for h in {" ".join(b.aliases(n))}; do ssh -F {cfg} "$h" sh {d}/node-$h.sh & done; wait'
    return ["bash", "-c", loop]


def launch_once(b: Bench, how: str, n: int) -> tuple[float, Finished]:
    """Seconds from the command's start to the last rank's READY line."""
    port, name = b.port(), b.name(f"ll-{how}")
    inv = b.inventory(name, n, 1, port)
    if how == "sshddp":
        argv = b.launch_argv(name, port, inv, "latency")
    else:
        nodes = dry_run(b, name, port, inv, "latency")
        argv = baseline_argv(b, how, n, node_scripts(b, nodes, name, ""))
    watch = ReadyWatch(n)
    proc = b.start(argv, on_line=watch)
    done = expect_rc(proc.finish(), 0, f"launch via {how} ({n} hosts)")
    if watch.all_at is None:
        raise BenchError(f"{how}: only ranks {sorted(watch.ranks)} of {n} printed READY")
    return watch.all_at - proc.t0, done


@dataclass(frozen=True)
class LaunchRow:
    hosts: int
    sshddp: Stat
    pdsh: Stat
    ssh: Stat
    cpu: Stat


def bench_launch(b: Bench, sizes: Sequence[int], reps: int) -> list[LaunchRow]:
    rows = []
    methods = ("sshddp", "pdsh", "ssh")
    for n in sizes:
        lat: dict[str, list[float]] = {m: [] for m in methods}
        cpu: list[float] = []
        for rep in range(reps):
            for how in methods[rep % 3 :] + methods[: rep % 3]:
                seconds, done = launch_once(b, how, n)
                lat[how].append(seconds)
                if how == "sshddp":
                    cpu.append(done.cpu)
        rows.append(
            LaunchRow(n, stat(lat["sshddp"]), stat(lat["pdsh"]), stat(lat["ssh"]), stat(cpu))
        )
        progress(f"launch {n} hosts: sshddp {rows[-1].sshddp.fmt()}, pdsh {rows[-1].pdsh.fmt()}")
    return rows


# --------------------------------------------------------------------------- 3. teardown


class GonePoller:
    """Records when no process carries ``name=value`` any more (``exclude``: pids that do
    not count, e.g. a frozen host's).

    A full /proc scan costs milliseconds of CPU on a 2-core machine that the teardown
    itself needs, so the pids found are re-checked every 10 ms and /proc is rescanned
    only every 100 ms and to confirm that the run is gone.
    """

    def __init__(self, name: str, value: str, exclude: frozenset[int] = frozenset()) -> None:
        self.name, self.value, self.exclude = name, value, exclude
        self.gone_at: Optional[float] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _scan(self) -> set[int]:
        return set(run_pids(self.name, self.value)) - self.exclude

    def _run(self) -> None:
        needle = f"{self.name}={self.value}".encode()
        pids = self._scan()
        for tick in itertools.count(1):
            if self._stop.is_set():
                return
            now = time.time()
            pids = {pid for pid in pids if carries(pid, needle)}
            if not pids or tick % 10 == 0:
                pids |= self._scan()
                if not pids:
                    self.gone_at = now
                    return
            time.sleep(POLL_S)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        self._stop.set()


def carries(pid: int, needle: bytes) -> bool:
    """Whether process ``pid`` is alive with ``needle`` in its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:
        return False


@dataclass(frozen=True)
class TeardownSample:
    """Seconds after the FAIL line (all clocks are this machine's)."""

    failed_node: float  #: the failing node's exit record (its torchrun has exited)
    others: float  #: the last other node's exit record (its torchrun stopped)
    gone: float  #: no process of the run left
    exit: float  #: sshddp exited (nan when detached: it had returned before)


@dataclass(frozen=True)
class TeardownRow:
    attached: tuple[TeardownSample, ...]
    detached: tuple[TeardownSample, ...]
    pdsh_survivors: str

    def stage(self, name: str, detached: bool = False) -> Stat:
        return stat([getattr(x, name) for x in (self.detached if detached else self.attached)])


def run_dir(b: Bench, name: str, node: int) -> Path:
    """Node ``node``'s run directory on its host (every host's workdir is on this disk)."""
    return b.tmp / "work" / name / "runs" / name / f"n{node}"


def node_ended(rundir: Path) -> float:
    """When the node's supervisor recorded its end (exit.json), torchrun gone."""
    return float(json.loads((rundir / "exit.json").read_text())["ended"])


def teardown_sample(
    b: Bench, name: str, fail: float, gone: float, exit_at: float
) -> TeardownSample:
    ended = [node_ended(run_dir(b, name, i)) for i in range(TD_HOSTS)]
    return TeardownSample(
        failed_node=ended[-1] - fail,
        others=max(ended[:-1]) - fail,
        gone=gone - fail,
        exit=exit_at - fail,
    )


def teardown_once(b: Bench) -> TeardownSample:
    port, name = b.port(), b.name("td")
    inv = b.inventory(name, TD_HOSTS, TD_NPROC, port)
    poller = GonePoller("SSHDDP_RUN_ID", name)
    watch = ReadyWatch(TD_HOSTS * TD_NPROC, on_all=poller.start)
    proc = b.start(b.launch_argv(name, port, inv, "teardown"), on_line=watch)
    done = expect_rc(proc.finish(), 1, "sshddp launch (teardown)")
    exit_at = time.time()
    poller.join(30.0)
    if watch.fail_ts is None or poller.gone_at is None:
        survivors = run_pids("SSHDDP_RUN_ID", name)
        raise BenchError(
            f"teardown {name}: FAIL={watch.fail_ts}, left: {survivors}\n{done.stderr[-2000:]}"
        )
    return teardown_sample(b, name, watch.fail_ts, poller.gone_at, exit_at)


def wait_logs(b: Bench, name: str, word: str, count: int, timeout: float = 90.0) -> None:
    """Until the nodes' ``node.log`` files on the hosts hold ``count`` lines starting with
    ``word`` (read every 20 ms; they are a few lines long)."""
    logs = [run_dir(b, name, i) / "node.log" for i in range(TD_HOSTS)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = 0
        for log in logs:
            with contextlib.suppress(OSError):
                seen += sum(line.startswith(word) for line in log.read_text().splitlines())
        if seen >= count:
            return
        time.sleep(0.02)
    sup = [(run_dir(b, name, i) / "supervisor.log") for i in range(TD_HOSTS)]
    tails = "\n".join(p.read_text()[-800:] for p in sup if p.exists())
    kill_pids(run_pids("SSHDDP_RUN_ID", name))  # a detached run of this suite, by its id
    raise BenchError(f"{name}: fewer than {count} {word} lines after {timeout:.0f} s\n{tails}")


def teardown_detached_once(b: Bench) -> TeardownSample:
    """The same failing job launched with ``--detach``: the supervisors alone tear it down."""
    port, name = b.port(), b.name("tdd")
    inv = b.inventory(name, TD_HOSTS, TD_NPROC, port)
    argv = b.launch_argv(name, port, inv, "teardown", options=["--detach"])
    expect_rc(b.start(argv).finish(), 0, "sshddp launch --detach (teardown)")
    poller = GonePoller("SSHDDP_RUN_ID", name)
    wait_logs(b, name, "READY", TD_HOSTS * TD_NPROC)
    poller.start()
    poller.join(60.0)
    failing = run_dir(b, name, TD_HOSTS - 1) / "node.log"
    fail = stamp(failing.read_text(), "FAIL")
    if poller.gone_at is None:
        survivors = run_pids("SSHDDP_RUN_ID", name)
        raise BenchError(f"detached teardown {name}: left after 60 s: {survivors}")
    return teardown_sample(b, name, fail, poller.gone_at, float("nan"))


def pdsh_survivors(b: Bench) -> str:
    """The same failing job under pdsh: what is still running 3 s after the failure."""
    port, name = b.port(), b.name("td-pdsh")
    inv = b.inventory(name, TD_HOSTS, TD_NPROC, port)
    nodes = dry_run(b, name, port, inv, "teardown")
    argv = baseline_argv(b, "pdsh", TD_HOSTS, node_scripts(b, nodes, name, f"BENCH_RUN={name}"))
    watch = ReadyWatch(TD_HOSTS * TD_NPROC)
    proc = b.start(argv, on_line=watch)
    deadline = time.monotonic() + 60
    while watch.fail_ts is None and time.monotonic() < deadline and not proc.done.is_set():
        time.sleep(0.05)
    time.sleep(3.0)
    left = run_pids("BENCH_RUN", name)
    running = not proc.done.is_set()
    kill_pids(left)  # the processes this benchmark started, by pid
    proc.finish()
    return (
        f"{len(left)} processes of the run still alive 3 s after the failure, "
        f"pdsh {'still waiting' if running else 'exited'}"
    )


def bench_teardown(b: Bench, reps: int) -> TeardownRow:
    attached, detached = [], []
    for rep in range(reps):  # alternate which variant goes first
        for how in ("attached", "detached") if rep % 2 == 0 else ("detached", "attached"):
            if how == "attached":
                attached.append(teardown_once(b))
            else:
                detached.append(teardown_detached_once(b))
    row = TeardownRow(tuple(attached), tuple(detached), pdsh_survivors(b))
    progress(
        f"teardown: attached {row.stage('gone').fmt()} s, detached "
        f"{row.stage('gone', detached=True).fmt()} s; pdsh: {row.pdsh_survivors}"
    )
    return row


# --------------------------------------------------------------------------- 4. node loss


@dataclass(frozen=True)
class NodeLossSample:
    """Seconds after the lost host's processes were signalled."""

    first: float  #: the first other node's exit record
    others: float  #: the last other node's exit record
    gone: float  #: no process of the run left on the other hosts
    reason: str  #: node 0's exit.json reason


@dataclass(frozen=True)
class NodeLossRow:
    killed: tuple[NodeLossSample, ...]  #: SIGKILL: the kernel closes the lost host's sockets
    frozen: tuple[NodeLossSample, ...]  #: SIGSTOP: silent, as a powered-off host

    def stage(self, name: str, how: str) -> Stat:
        samples = self.killed if how == "kill" else self.frozen
        return stat([getattr(x, name) for x in samples])


def node_pids(b: Bench, name: str, node: int) -> list[int]:
    """Every live process of one node of the run: its supervisor (``state.json``) first,
    then each process carrying both the run id and ``SSHDDP_NODE_RANK=node`` (torchrun
    and its workers). All hosts are this machine, so a host's processes are told apart by
    their environment."""
    state = json.loads((run_dir(b, name, node) / "state.json").read_text())
    supervisor = int(state["supervisor_pid"])
    needle = f"SSHDDP_NODE_RANK={node}".encode()
    rest = [p for p in run_pids("SSHDDP_RUN_ID", name) if p != supervisor and carries(p, needle)]
    if len(rest) < 1 + TD_NPROC:  # torchrun and its workers
        raise BenchError(f"{name}: node {node} has only {rest} besides its supervisor")
    return [supervisor, *rest]


def nodeloss_once(b: Bench, how: str) -> NodeLossSample:
    """A detached run of sleeping ranks; every process of the last host's run gets SIGKILL
    (``kill``) or SIGSTOP (``stop``); until the other hosts have none left."""
    port, name = b.port(), b.name(f"nl-{how}")
    inv = b.inventory(name, TD_HOSTS, TD_NPROC, port)
    options = ["--detach", "--heartbeat-timeout", f"{NL_HEARTBEAT_S:g}"]
    argv = b.launch_argv(name, port, inv, "sleep", options=options)
    expect_rc(b.start(argv).finish(), 0, "sshddp launch --detach (node loss)")
    wait_logs(b, name, "READY", TD_HOSTS * TD_NPROC)
    lost = TD_HOSTS - 1
    pids = node_pids(b, name, lost)
    poller = GonePoller("SSHDDP_RUN_ID", name, exclude=frozenset(pids))
    signum = signal.SIGKILL if how == "kill" else signal.SIGSTOP
    t0 = time.time()
    for pid in pids:  # the supervisor first: it must not see its torchrun die
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    poller.start()
    poller.join(NL_HEARTBEAT_S * 3 + 30)
    kill_pids(pids)  # the frozen host's processes, started by this run
    if poller.gone_at is None:
        left = sorted(set(run_pids("SSHDDP_RUN_ID", name)) - set(pids))
        kill_pids(left)
        raise BenchError(f"node loss ({how}) {name}: the other hosts still had {left}")
    ended = [node_ended(run_dir(b, name, i)) for i in range(lost)]
    reason = str(json.loads((run_dir(b, name, 0) / "exit.json").read_text()).get("reason", ""))
    return NodeLossSample(min(ended) - t0, max(ended) - t0, poller.gone_at - t0, reason)


def bench_nodeloss(b: Bench, reps: int) -> NodeLossRow:
    runs: dict[str, list[NodeLossSample]] = {"kill": [], "stop": []}
    for rep in range(reps):
        for how in ("kill", "stop") if rep % 2 == 0 else ("stop", "kill"):
            runs[how].append(nodeloss_once(b, how))
    row = NodeLossRow(tuple(runs["kill"]), tuple(runs["stop"]))
    progress(
        f"node loss: SIGKILL {row.stage('gone', 'kill').fmt()} s, "
        f"SIGSTOP {row.stage('gone', 'stop').fmt()} s"
    )
    return row


# --------------------------------------------------------------------------- 5. logs


@dataclass(frozen=True)
class LogSample:
    total: float  #: rank's START to the local log file complete
    writer: float  #: rank's START to END: its writes through the node's pipe into node.log
    cat: float  #: ssh cat of the remote node.log to /dev/null
    direct: float  #: ssh running the same writer, its stdout to a local file
    rss_mb: float  #: sshddp's peak RSS
    cpu: float  #: sshddp's user+sys seconds


class _Stages:
    """Medians of a log case's samples, stage by stage."""

    samples: Sequence[Any]

    def stage(self, name: str) -> Stat:
        return stat([getattr(x, name) for x in self.samples])

    @property
    def lag(self) -> Stat:
        """END written at the host(s) to the local copies complete."""
        return stat([x.total - x.writer for x in self.samples])


@dataclass(frozen=True)
class LogRow(_Stages):
    mb: int
    samples: tuple[LogSample, ...]


def size_when_complete(path: Path, proc: Watched) -> list[tuple[float, int]]:
    """(time.time(), size) of the local log every 10 ms until the command exits."""
    return [(t, sizes[0]) for t, sizes in sizes_until_exit([path], proc)]


def stamp(text: str, word: str) -> float:
    found = re.search(rf"{word} (\d+\.\d+)", text)
    if not found:
        raise BenchError(f"no {word} line in the log")
    return float(found.group(1))


def log_once(b: Bench, mb: int) -> LogSample:
    port, name = b.port(), b.name("log")
    inv = b.inventory(name, 1, 1, port)
    local = b.tmp / "logs" / name / "node0-h1.log"
    proc = b.start(b.launch_argv(name, port, inv, "flood", str(mb)), stdout_null=True)
    samples = size_when_complete(local, proc)
    done = expect_rc(proc.finish(), 0, "sshddp launch (flood)")
    final = samples[-1][1]
    complete_at = next(t for t, size in samples if size == final)
    with open(local, "rb") as fh:
        start = stamp(fh.read(4096).decode("utf-8", "replace"), "START")
    end = stamp(read_tail(local), "END")
    remote = b.tmp / "work" / name / "runs" / name / "n0" / "node.log"
    if remote.stat().st_size != final:
        raise BenchError(f"local log {final} bytes, remote node.log {remote.stat().st_size}")
    sample = LogSample(complete_at - start, end - start, ssh_cat(b, remote), ssh_direct(b, mb),
                       done.maxrss_mb, done.cpu)  # fmt: skip
    shutil.rmtree(b.tmp / "work" / name)  # 2 copies of the log per repetition otherwise
    local.unlink()
    return sample


def read_tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - 4096))
        return fh.read().decode("utf-8", "replace")


def ssh_cat(b: Bench, remote: Path) -> float:
    argv = ["ssh", "-F", b.ssh_config, "h1", f"cat {shlex.quote(str(remote))}"]
    return expect_rc(b.start(argv, stdout_null=True).finish(), 0, "ssh cat").wall


def ssh_direct(b: Bench, mb: int) -> float:
    """OpenSSH alone streaming the same writer into a local file: START to ssh's exit."""
    out = b.tmp / "direct.log"
    cmd = f"{shlex.quote(sys.executable)} {shlex.quote(str(b.rank_script))} flood {mb}"
    with open(out, "wb") as fh:
        subprocess.run(
            ["ssh", "-F", b.ssh_config, "h1", cmd],
            stdout=fh,
            check=True,
            stdin=subprocess.DEVNULL,
            env=b.env,
            timeout=RUN_TIMEOUT_S,
        )
        ended = time.time()
    with open(out, "rb") as fh:
        start = stamp(fh.read(4096).decode("utf-8", "replace"), "START")
    out.unlink()
    return ended - start


def bench_logs(b: Bench, mb: int, reps: int) -> LogRow:
    row = LogRow(mb, tuple(log_once(b, mb) for _ in range(reps)))
    progress(f"logs {mb} MB: sshddp {row.stage('total').fmt()} s, cat {row.stage('cat').fmt()} s")
    return row


# --------------------------------------------------------------------------- 6. logs, many hosts


@dataclass(frozen=True)
class Log8Sample:
    total: float  #: first rank's START to every local log complete
    writer: float  #: first START to the last END: the ranks' writes into node.log
    cat: float  #: parallel ssh cat of every host's node.log to /dev/null
    direct: (
        float  #: parallel ssh running the writer, each to a local file: first START to last exit
    )
    rss_mb: float  #: sshddp's peak RSS
    cpu: float  #: sshddp's user+sys seconds


@dataclass(frozen=True)
class Log8Row(_Stages):
    hosts: int
    mb: int  #: per host
    samples: tuple[Log8Sample, ...]


def sizes_until_exit(paths: Sequence[Path], proc: Watched) -> list[tuple[float, list[int]]]:
    """(time.time(), sizes) of the local logs every 10 ms until the command exits."""

    def sizes() -> list[int]:
        out = []
        for path in paths:
            try:
                out.append(path.stat().st_size)
            except OSError:
                out.append(0)
        return out

    samples = []
    while not proc.done.is_set():
        samples.append((time.time(), sizes()))
        time.sleep(POLL_S)
    samples.append((time.time(), sizes()))
    return samples


def parallel_ssh(b: Bench, commands: Sequence[tuple[str, str]], outs: Sequence[Path]) -> float:
    """``ssh host cmd > out`` for every (host, cmd) at once; time.time() once all exited."""
    procs = []
    for (host, cmd), out in zip(commands, outs):
        with open(out, "wb") as fh:
            procs.append(
                subprocess.Popen(
                    ["ssh", "-F", b.ssh_config, host, cmd],
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    env=b.env,
                    start_new_session=True,
                )
            )
    for (host, cmd), proc in zip(commands, procs):
        if proc.wait(timeout=RUN_TIMEOUT_S) != 0:
            raise BenchError(f"ssh {host} {cmd}: exit status {proc.returncode}")
    return time.time()


def logs8_once(b: Bench, n: int, mb: int) -> Log8Sample:
    port, name = b.port(), b.name("log8")
    inv = b.inventory(name, n, 1, port)
    hosts = b.aliases(n)
    local = [b.tmp / "logs" / name / f"node{k}-{h}.log" for k, h in enumerate(hosts)]
    argv = b.launch_argv(name, port, inv, "flood", str(mb), "all")
    proc = b.start(argv, stdout_null=True)
    samples = sizes_until_exit(local, proc)
    done = expect_rc(proc.finish(), 0, f"sshddp launch (flood, {n} hosts)")
    final = samples[-1][1]
    complete = [next(t for t, sizes in samples if sizes[k] == final[k]) for k in range(n)]
    starts, ends = [], []
    for path in local:
        with open(path, "rb") as fh:
            starts.append(stamp(fh.read(4096).decode("utf-8", "replace"), "START"))
        ends.append(stamp(read_tail(path), "END"))
    remote = [run_dir(b, name, k) / "node.log" for k in range(n)]
    for k, path in enumerate(remote):
        if path.stat().st_size != final[k]:
            raise BenchError(
                f"node {k}: local log {final[k]} bytes, node.log {path.stat().st_size}"
            )
    # Baselines: OpenSSH alone, every host at once.
    sink = [Path(os.devnull)] * n
    t0 = time.time()
    cat = parallel_ssh(b, [(h, f"cat {shlex.quote(str(p))}") for h, p in zip(hosts, remote)], sink)
    cat -= t0
    shutil.rmtree(b.tmp / "work" / name)
    shutil.rmtree(b.tmp / "logs" / name)
    writer = f"{shlex.quote(sys.executable)} {shlex.quote(str(b.rank_script))} flood {mb}"
    outs = [b.tmp / f"direct-{k}.log" for k in range(n)]
    ended = parallel_ssh(b, [(h, writer) for h in hosts], outs)
    first = min(stamp(p.read_bytes()[:4096].decode("utf-8", "replace"), "START") for p in outs)
    for path in outs:
        path.unlink()
    return Log8Sample(
        total=max(complete) - min(starts),
        writer=max(ends) - min(starts),
        cat=cat,
        direct=ended - first,
        rss_mb=done.maxrss_mb,
        cpu=done.cpu,
    )


def bench_logs8(b: Bench, n: int, mb: int, reps: int) -> Log8Row:
    row = Log8Row(n, mb, tuple(logs8_once(b, n, mb) for _ in range(reps)))
    progress(
        f"logs {n} hosts × {mb} MB: sshddp {row.stage('total').fmt()} s, "
        f"ssh writers {row.stage('direct').fmt()} s, RSS {row.stage('rss_mb').fmt(1, 0)} MB"
    )
    return row


# --------------------------------------------------------------------------- 7. scale


@dataclass(frozen=True)
class ScaleSample:
    rss_mb: float  #: coordinator peak RSS (VmHWM)
    threads: int  #: the coordinator's most threads at once
    ready: float  #: start to every rank's READY
    wall: float  #: start to exit
    cpu: float  #: coordinator user+sys seconds


@dataclass(frozen=True)
class ScaleRow:
    hosts: int
    samples: tuple[ScaleSample, ...]

    def stage(self, name: str) -> Stat:
        return stat([float(getattr(x, name)) for x in self.samples])


def scale_once(b: Bench, n: int) -> ScaleSample:
    port, name = b.port(), b.name("scale")
    inv = b.inventory(name, n, 1, port)
    watch = ReadyWatch(n)
    proc = b.start(b.launch_argv(name, port, inv, "latency"), on_line=watch)
    done = expect_rc(proc.finish(), 0, f"sshddp launch ({n} hosts)")
    if watch.all_at is None:
        raise BenchError(f"scale: only ranks {sorted(watch.ranks)} of {n} printed READY")
    return ScaleSample(done.maxrss_mb, done.threads, watch.all_at - proc.t0, done.wall, done.cpu)


def bench_scale(b: Bench, n: int, reps: int) -> ScaleRow:
    row = ScaleRow(n, tuple(scale_once(b, n) for _ in range(reps)))
    progress(
        f"scale {n} hosts: RSS {row.stage('rss_mb').fmt(1, 0)} MB, "
        f"threads {row.stage('threads').fmt(1, 0)}"
    )
    return row


# --------------------------------------------------------------------------- report


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def tool_version(argv: Sequence[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    return (out.stdout + out.stderr).strip().splitlines()[0]


def source_revision() -> str:
    """The commit measured, and whether src/ had uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "not a git checkout"
    dirty = subprocess.run([*git, "status", "--porcelain", "src"], capture_output=True, text=True)
    return f"commit {head.stdout.strip()}" + (" + uncommitted src/ changes" if dirty.stdout else "")


def machine() -> list[tuple[str, str]]:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("CPU", cpu_model()),
        ("cores", f"{os.cpu_count()} (usable: {len(os.sched_getaffinity(0))})"),
        ("OS", platform.platform()),
        ("python", platform.python_version()),
        ("torch", importlib.metadata.version("torch")),
        ("sshddp", f"{sshddp.__version__}, {source_revision()}"),
        ("OpenSSH", tool_version(["ssh", "-V"])),
        ("pdsh", tool_version(["pdsh", "-V"])),
        ("load average at start (1/5/15 min)", load),
    ]


def doctor_table(rows: Sequence[DoctorRow]) -> list[str]:
    out = [
        "| hosts | sshddp doctor (s) | pdsh, same probe (s) | ratio "
        "| target ≤ 1.2x at 16, ≤ 1.1x at 32 "
        "| sshddp CPU (ms) | CPU/host (ms) | target < 50 ms/host | pdsh+ssh CPU (ms) "
        "| sshddp peak RSS (MB) |",
        "|---:|---|---|---:|---|---|---:|---|---|---:|",
    ]
    for r in rows:
        ratio = r.sshddp.median / r.pdsh.median
        per_host = r.cpu.median / r.hosts * 1000
        gate = r.hosts >= 16
        limit = 1.1 if r.hosts >= 32 else 1.2
        miss = f"{ratio:.2f}x, {(ratio - limit) / limit:.0%} over {limit}x"
        t1 = verdict(ratio <= limit, miss) if gate else "-"
        t2 = verdict(per_host < 50, f"{per_host - 50:.0f} ms over") if gate else "-"
        out.append(
            f"| {r.hosts} | {r.sshddp.fmt()} | {r.pdsh.fmt()} | {ratio:.2f}x | {t1} "
            f"| {r.cpu.fmt(1000, 0)} | {per_host:.0f} | {t2} | {r.pdsh_cpu.fmt(1000, 0)} "
            f"| {r.rss.median:.0f} |"
        )
    if len(rows) >= 2:
        a, z = rows[0], rows[-1]
        marginal = (z.cpu.median - a.cpu.median) / (z.hosts - a.hosts) * 1000
        out.append("")
        out.append(
            f"Marginal coordinator CPU per extra host ({a.hosts}→{z.hosts} hosts): "
            f"{marginal:.0f} ms; fixed cost (1 host, mostly interpreter start and "
            f"imports): {a.cpu.median * 1000:.0f} ms."
        )
    return out


def launch_table(rows: Sequence[LaunchRow]) -> list[str]:
    out = [
        "| hosts | sshddp launch (s) | pdsh (s) | `ssh &` loop (s) | sshddp − pdsh (s) "
        "| target ≤ +0.5 s | sshddp CPU (ms) |",
        "|---:|---|---|---|---:|---|---|",
    ]
    for r in rows:
        over = round(r.sshddp.median - r.pdsh.median, 2)
        out.append(
            f"| {r.hosts} | {r.sshddp.fmt()} | {r.pdsh.fmt()} | {r.ssh.fmt()} "
            f"| {over:+.2f} | {verdict(over <= 0.5, f'{over - 0.5:.2f} s over')} "
            f"| {r.cpu.fmt(1000, 0)} |"
        )
    if len(rows) >= 2:
        a, z = rows[0], rows[-1]
        slope = ((z.sshddp.median - z.pdsh.median) - (a.sshddp.median - a.pdsh.median)) / (
            z.hosts - a.hosts
        )
        flat = verdict(abs(slope) <= 0.05, f"{slope * 1000:+.0f} ms per host")
        cpu = (z.cpu.median - a.cpu.median) / (z.hosts - a.hosts)
        out += [
            "",
            f"Overhead over pdsh grows by {slope * 1000:+.0f} ms per host "
            f"({a.hosts}→{z.hosts} hosts); flat (≤ 50 ms/host): {flat}. The coordinator's "
            f"own CPU grows by {cpu * 1000:.0f} ms per host; every host's remote processes "
            "(its sshd session, the launch session's interpreter and the supervisor it "
            "forks, torchrun) "
            "share this machine's cores, so on this "
            "box their per-host cost adds up where on a cluster it would run in parallel.",
        ]
    return out


TEARDOWN_STAGES = (
    ("failed_node", "the failing node's torchrun has exited (its exit record)"),
    ("others", "the other nodes have stopped (SIGTERM, torchrun exits; exit records)"),
    ("gone", "**no process of the run left** (`SSHDDP_RUN_ID` in /proc/*/environ)"),
    ("exit", "sshddp has exited"),
)


def teardown_table(r: TeardownRow) -> list[str]:
    out = [
        f"{TD_HOSTS} hosts × {TD_NPROC} processes; the last rank prints `FAIL <time>` and "
        "raises. Seconds after that line (the node stages are the `ended` times of the "
        "nodes' `exit.json`). Attached: `sshddp launch` follows the run; detached: "
        "`sshddp launch --detach` has returned and no coordinator is connected, the "
        "supervisors stop the run on their own:",
        "",
        "| stage | attached (s) | detached (s) |",
        "|---|---|---|",
    ]
    for key, text in TEARDOWN_STAGES:
        det = r.stage(key, detached=True).fmt() if key != "exit" and r.detached else "-"
        out.append(f"| {text} | {r.stage(key).fmt()} | {det} |")
    out.append("")
    for label, detached in (("attached", False), ("detached", True)):
        if not (r.detached if detached else r.attached):
            continue
        med = r.stage("gone", detached).median
        out.append(
            f"Target, {label}: no process left within 1 s (median): "
            f"{verdict(med < 1, f'{med:.2f} s, {med - 1:.2f} s over')}."
        )
    out += [
        "",
        f"pdsh, same job: never torn down — pdsh does not stop the other nodes when one "
        f"fails ({r.pdsh_survivors}).",
    ]
    return out


def nodeloss_table(r: NodeLossRow) -> list[str]:
    stages = (
        ("first", "the first other node has stopped (its exit record)"),
        ("others", "every other node has stopped (exit records)"),
        ("gone", "**no process of the run left on the other hosts**"),
    )
    out = [
        f"{TD_HOSTS} hosts × {TD_NPROC} processes, detached (`--detach --heartbeat-timeout "
        f"{NL_HEARTBEAT_S:g}`), every rank sleeping. Every process of the last host's run "
        "(its supervisor first, then torchrun and its workers) is signalled at once. "
        "Seconds after the signal:",
        "",
        "| stage | SIGKILL: host's processes die (s) | SIGSTOP: host goes silent (s) |",
        "|---|---|---|",
    ]
    out += [
        f"| {text} | {r.stage(key, 'kill').fmt()} | {r.stage(key, 'stop').fmt()} |"
        for key, text in stages
    ]
    for how, samples in (("SIGKILL", r.killed), ("SIGSTOP", r.frozen)):
        if samples:
            out.append("")
            out.append(f"Node 0's reason, {how}: “{samples[0].reason}”.")
    out += [
        "",
        "SIGKILL is detected when the kernel closes the killed supervisor's connection to "
        "node 0's supervisor, whatever the timeout; SIGSTOP (a host that hangs or loses power "
        f"without closing its connections) only after `--heartbeat-timeout` ({NL_HEARTBEAT_S:g} "
        "s here, 30 s by default) of silence. No target is set for either; what follows "
        "detection is the same teardown as above.",
    ]
    return out


def log_table(r: LogRow) -> list[str]:
    total, cat, rss = r.stage("total"), r.stage("cat"), r.stage("rss_mb")
    ratio = total.median / cat.median
    rows = [
        ("sshddp: rank's first byte → local log complete", total),
        ("… the rank's writes into node.log (START → END)", r.stage("writer")),
        ("… END at the host → local copy complete (follower, SSH, coordinator)", r.lag),
        ("OpenSSH: `ssh h1 cat node.log > /dev/null` (after the run)", cat),
        ("OpenSSH: `ssh h1 python rank.py flood > file` (same writer, no sshddp)",
         r.stage("direct")),
    ]  # fmt: skip
    out = [f"| {r.mb} MB from one rank | seconds | MB/s |", "|---|---|---:|"]
    out += [f"| {text} | {s.fmt()} | {r.mb / s.median:.0f} |" for text, s in rows]
    return out + [
        "",
        f"sshddp / ssh cat: {ratio:.2f}x — target ≤ 2x: "
        f"{verdict(ratio <= 2, f'{ratio:.2f}x, {(ratio - 2) / 2:.0%} over')}.",
        f"Coordinator peak RSS {rss.fmt(1, 0)} MB — target < 200 MB: "
        f"{verdict(rss.median < 200, f'{rss.median - 200:.0f} MB over')}. "
        f"Coordinator CPU {r.stage('cpu').fmt()} s.",
    ]


def logs8_table(r: Log8Row) -> list[str]:
    total = r.hosts * r.mb
    rows = [
        ("sshddp: first rank's START → every local log complete", r.stage("total")),
        ("… the ranks' writes through the nodes' pipes into node.log (first START → last END)",
         r.stage("writer")),
        ("… last END → every local copy complete (followers, SSH, coordinator)", r.lag),
        (f"OpenSSH: {r.hosts} × `ssh hK cat node.log > /dev/null` at once (after the run)",
         r.stage("cat")),
        (f"OpenSSH: {r.hosts} × `ssh hK python rank.py flood > file` at once (same writers)",
         r.stage("direct")),
    ]  # fmt: skip
    out = [f"| {r.hosts} hosts × {r.mb} MB, one rank each | seconds | MB/s in all |",
           "|---|---|---:|"]  # fmt: skip
    out += [f"| {text} | {s.fmt()} | {total / s.median:.0f} |" for text, s in rows]
    ratio = r.stage("total").median / r.stage("direct").median
    return out + [
        "",
        f"sshddp / ssh running the writers: {ratio:.2f}x (no target). Coordinator peak RSS "
        f"{r.stage('rss_mb').fmt(1, 0)} MB, CPU (user+sys) {r.stage('cpu').fmt()} s.",
    ]


def scale_table(r: ScaleRow) -> list[str]:
    rss = r.stage("rss_mb")
    out = [
        f"`sshddp launch` attached to {r.hosts} hosts × 1 process; each rank prints READY, "
        "sleeps 1 s and exits 0. Sampled from the coordinator's /proc/<pid>/status every "
        "10 ms for the whole run:",
        "",
        "| | median (min–max) |",
        "|---|---|",
        f"| coordinator peak RSS (VmHWM, MB) | {rss.fmt(1, 0)} |",
        f"| coordinator threads, most at once | {r.stage('threads').fmt(1, 0)} |",
        f"| coordinator CPU, user+sys (s) | {r.stage('cpu').fmt()} |",
        f"| start → every rank's READY (s) | {r.stage('ready').fmt()} |",
        f"| start → sshddp exited (s) | {r.stage('wall').fmt()} |",
        "",
        "Target: coordinator under 150 MB at 32 hosts: "
        + (
            verdict(rss.median < 150, f"{rss.median:.0f} MB, {rss.median - 150:.0f} MB over")
            if r.hosts >= 32
            else f"not measured ({r.hosts} hosts only)"
        )
        + ".",
    ]
    return out


@dataclass
class Results:
    doctor: list[DoctorRow] = field(default_factory=list)
    launch: list[LaunchRow] = field(default_factory=list)
    teardown: Optional[TeardownRow] = None
    nodeloss: Optional[NodeLossRow] = None
    logs: Optional[LogRow] = None
    logs8: Optional[Log8Row] = None
    scale: Optional[ScaleRow] = None
    leftovers: list[str] = field(default_factory=list)  #: processes of finished runs


METHOD = """\
## Method

* Hosts are real `sshd` servers on loopback addresses (see *hosts* above) started by
  `scripts/sshddp_lab/sshd.py`, all on this machine: the hosts' work competes with the coordinator
  for the same cores. Each remote run has its own `workdir` under a temporary directory and a
  fresh rendezvous port. Methods alternate from repetition to repetition. Values are
  median (min–max) of {reps} repetitions.
* **doctor**: `sshddp doctor --ssh-config cfg --port P inv.yaml` (deep probe: every host imports
  torch). Baseline: `pdsh -R exec -f 32 -w h1,..,hN ssh -F cfg %h 'exec PY -c BOOTSTRAP <
  DIR/probe-%h.hdr'`, where each header file holds exactly the bytes doctor sends that host
  (`scripts.header("probe", doctor.probe_args(...))`, so host 1 also listens on the
  rendezvous port and every host connects to it) and BOOTSTRAP is `scripts.python_command`.
  The probe source is read from a file on the host instead of over the SSH channel. CPU is
  user+sys of the command and the children it reaped (`os.wait4`): sshddp has none, pdsh's
  include its `ssh` clients.
* **launch**: a rank prints `READY <rank>` at import, sleeps 1 s and exits 0; 1 process per
  host; {launch_sizes} hosts. Latency is from starting the command to the last rank's READY
  line on its stdout. sshddp's includes preflight, code copy and supervisor start. pdsh
  (`-R exec ... sh node-%h.sh`) and the `for h ...; do ssh -F cfg $h sh node-$h.sh & done;
  wait` loop run the torchrun commands and environment printed by `sshddp launch
  --dry-run`, with the script already in place on the hosts. sshddp runs with its modules'
  bytecode compiled first, as `pip install` leaves them (the suite compiles them at start).
* **teardown**: {td_hosts} hosts × {td_nproc} processes; the last rank prints
  `FAIL <time.time()>` 1 s after READY and raises, the others sleep. Latency is from that
  timestamp until no process whose `/proc/<pid>/environ` holds `SSHDDP_RUN_ID=<run id>` is
  left (the run's pids re-checked every 10 ms; /proc rescanned every 100 ms and to confirm).
  sshddp runs with its default `--grace` (10 s). The node stages are the `ended` times in
  each node's `exit.json`. *Attached* is `sshddp launch` following the run (it exits 1);
  *detached* is `sshddp launch --detach`, which has returned before the ranks start, so only
  the supervisors (node 0's hub and its peers) stop the run; the `FAIL` timestamp is read
  from the failing node's `node.log` on its host. The two variants alternate.
* **node loss**: {td_hosts} hosts × {td_nproc} processes launched with `--detach
  --heartbeat-timeout {hb}`, every rank sleeping. Once every rank's READY is in its node's
  `node.log`, every process of the last host's run — its supervisor (`supervisor_pid` in
  `state.json`) first, then each process with that run id and `SSHDDP_NODE_RANK=<node>` in
  its environment (torchrun, its workers) — gets SIGKILL (the kernel closes its sockets, as
  when a host's processes crash or are OOM-killed) or SIGSTOP (the host goes silent with its
  connections open, as on power loss or a network cut; only the heartbeat timeout can tell).
  Latency is from the signal until no process of the run is left on the other hosts (the
  frozen host's pids excluded, then killed). The hub counts silence from the last line it
  received and heartbeats come every min(1, timeout / 5) s, so a frozen host is noticed
  between 0.8x and 1x the timeout after the signal. The two variants alternate.
* **logs**: one rank writes {mb} MB (1 MiB `write`s of 64-byte printable lines) to stdout; sshddp
  runs with its stdout redirected to `/dev/null` (printing 200 MB to a terminal would
  dominate) and is timed from the rank's `START` timestamp until the local
  `sshddp-logs/<run>/node0-h1.log` reached its final size (polled every 10 ms; the byte count
  is checked against the host's `node.log`). Baselines: `ssh -F cfg h1 cat <node.log>` to
  `/dev/null` after the run, and ssh running the same writer with stdout to a local file.
  Peak RSS is the sshddp process's `VmHWM` (/proc/<pid>/status, polled every 10 ms).
* **logs, {l8_hosts} hosts**: one rank on each of {l8_hosts} hosts writes {l8_mb} MB as above, all
  at once; sshddp's stdout goes to `/dev/null`. Timed from the earliest `START` timestamp
  until every local `node<K>-<host>.log` reached its final size (all polled every 10 ms;
  each checked against its host's `node.log`). Coordinator CPU (user+sys, `os.wait4`) and
  peak RSS (`VmHWM`) as above. Baselines, OpenSSH alone, {l8_hosts} connections at once: `ssh
  hK cat <node.log>` of the same files to `/dev/null` (after the run), and ssh running the
  same writer on every host with stdout to local files, from the earliest `START` to the
  last ssh's exit.
* **scale**: `sshddp launch` attached to {scale} hosts × 1 process of the launch job (READY,
  sleep 1 s, exit 0). The coordinator's `VmHWM` and `Threads` are read from
  /proc/<pid>/status every 10 ms from start to exit; the table gives the peak and the most
  threads. No baseline.
"""


def render(res: Results, reps: int, sizes: Sizes, info: list[tuple[str, str]], cmd: str) -> str:
    lines = [
        "# sshddp benchmarks",
        "",
        f"Generated by `scripts/bench.py`. Reproduce: `{cmd}`",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in info]
    if reps < 5:
        lines += ["", f"**Only {reps} repetition(s): a smoke run, not a measurement.**"]
    sections: list[tuple[str, list[str]]] = []
    if res.doctor:
        sections.append(("1. doctor (deep probe)", doctor_table(res.doctor)))
    if res.launch:
        sections.append(
            ("2. Launch latency (start → every rank's first line)", launch_table(res.launch))
        )
    if res.teardown:
        sections.append(("3. Teardown after a rank fails", teardown_table(res.teardown)))
    if res.nodeloss:
        sections.append(("4. Node loss", nodeloss_table(res.nodeloss)))
    if res.logs:
        sections.append(("5. Log throughput, one rank", log_table(res.logs)))
    if res.logs8:
        title = f"6. Log throughput, {res.logs8.hosts} hosts at once"
        sections.append((title, logs8_table(res.logs8)))
    if res.scale:
        title = f"7. Coordinator memory and threads at {res.scale.hosts} hosts"
        sections.append((title, scale_table(res.scale)))
    for title, body in sections:
        lines += ["", f"## {title}", "", *body]
    lines += [
        "",
        "Processes of the suite's runs alive 5 s after the last one ended (any "
        "`SSHDDP_RUN_ID=bench-*`): " + ("; ".join(res.leftovers) or "none") + ".",
    ]
    noisy = noisy_rows(res)
    if noisy:
        lines += [
            "",
            f"**Noisy:** max > 1.5x min in {', '.join(noisy)}; the machine was "
            "probably busy (other tests?) — compare medians only.",
        ]
    method = METHOD.format(
        reps=reps,
        td_hosts=TD_HOSTS,
        td_nproc=TD_NPROC,
        hb=f"{NL_HEARTBEAT_S:g}",
        mb=sizes.mb,
        l8_hosts=sizes.logs8_hosts,
        l8_mb=sizes.logs8_mb,
        scale=sizes.scale,
        launch_sizes=", ".join(map(str, sizes.launch)),
    )
    return "\n".join(lines) + "\n\n" + method


def noisy_rows(res: Results) -> list[str]:
    found = []
    for d in res.doctor:
        if d.sshddp.noisy or d.pdsh.noisy:
            found.append(f"doctor/{d.hosts}")
    for r in res.launch:
        if r.sshddp.noisy or r.pdsh.noisy or r.ssh.noisy:
            found.append(f"launch/{r.hosts}")
    if res.teardown and res.teardown.stage("gone").noisy:
        found.append("teardown/attached")
    if res.teardown and res.teardown.stage("gone", detached=True).noisy:
        found.append("teardown/detached")
    for how in ("kill", "stop"):
        if res.nodeloss and res.nodeloss.stage("gone", how).noisy:
            found.append(f"nodeloss/{how}")
    if res.logs and (res.logs.stage("total").noisy or res.logs.stage("cat").noisy):
        found.append("logs")
    if res.logs8 and (res.logs8.stage("total").noisy or res.logs8.stage("direct").noisy):
        found.append("logs8")
    if res.scale and res.scale.stage("rss_mb").noisy:
        found.append("scale")
    return found


# --------------------------------------------------------------------------- main


CASES = ("doctor", "launch", "teardown", "nodeloss", "logs", "logs8", "scale32")


def host_list(text: str) -> list[int]:
    sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    if not sizes or sizes[0] < 1 or sizes[-1] > 64:
        raise argparse.ArgumentTypeError(f"host counts between 1 and 64, got {text!r}")
    return sizes


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="Smaller sizes: doctor to 16 hosts, launch to 8, 100 MB of logs from one rank, "
        "10 MB per host from 8, the scale case at 16 hosts.",
    )
    p.add_argument("--reps", type=int, default=5, help="Repetitions per case (default 5).")
    p.add_argument("--out", metavar="FILE", help="Also write the report there.")
    p.add_argument(
        "--only",
        default=",".join(CASES),
        help=f"Comma-separated subset of {','.join(CASES)}.",
    )
    p.add_argument(
        "--sizes",
        type=host_list,
        metavar="N,N,..",
        help="Host counts of the doctor and launch cases (default 1,4,16,32 and 1,4,8,16).",
    )
    p.add_argument(
        "--logs-hosts", type=int, metavar="N", help="Hosts of the logs8 case (default 8)."
    )
    p.add_argument(
        "--scale-hosts", type=int, metavar="N", help="Hosts of the scale32 case (default 32)."
    )
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    unknown = set(args.only.split(",")) - set(CASES)
    if unknown:
        p.error(f"--only: unknown case(s) {', '.join(sorted(unknown))}")
    for opt in ("logs_hosts", "scale_hosts"):
        value = getattr(args, opt)
        if value is not None and not 1 <= value <= 64:
            p.error(f"--{opt.replace('_', '-')} must be between 1 and 64")
    return args


@dataclass(frozen=True)
class Sizes:
    """What each case runs at, from the command line."""

    only: frozenset[str]
    doctor: list[int]
    launch: list[int]
    mb: int  #: logs: MB from one rank
    logs8_hosts: int
    logs8_mb: int  #: logs8: MB per host
    scale: int

    @property
    def hosts(self) -> int:
        """sshd servers the cluster needs."""
        need = {
            "doctor": max(self.doctor),
            "launch": max(self.launch),
            "teardown": TD_HOSTS,
            "nodeloss": TD_HOSTS,
            "logs": 1,
            "logs8": self.logs8_hosts,
            "scale32": self.scale,
        }
        return max(need[case] for case in self.only)


def sizes_of(args: argparse.Namespace) -> Sizes:
    return Sizes(
        only=frozenset(args.only.split(",")),
        doctor=args.sizes or ([1, 4, 16] if args.quick else [1, 4, 16, 32]),
        launch=args.sizes or ([1, 4, 8] if args.quick else [1, 4, 8, 16]),
        mb=100 if args.quick else 200,
        logs8_hosts=args.logs_hosts or 8,
        logs8_mb=L8_MB // 2 if args.quick else L8_MB,
        scale=args.scale_hosts or (16 if args.quick else 32),
    )


def clean_env(tmp: Path) -> dict[str, str]:
    """This environment without the developer's agent or sshddp settings."""
    # PYTHONDONTWRITEBYTECODE: sshddp runs as installed, its modules' bytecode cached (pip
    # compiles it at install); without it every start compiles them again, ~20 ms.
    dropped = ("SSH_AUTH_SOCK", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSHDDP_") and k not in dropped}
    env.update(SSHDDP_STATE_DIR=str(tmp / "state"), NO_COLOR="1", PYTHONUNBUFFERED="1")
    return env


def sshddp_argv() -> list[str]:
    exe = Path(sys.executable).parent / "sshddp"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "sshddp"]


def run_all(b: Bench, sizes: Sizes, reps: int) -> Results:
    only = sizes.only
    res = Results()
    if "doctor" in only:
        res.doctor = bench_doctor(b, sizes.doctor, reps)
    if "launch" in only:
        res.launch = bench_launch(b, sizes.launch, reps)
    if "teardown" in only:
        res.teardown = bench_teardown(b, reps)
    if "nodeloss" in only:
        res.nodeloss = bench_nodeloss(b, reps)
    if "logs" in only:
        res.logs = bench_logs(b, sizes.mb, reps)
    if "logs8" in only:
        res.logs8 = bench_logs8(b, sizes.logs8_hosts, sizes.logs8_mb, reps)
    if "scale32" in only:
        res.scale = bench_scale(b, sizes.scale, reps)
    return res


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    compileall.compile_dir(Path(sshddp.__file__).parent, quiet=1)  # as pip install leaves it
    sizes = sizes_of(args)
    info = machine()
    hosts = sizes.hosts
    with tempfile.TemporaryDirectory(prefix="sshddp-bench-") as tmpdir:
        tmp = Path(tmpdir)
        rank = tmp / "rank.py"
        rank.write_text(RANK_SCRIPT)
        started = time.monotonic()
        first = free_octet(hosts)
        with SshdCluster(tmp / "sshd", hosts, port=SSHD_PORT, first_octet=first) as cluster:
            bench = Bench(tmp, cluster, clean_env(tmp), sshddp_argv(), rank)
            res = run_all(bench, sizes, args.reps)
            res.leftovers = reap_leftovers()
        info.append(("hosts", f"{hosts} sshd on 127.0.0.{first + 1}–{first + hosts}:{SSHD_PORT}"))
        elapsed = time.monotonic() - started
    info.append(("load average at end", " / ".join(f"{x:.2f}" for x in os.getloadavg())))
    info.append(("suite duration", f"{elapsed:.0f} s"))
    cmd = shlex.join([".venv/bin/python", "scripts/bench.py", *(argv or sys.argv[1:])])
    report = render(res, args.reps, sizes, info, cmd)
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What every case shares: statistics, watched commands, /proc scans, pollers and ``Bench``.

``Bench`` is the suite's context: the temporary directory, the real sshd cluster on
loopback (``sshddp_lab.sshd``), fresh rendezvous ports and run names, inventories, and the
command lines of sshddp and pdsh. ``Watched`` runs one command and records its stdout
lines with their arrival times, its CPU, peak RSS and threads. The pollers watch what a run
does from outside: its ranks' READY lines, its processes in /proc, its log files' sizes.
Every "host" is this machine, so a run's processes on every host are found in this /proc,
told apart by their environment (``SSHDDP_RUN_ID``, ``SSHDDP_NODE_RANK``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import re
import resource
import shlex
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

from sshddp_bench.rank import RANK_SCRIPT
from sshddp_lab.sshd import MAX_HOSTS, SshdCluster

# Hosts on 127.0.0.201.., clear of the test suite's .41.. and .101..; another run of this
# suite going on at the same time moves this one to the next free range.
FIRST_OCTETS = (200, 160, 60)
SSHD_PORT = 2222
WIDE_SUBNET = "127.1"  # a cluster of more than MAX_HOSTS hosts: 127.1.x.y
# Rendezvous ports: below the ephemeral range (32768+), clear of the tests' 10000-21000,
# the lab's sshd ports (22000-28000) and its slurmctld ports (29000-31000).
PORTS = range(31000, 32760)
FANOUT = 32  # sshddp's default --fanout; pdsh gets the same -f
POLL_S = 0.01  # /proc and log-size polling period
RUN_TIMEOUT_S = 180.0
# Every run name of this suite starts with it: leftovers are found (and killed) by it, so
# another suite running on the same machine at the same time never loses its processes.
# (No dash after "bench": older suites reap every run named bench-*.)
RUN_PREFIX = f"bench{os.getpid():x}-"


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
        """``median (min–max)``, each value times ``scale``."""
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


def paired(ours: Sequence[float], theirs: Sequence[float]) -> Stat:
    """Each repetition's difference ``ours[i] - theirs[i]``: the two ran back to back, so a
    slow moment of the machine shows in both and mostly cancels."""
    return Stat(tuple(a - b for a, b in zip(ours, theirs, strict=True)))


def order(methods: Sequence[str], rep: int) -> tuple[str, ...]:
    """The order the methods run in repetition ``rep``: a rotation, and the next repetition
    that rotation reversed, so every two repetitions run each pair of methods once each way
    round (a plain rotation of three runs the first before the second in two repetitions of
    three, and a machine that slows from one run to the next would favour it)."""
    k = (rep // 2) % len(methods)
    turn = tuple(methods[k:]) + tuple(methods[:k])
    return turn[::-1] if rep % 2 else turn


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median: the order statistics ``x(k)`` and
    ``x(n+1-k)`` with the largest ``k`` whose binomial tail leaves at least ``level``
    covered, and the coverage they reach. Too few values for ``level`` (5 reach 94%): the
    whole range and its coverage."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan"), 0.0

    def covered(k: int) -> float:  # 1 - 2 P(Binomial(n, 1/2) <= k - 1)
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k < n // 2 and covered(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], covered(k)


PAIRED = (
    "*Paired*: the two methods ran back to back in each repetition (each first in about half "
    "of them); the median of the per-repetition differences, and the order statistics "
    "around it that cover the true median with the probability shown (distribution-free: "
    "binomial), so a slow moment of the machine, which delays both, mostly cancels. The "
    "paired cell says met only when the whole interval is within the target."
)


def interval_cell(diffs: Stat, target: float) -> str:
    """``+0.31 [+0.12, +0.48] 96%``: the paired median, its interval and the interval's
    coverage; ``met`` when the whole interval is within ``target``, else how far it reaches."""
    lo, hi, covered = median_interval(diffs.values)
    cell = f"{diffs.median:+.2f} [{lo:+.2f}, {hi:+.2f}] {covered:.0%}"
    return f"{cell}: {verdict(hi <= target, f'reaches {hi - target:+.2f} s past it')}"


def verdict(ok: bool, miss: str) -> str:
    """A target's cell: met, or missed and by how much."""
    return "met" if ok else f"**missed**: {miss}"


def progress(text: str) -> None:
    """One line on stderr while the suite runs; the report goes to stdout."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


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
        stdout_to: Optional[IO[bytes]] = None,
    ) -> None:
        """``stdout_null``: its stdout to /dev/null; ``stdout_to``: to that file; either way
        no line is watched."""
        self.argv = list(argv)
        self.on_line = on_line
        self.timeout = timeout
        self.lines: list[tuple[float, str]] = []
        self.done = threading.Event()
        self.timed_out = False
        self.end = 0.0
        self._err: IO[bytes] = tempfile.TemporaryFile()
        self._rusage: Optional[resource.struct_rusage] = None
        self._hwm_kb = 0
        self._nthreads = 0
        self.t0 = time.perf_counter()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stderr=self._err,
            env=env,
            cwd=cwd,
            stdout=stdout_to or (subprocess.DEVNULL if stdout_null else subprocess.PIPE),
            start_new_session=True,  # its own group: a timeout kills it and its children
        )
        self._threads = [
            threading.Thread(target=self._wait, daemon=True),
            threading.Thread(target=self._watch_rss, daemon=True),
        ]
        if not stdout_null and stdout_to is None:
            self._threads.append(threading.Thread(target=self._read, daemon=True))
        for t in self._threads:
            t.start()
        self._timer = threading.Timer(timeout, self._kill)
        self._timer.start()

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
        # wait4, not Popen.wait: its rusage is the CPU of the command and its reaped children.
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
        """Waits for the command's exit and its readers; raises if it timed out."""
        for t in self._threads:
            t.join()
        self._timer.cancel()
        self._err.seek(0)
        err = self._err.read().decode("utf-8", "replace")
        self._err.close()
        if self.timed_out:
            raise BenchError(f"timed out after {self.timeout:.0f} s: {shlex.join(self.argv)}")
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
    """``done``, or a BenchError with its output's tail when it exited with another status."""
    if done.rc != rc:
        out = "\n".join(text for _, text in done.lines[-15:])
        raise BenchError(
            f"{what}: exit status {done.rc}, expected {rc}\nstdout:\n{out}\nstderr:\n"
            f"{done.stderr[-3000:]}"
        )
    return done


def free(port: int, addr: str = "") -> bool:
    """Nothing listens on ``addr:port``; connections of an earlier suite in TIME_WAIT do not
    count: sshd binds with SO_REUSEADDR, as this does."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


# --------------------------------------------------------------------------- /proc


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


def carries(pid: int, needle: bytes) -> bool:
    """Whether process ``pid`` is alive with ``needle`` in its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:
        return False


def kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _suite_processes() -> dict[int, str]:
    """Pid -> command line of every process whose environment has a run id of this suite."""
    needle = f"SSHDDP_RUN_ID={RUN_PREFIX}".encode()
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{entry}/environ").read_bytes()
            if any(item.startswith(needle) for item in env.split(b"\0")):
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                found[int(entry)] = cmd.decode("utf-8", "replace").strip()[:120]
    return found


def reap_leftovers() -> list[str]:
    """Processes of this suite's runs still alive 5 s after the last run (then killed)."""
    deadline = time.monotonic() + 5
    while True:
        left = _suite_processes()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kill_pids(list(left))  # started by this suite's runs, found by their run id
    return [f"pid {pid}: `{cmd}`" for pid, cmd in left.items()]


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
        handed out before in this run. Drawn below Linux's ephemeral range (32768+, where
        this suite's own ssh connections get their local ports and could take P + 1 between
        the pick and the run's preflight), in ``PORTS``."""
        for _ in range(4000):
            port = random.randrange(PORTS.start, PORTS.stop, 2)
            pair = {port, port + 1}
            if not pair & (self.used_ports | {SSHD_PORT}) and free(port) and free(port + 1):
                self.used_ports |= pair
                return port
        raise BenchError(f"no free pair of TCP ports in {PORTS.start}-{PORTS.stop - 1}")

    def name(self, kind: str) -> str:
        """A run name unique in this suite; its prefix (``RUN_PREFIX``) finds leftovers."""
        return f"{RUN_PREFIX}{kind}-{next(self.counter)}"

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
        stdout_to: Optional[IO[bytes]] = None,
    ) -> Watched:
        return Watched(argv, self.env, self.tmp, on_line, stdout_null, stdout_to=stdout_to)

    def launch_argv(
        self, name: str, port: int, inv: Path, *rank_args: str, options: Sequence[str] = ()
    ) -> list[str]:
        """``sshddp launch`` of the rank script on ``inv``; ``options`` go before it."""
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

    def describe_hosts(self) -> str:
        """The report's *hosts* line: how many sshd servers, on which addresses."""
        hosts = self.cluster.hosts
        last = hosts[-1].addr.rsplit(".", 1)[1]
        return f"{len(hosts)} sshd on {hosts[0].addr}–{last}:{SSHD_PORT}"


def clean_env(tmp: Path) -> dict[str, str]:
    """This environment without the developer's agent or sshddp settings."""
    # PYTHONDONTWRITEBYTECODE: sshddp runs as installed, its modules' bytecode cached (pip
    # compiles it at install); without it every start compiles them again, ~20 ms.
    dropped = ("SSH_AUTH_SOCK", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSHDDP_") and k not in dropped}
    env.update(SSHDDP_STATE_DIR=str(tmp / "state"), NO_COLOR="1", PYTHONUNBUFFERED="1")
    return env


def sshddp_argv() -> list[str]:
    """The venv's ``sshddp`` entry point, as a user runs it (``python -m`` if absent)."""
    exe = Path(sys.executable).parent / "sshddp"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "sshddp"]


@contextlib.contextmanager
def running_bench(hosts: int) -> Iterator[Bench]:
    """A temporary directory holding the rank script and a cluster of ``hosts`` sshd
    servers; both are gone when the block ends."""
    with tempfile.TemporaryDirectory(prefix="sshddp-bench-") as tmpdir:
        tmp = Path(tmpdir)
        rank = tmp / "rank.py"
        rank.write_text(RANK_SCRIPT)
        where: dict[str, Any] = {"subnet": WIDE_SUBNET} if hosts > MAX_HOSTS else {}
        if not where:
            where["first_octet"] = free_octet(hosts)
        with SshdCluster(tmp / "sshd", hosts, port=SSHD_PORT, **where) as cluster:
            yield Bench(tmp, cluster, clean_env(tmp), sshddp_argv(), rank)


# --------------------------------------------------------------------------- pollers


class ReadyWatch:
    """Records when every rank has printed READY (and when a rank printed FAIL)."""

    def __init__(self, world: int, on_all: Optional[Callable[[], None]] = None) -> None:
        self.world = world
        self.ranks: set[int] = set()
        self.all_at: Optional[float] = None
        self.fail_ts: Optional[float] = None
        self.on_all = on_all

    def __call__(self, now: float, text: str) -> None:
        # Every READY of the line: two ranks printing at one instant through torchrun's
        # shared stdout can land on one line ("READY 0 <t>READY 1 <t>").
        for ready in re.finditer(r"READY (\d+) ", text):
            if self.all_at is not None:
                break
            self.ranks.add(int(ready.group(1)))
            if len(self.ranks) == self.world:
                self.all_at = now
                if self.on_all is not None:
                    self.on_all()
        fail = re.search(r"FAIL (\d+\.\d+)", text)
        if fail:
            self.fail_ts = float(fail.group(1))


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
        """Wait for the run to be gone; one never started (what was to start it never
        came) leaves ``gone_at`` None, for the caller to report."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        self._stop.set()


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


# --------------------------------------------------------------------------- a run's files


def run_dir(b: Bench, name: str, node: int) -> Path:
    """Node ``node``'s run directory on its host (every host's workdir is on this disk)."""
    return b.tmp / "work" / name / "runs" / name / f"n{node}"


def node_ended(rundir: Path) -> float:
    """When the node's supervisor recorded its end (exit.json), torchrun gone."""
    return float(json.loads((rundir / "exit.json").read_text())["ended"])


def stamp(text: str, word: str) -> float:
    """The time on the first ``WORD <time>`` line of ``text``."""
    found = re.search(rf"{word} (\d+\.\d+)", text)
    if not found:
        raise BenchError(f"no {word} line in the log")
    return float(found.group(1))


def read_tail(path: Path) -> str:
    """The last 4 KiB of a file, where a flood's END line is."""
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - 4096))
        return fh.read().decode("utf-8", "replace")


def wait_logs(
    b: Bench, name: str, nodes: int, word: str, count: int, timeout: float = 90.0
) -> None:
    """Until the ``nodes`` nodes' ``node.log`` files on the hosts hold ``count`` lines
    starting with ``word`` (read every 20 ms; they are a few lines long)."""
    logs = [run_dir(b, name, i) / "node.log" for i in range(nodes)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = 0
        for log in logs:
            with contextlib.suppress(OSError):
                seen += sum(line.startswith(word) for line in log.read_text().splitlines())
        if seen >= count:
            return
        time.sleep(0.02)
    sup = [(run_dir(b, name, i) / "supervisor.log") for i in range(nodes)]
    tails = "\n".join(p.read_text()[-800:] for p in sup if p.exists())
    kill_pids(run_pids("SSHDDP_RUN_ID", name))  # a detached run of this suite, by its id
    raise BenchError(f"{name}: fewer than {count} {word} lines after {timeout:.0f} s\n{tails}")

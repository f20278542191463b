"""A real Slurm cluster on this machine: one controller, N compute nodes in namespaces.

``SlurmCluster`` runs Debian's own daemons (Slurm 22.05, MUNGE 0.5) with nothing mocked:

* ``munged`` with a generated key and its own socket under the base directory, so it never
  touches a system munge (``AuthInfo=socket=...`` points Slurm at it);
* ``slurmctld`` in the root namespace, reached at the bridge address of a ``Netns`` on a
  port picked free on every address (it binds them all), so clusters can run side by side;
* ``slurmd -N nodeI`` inside namespace ``I``, reached at ``10.A.B.I``, each with its own
  spool directory, pid file and log (``%n`` in ``slurm.conf`` expands to the node name);
* optionally an sshd inside every node's namespace, whose ``ssh_config`` names each host
  by its Slurm node name, so a test reaches the same node over SSH and over ``srun``.

There is no accounting database and no cgroup: ``proctrack/linuxproc`` and ``task/none``,
and each slurmd sees an empty tmpfs as /sys/fs/cgroup (see ``_HIDE_CGROUPS``).
Every node claims ``cpus`` CPUs (``SlurmdParameters=config_overrides``), more than this
machine has, so a job of 3 nodes x 2 tasks runs on a 2-core test machine. With ``gpus=N``
every node also has N GPUs as GRES (``gpu:N``): their device files are character devices
like ``/dev/null`` under the base directory, so Slurm allocates them, numbers them and sets
``CUDA_VISIBLE_DEVICES`` in job steps as on a GPU node, and nothing can use them.

``close()`` cancels every job, stops the daemons it started, SIGKILLs whatever still lives
in its namespaces (job steps, tasks, ssh sessions) and removes the network; it never
looks a process up by name. ``processes()`` lists whatever of the cluster is alive, so a
test can check that nothing is left.

Needs root (network namespaces, ``SlurmUser=root``). Imports only the standard library
and the lab, never pytest, so benchmarks can use it too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sshddp_lab.netns import Netns, NetnsCluster, NetnsError
from sshddp_lab.sshd import SshHost, _parent_death_signal, _start_time, _zombie

START_TIMEOUT_S = 60.0  # munged, slurmctld, every slurmd up and every node idle
STOP_TIMEOUT_S = 10.0  # per daemon, SIGTERM then SIGKILL
CANCEL_TIMEOUT_S = 10.0  # jobs cancelled at close() before the daemons stop
COMMAND_TIMEOUT_S = 30.0  # a client command (sinfo, scancel, ...) run by the lab
SLURMD_PORT = 6818  # inside each node's namespace, so never taken by anyone else
#: clear of the sshd clusters (22000-28000), of torch's default rendezvous port and of
#: --port auto's pairs above it (29500-29700), and of the ephemeral range (32768+)
CTLD_PORTS = range(30000, 32000)
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the NUL
# slurmstepd's socket: <spool>/<node>_<jobid>.<stepid>, ids up to 10 digits each.
STEPD_SOCKET_TAIL = len("/_4294967294.4294967294")
LOG_TAIL_LINES = 40
REQUIRED_BINARIES = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "ip": "iproute2",
}

# slurmd 22.05 loads a cgroup plugin whatever slurm.conf says, and fails without a cgroup
# filesystem (`ip netns exec` remounts /sys, hiding it) or, on a cgroup v2 host without
# systemd, without D-Bus. So each slurmd gets an empty tmpfs on /sys/fs/cgroup, in the
# mount namespace `ip netns exec` made for it alone, and cgroup.conf names cgroup/v1: the
# plugin loads, no plugin of ours uses it, and the machine's cgroups are never touched.
_HIDE_CGROUPS = 'mount -t tmpfs -o size=64k,mode=755 none /sys/fs/cgroup && exec "$@"'

_LIVE: set[SlurmCluster] = set()
_LIVE_LOCK = threading.Lock()


class SlurmClusterError(RuntimeError):
    """The cluster could not be set up, brought up or torn down."""


@dataclass(frozen=True)
class SlurmNode:
    """One compute node, as Slurm, SSH and the network see it."""

    index: int  #: 1-based, also the last octet of ``addr`` and the namespace's number
    name: str  #: Slurm ``NodeName`` and ssh_config ``Host``, e.g. ``"node2"``
    addr: str  #: ``NodeAddr``: the node's ``eth0`` address in its namespace
    netns: str  #: name of its network namespace (``ip netns exec NAME ...``)


@dataclass
class _Daemon:
    """A daemon this cluster started: its process and where its output goes."""

    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    logs: tuple[Path, ...]


class SlurmCluster:
    """``n`` slurmd nodes ``node1..nodeN`` in namespaces, one slurmctld, one munged."""

    def __init__(
        self,
        base: Path,
        n: int = 3,
        *,
        cpus: int = 4,
        ssh: bool = False,
        partition: str = "debug",
        gpus: int = 0,
    ) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"n must be between 1 and 200, got {n}")
        if cpus < 1:
            raise ValueError(f"cpus must be positive, got {cpus}")
        if not 0 <= gpus <= 16:
            raise ValueError(f"gpus must be between 0 and 16, got {gpus}")
        self.gpus = gpus
        self.base = Path(base).resolve()
        self.n = n
        self.cpus = cpus
        self.partition = partition
        self.with_ssh = ssh
        self.cluster_name = f"lab{os.getpid() % 100000}x{random.randrange(1000)}"
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.net: Netns | None = None
        self.nodes: list[SlurmNode] = []
        self.ssh: NetnsCluster | None = None
        self.ctld_addr = ""
        self.ctld_port = 0
        self._daemons: list[_Daemon] = []
        self._known: dict[int, str] = {}  # pid -> start time: daemons and descendants
        self._netns_inodes: set[int] = set()

    # ------------------------------------------------------------------ paths
    def node(self, i: int) -> SlurmNode:
        """Node ``i`` (1-based)."""
        if not 1 <= i <= len(self.nodes):
            raise IndexError(f"no node {i}; the cluster has nodes 1..{len(self.nodes)}")
        return self.nodes[i - 1]

    def node_dir(self, name: str) -> Path:
        """Spool, pid file and log of node ``name`` (``%n`` in slurm.conf)."""
        return self.base / name

    @property
    def ssh_config(self) -> Path:
        """ssh_config whose ``Host`` names are the node names (needs ``ssh=True``)."""
        if self.ssh is None:
            raise SlurmClusterError("this SlurmCluster was made without ssh=True")
        return self.ssh.ssh_config

    @property
    def nodelist(self) -> list[str]:
        return [node.name for node in self.nodes]

    # ---------------------------------------------------------- environment
    def env(self) -> dict[str, str]:
        """What a client command (sinfo, srun, ...) needs in its environment.

        slurm.conf names the munge socket (``AuthInfo=socket=...``), so ``SLURM_CONF`` is
        all: libslurm reaches our munged through it, never the system one.
        """
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) without inherited ``SLURM_*``, plus ``env()``.

        A variable of an outer allocation (``SLURM_JOB_ID``, ...) would otherwise make a
        client command act on a job of another cluster.
        """
        source = os.environ if base is None else base
        env = {k: v for k, v in source.items() if not k.startswith("SLURM_")}
        env.update(self.env())
        return env

    def run(
        self, argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command against this cluster; its output captured as text."""
        return subprocess.run(
            list(argv),
            env=self.client_env(),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        """Bring up munged, slurmctld and every slurmd; return once every node is idle.

        Bounded by ``START_TIMEOUT_S``; on any failure everything started is torn down
        and the error carries the daemons' logs.
        """
        if self._daemons:
            return
        _check_prerequisites()
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            self._setup_network()
            self._write_files()
            self._start_munged(deadline)
            self._start_slurmctld(deadline)
            self._start_slurmds()
            self._wait_nodes_idle(deadline)
            if self.with_ssh:
                self._start_sshd()
        except BaseException:
            self.close()
            raise

    def _setup_network(self) -> None:
        try:
            net = Netns(self.n)
            self.net = net
            net.setup()
        except NetnsError as exc:
            raise SlurmClusterError(f"cannot build the Slurm test network: {exc}") from exc
        self.nodes = [
            SlurmNode(i, f"node{i}", net.addr(i), net.netns(i)) for i in range(1, self.n + 1)
        ]
        self._netns_inodes = {os.stat(f"/run/netns/{node.netns}").st_ino for node in self.nodes}
        self.ctld_addr = f"{net.subnet}.254"  # the bridge, in the root namespace
        self.ctld_port = _free_port(CTLD_PORTS)

    def _write_files(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        _check_socket_paths(self.munge_socket, [self._spool(n.name) for n in self.nodes])
        for sub in ("munge", "ctld/state"):
            (self.base / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        for node in self.nodes:
            self._spool(node.name).mkdir(mode=0o755, parents=True, exist_ok=True)
        key = self.base / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (self.base / "plugstack.conf").write_text("")  # no SPANK plugin of the machine's
        # Read from slurm.conf's directory; see _HIDE_CGROUPS.
        (self.base / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        self._write_gres()
        self.conf.write_text(self.render_conf())

    def _write_gres(self) -> None:
        """gres.conf naming ``gpus`` device files per node (see the module docstring)."""
        if not self.gpus:
            return
        dev = self.base / "dev"
        dev.mkdir(mode=0o755, exist_ok=True)
        for i in range(self.gpus):
            path = dev / f"gpu{i}"
            if not path.exists():  # a character device like /dev/null (1, 3)
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (self.base / "gres.conf").write_text(f"Name=gpu File={dev}/gpu[0-{self.gpus - 1}]\n")

    def _spool(self, name: str) -> Path:
        return self.node_dir(name) / "spool"

    def render_conf(self) -> str:
        """slurm.conf text: every path under ``base``, every daemon as root."""
        host = socket.gethostname().split(".")[0]  # slurmctld must find itself by name
        base = self.base
        lines = [
            f"ClusterName={self.cluster_name}",
            # The name must be this machine's: slurmctld matches it against gethostname.
            f"SlurmctldHost={host}({self.ctld_addr})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={SLURMD_PORT}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={base}/ctld/state",
            f"SlurmctldPidFile={base}/ctld/slurmctld.pid",
            f"SlurmctldLogFile={base}/ctld/slurmctld.log",
            f"SlurmdSpoolDir={base}/%n/spool",
            f"SlurmdPidFile={base}/%n/slurmd.pid",
            f"SlurmdLogFile={base}/%n/slurmd.log",
            f"PlugStackConfig={base}/plugstack.conf",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # Nodes claim more CPUs than the machine has; trust slurm.conf, not hwloc.
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=60",
            "MessageTimeout=10",
            "SlurmdTimeout=60",
            "SlurmctldTimeout=60",
            "UnkillableStepTimeout=30",
            "TmpFS=/tmp",
        ]
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        lines += ["GresTypes=gpu"] if self.gpus else []
        lines += [
            f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={n.name} "
            f"CPUs={self.cpus} RealMemory=1000{gres} State=UNKNOWN"
            for n in self.nodes
        ]
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.nodelist)} "
            "Default=YES MaxTime=INFINITE State=UP"
        )
        return "".join(line + "\n" for line in lines)

    def _spawn(self, name: str, argv: list[str], out: Path, *logs: Path) -> _Daemon:
        with open(out, "ab") as sink:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches only the test
                preexec_fn=_parent_death_signal(),
            )
        daemon = _Daemon(name, argv, proc, (out, *logs))
        self._daemons.append(daemon)
        self._remember([proc.pid])
        return daemon

    def _start_munged(self, deadline: float) -> None:
        d = self.base / "munge"
        argv = [
            "munged",
            "--foreground",
            # Our base directory may sit under a 0700 tmp dir; every client is root.
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={d / 'munge.key'}",
            f"--pid-file={d / 'munged.pid'}",
            f"--seed-file={d / 'munged.seed'}",
            "--num-threads=4",
        ]
        daemon = self._spawn("munged", argv, d / "munged.log")  # --foreground: stderr
        probe = ["munge", "-n", "-S", str(self.munge_socket)]
        self._wait(daemon, deadline, lambda: _succeeds(probe), "answer a `munge -n`")

    def _start_slurmctld(self, deadline: float) -> None:
        d = self.base / "ctld"
        argv = ["slurmctld", "-D", "-i", "-f", str(self.conf)]
        daemon = self._spawn("slurmctld", argv, d / "slurmctld.out", d / "slurmctld.log")

        def up() -> bool:
            return "is UP" in self.run(["scontrol", "ping"], timeout=10).stdout

        self._wait(daemon, deadline, up, f"answer on {self.ctld_addr}:{self.ctld_port}")

    def _start_slurmds(self) -> None:
        for node in self.nodes:
            d = self.node_dir(node.name)
            slurmd = ["slurmd", "-D", "-N", node.name, "-f", str(self.conf)]
            argv = ["ip", "netns", "exec", node.netns, "sh", "-c", _HIDE_CGROUPS, "sh"]
            argv += slurmd  # sh execs it: the pid we hold is slurmd's
            self._spawn(f"slurmd {node.name}", argv, d / "slurmd.out", d / "slurmd.log")

    def _wait_nodes_idle(self, deadline: float) -> None:
        def idle() -> bool:
            for daemon in self._daemons:
                if daemon.proc.poll() is not None:
                    raise SlurmClusterError(self._failure(daemon, "exited"))
            return self.node_states() == {name: "idle" for name in self.nodelist}

        _poll(idle, deadline)
        if not idle():
            states = self.node_states()
            raise SlurmClusterError(
                f"nodes not idle within {START_TIMEOUT_S:.0f}s: {states}\n\n"
                + "\n\n".join(self._log_report(d) for d in self._daemons)
            )

    def _start_sshd(self) -> None:
        assert self.net is not None
        self.ssh = _NodeSshd(self.base / "ssh", self.net, self.nodelist)
        self.ssh.start()

    def _wait(self, daemon: _Daemon, deadline: float, ready: Callable[[], bool], what: str) -> None:
        def check() -> bool:
            if daemon.proc.poll() is not None:
                raise SlurmClusterError(
                    self._failure(daemon, f"exited with status {daemon.proc.returncode}")
                )
            return ready()

        _poll(check, deadline)
        if not check():
            raise SlurmClusterError(
                self._failure(daemon, f"did not {what} within {START_TIMEOUT_S:.0f}s")
            )

    def _failure(self, daemon: _Daemon, what: str) -> str:
        return f"{daemon.name} (pid {daemon.proc.pid}) {what}\n{self._log_report(daemon)}"

    def _log_report(self, daemon: _Daemon) -> str:
        parts = [f"command: {' '.join(daemon.argv)}"]
        for log in daemon.logs:
            parts.append(f"--- {log}:\n{_tail(log) or '(empty)'}")
        return "\n".join(parts)

    # ---------------------------------------------------------------- state
    def node_states(self) -> dict[str, str]:
        """``{node name: Slurm state}`` as sinfo prints it (``idle``, ``alloc``, ...)."""
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
        states = {}
        for line in proc.stdout.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip()
        return states

    def job_ids(self) -> list[str]:
        """Ids of every job the controller has not forgotten (pending, running, ending)."""
        proc = self.run(["squeue", "-h", "-o", "%A"], timeout=10)
        return proc.stdout.split() if proc.returncode == 0 else []

    def netns_inode(self, i: int) -> int:
        """Inode of node ``i``'s network namespace, as ``/proc/PID/ns/net`` shows it."""
        return os.stat(f"/run/netns/{self.node(i).netns}").st_ino

    def processes(self) -> list[tuple[int, str]]:
        """(pid, cmdline) of every live process of this cluster.

        A process belongs to it when it runs in one of its namespaces (slurmd, job
        steps, tasks, sshd and its sessions), is a daemon it started or a descendant of
        one (slurmctld's ``slurmscriptd``, which renames itself), or names the base
        directory on its command line. Namespaces are known by inode and descendants
        by (pid, start time), so this works after ``close()`` too.
        """
        table = _process_table()
        self._remember(_descendants(table, self._live_known()))
        known = self._live_known()
        marker = (str(self.base) + "/").encode()
        found = []
        for pid, (_, cmdline) in table.items():
            ours = pid in known or _netns_of(pid) in self._netns_inodes or marker in cmdline
            if ours and not _zombie(pid):
                found.append((pid, _words(cmdline)))
        return sorted(found)

    def job_processes(self) -> list[tuple[int, str]]:
        """Processes of jobs on the nodes: slurmstepd and whatever a step started."""
        return [
            (pid, cmd)
            for pid, cmd in self.processes()
            if _netns_of(pid) in self._netns_inodes
            and (_is_slurmstepd(pid) or _has_env(pid, b"SLURM_JOB_ID="))
        ]

    def _remember(self, pids: Iterable[int]) -> None:
        for pid in pids:
            start = _start_time(pid)
            if start is not None:
                self._known[pid] = start

    def _live_known(self) -> set[int]:
        return {pid for pid, start in self._known.items() if _start_time(pid) == start}

    # ---------------------------------------------------------------- close
    def close(self) -> None:
        """Cancel every job, stop every daemon, kill what is left, remove the network.

        Idempotent, and safe after a failed ``start()``.
        """
        try:
            self._cancel_jobs()
            if self.ssh is not None:
                self.ssh.close()
                self.ssh = None
            self._stop_daemons()
            if self.net is not None:
                self.net.close()
                self.net = None
            self._kill_leftovers()
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def _cancel_jobs(self) -> None:
        """Let slurmctld end jobs first, so clients such as ``srun`` are told and exit."""
        if not any(d.name == "slurmctld" and d.proc.poll() is None for d in self._daemons):
            return
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            jobs = self.job_ids()
            if jobs:
                self.run(["scancel", *jobs], timeout=10)
                deadline = time.monotonic() + CANCEL_TIMEOUT_S
                _poll(lambda: not self.job_ids() and not self.job_processes(), deadline)

    def _stop_daemons(self) -> None:
        """slurmds, then whatever is left on the nodes, then slurmctld, munged last."""
        self._remember(_descendants(_process_table(), self._live_known()))
        daemons, self._daemons = self._daemons, []
        _terminate_all([d.proc for d in daemons if d.name.startswith("slurmd ")])
        if self.net is not None:
            self.net.kill_all()  # job steps and tasks outlive their slurmd
        for name in ("slurmctld", "munged"):
            _terminate_all([d.proc for d in daemons if d.name == name])
        for pid in self._live_known():  # e.g. a slurmscriptd its slurmctld left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _kill_leftovers(self) -> None:
        """SIGKILL anything still in our namespaces once they are deleted: all ours."""
        for _ in range(50):
            left = [pid for pid, _ in self.processes() if _netns_of(pid) in self._netns_inodes]
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NodeSshd(NetnsCluster):
    """sshd in every node's namespace, its ssh_config ``Host`` named after the node."""

    def __init__(self, base: Path, net: Netns, names: list[str]) -> None:
        super().__init__(base, net)
        self.hosts = [SshHost(h.index, names[h.index - 1], h.addr, h.port) for h in self.hosts]


def _check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise SlurmClusterError(
            "the Slurm test cluster needs root: slurmd runs in network namespaces "
            "(CAP_NET_ADMIN) and as SlurmUser=root; CI runs as root. Run the tests as "
            "root, e.g. `sudo bash .ci/run`"
        )
    missing = sorted({pkg for exe, pkg in REQUIRED_BINARIES.items() if not shutil.which(exe)})
    if missing:
        raise SlurmClusterError(
            f"missing packages for the Slurm test cluster: {' '.join(missing)}; install "
            f"them with `apt-get install {' '.join(missing)}` (.ci/run does)"
        )


def _check_socket_paths(munge_socket: Path, spools: Iterable[Path]) -> None:
    """Unix socket paths are capped at 107 bytes: refuse a base dir too deep for them."""
    too_long = [str(munge_socket)] if len(str(munge_socket)) > UNIX_PATH_MAX else []
    too_long += [str(s) for s in spools if len(str(s)) + STEPD_SOCKET_TAIL > UNIX_PATH_MAX]
    if too_long:
        raise SlurmClusterError(
            f"base directory too deep: unix sockets under {too_long[0]} would exceed "
            f"{UNIX_PATH_MAX} bytes; use a shorter base path"
        )


def _free_port(ports: range) -> int:
    """A TCP port free on every address (slurmctld binds them all)."""
    candidates = list(ports)
    random.shuffle(candidates)
    for port in candidates[:500]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise SlurmClusterError(f"no free TCP port in {ports.start}-{ports.stop - 1}")


def _poll(ready: Callable[[], bool], deadline: float, interval: float = 0.1) -> None:
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(interval)


def _succeeds(argv: list[str]) -> bool:
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _terminate_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM them all, then wait for each; SIGKILL one that outlives the grace."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _netns_of(pid: int) -> int | None:
    """Inode of ``pid``'s network namespace, or None once it has exited."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return int(link.partition("[")[2].rstrip("]"))


def _words(cmdline: bytes) -> str:
    return cmdline.replace(b"\0", b" ").decode(errors="replace").strip()


def _process_table() -> dict[int, tuple[int, bytes]]:
    """``{pid: (ppid, cmdline)}`` of every process but this one."""
    me = os.getpid()
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        table[int(entry.name)] = (ppid, cmdline)
    return table


def _descendants(table: Mapping[int, tuple[int, bytes]], roots: set[int]) -> set[int]:
    """``roots`` and every process below them, by parent pid at the time of ``table``."""
    found = {pid for pid in roots if pid in table}
    grew = True
    while grew:
        new = {pid for pid, (ppid, _) in table.items() if ppid in found and pid not in found}
        found |= new
        grew = bool(new)
    return found


def _is_slurmstepd(pid: int) -> bool:
    """By executable: Debian installs it as ``slurmstepd-wlm`` behind an alternative."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("slurmstepd")
    except OSError:
        return False


def _has_env(pid: int, prefix: bytes) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return any(item.startswith(prefix) for item in environ.split(b"\0"))


@atexit.register
def _close_all() -> None:
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        cluster.close()


if __name__ == "__main__":  # manual debugging: python -m sshddp_lab.slurm DIR [N]
    import sys

    with SlurmCluster(
        Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3, ssh=True
    ) as c:
        print(f"{c.n} nodes idle; try: SLURM_CONF={c.conf} srun -N{c.n} hostname -I")
        print(f"                  ssh -F {c.ssh_config} node1 hostname -I  (Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()

"""Real OpenSSH servers on loopback addresses, for integration tests and benchmarks.

``SshdCluster`` owns a base directory holding host keys, client keys, one
``sshd_config`` per host, an ``ssh_config`` with one ``Host hN`` alias per server and
a matching ``known_hosts``. Host ``i`` (1-based) listens on ``127.0.0.{first_octet+i}``
so every "machine" has its own address, as in a real cluster; a cluster given a ``subnet``
(``"127.1"``: up to 256 hosts, past what one /24 holds beside the test workers' slices)
listens on ``127.1.{(i-1)//250}.{(i-1)%250+1}`` instead. There are no SSH mocks.

This module imports only the standard library (plus PyYAML, a project dependency, for
``inventory_yaml``) and never pytest, so benchmark scripts can use it too.

Facts about OpenSSH 9.x that the defaults encode:

* sshd takes the *first* value of most keywords and honours only the first ``SetEnv``
  line, so ``extra_config`` lines replace the default line of the same keyword and all
  ``SetEnv`` lines are merged into one directive.
* By default every host gets its own ``HOME`` (``SetEnv HOME=<base>/hN/home``): bash
  started by sshd sources ``$HOME/.bashrc``, and a developer's ``.bashrc`` (pyenv init,
  PATH edits) would otherwise override a host's ``SetEnv PATH`` and slow every command.
  sshd still ``chdir``s to the passwd home directory, so a remote command's cwd is that.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import getpass
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it
MAX_HOSTS = 64  #: on 127.0.0.x
MAX_SUBNET_HOSTS = 256  #: with a ``subnet``
_PER_SUBNET_OCTET = 250
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1
_TCP_LISTEN = "0A"  # state column of /proc/net/tcp

# Clusters started and not yet closed; the atexit hook closes them so an aborted run
# leaves no sshd behind.
_LIVE: set[SshdCluster] = set()
_LIVE_LOCK = threading.Lock()


class SshdClusterError(RuntimeError):
    """A server of the cluster could not be set up, started or stopped."""


@dataclass(frozen=True)
class SshHost:
    """One sshd of the cluster, as a client reaches it."""

    index: int  #: 1-based position in the cluster
    alias: str  #: ``Host`` alias in the generated ssh_config, e.g. ``"h1"``
    addr: str  #: loopback address the server listens on, e.g. ``"127.0.0.41"``
    port: int  #: TCP port, the same for every host


@dataclass(frozen=True)
class _Proc:
    """A process we may signal later; the start time guards against pid reuse."""

    pid: int
    start_time: str


class SshdCluster:
    """N real ``sshd -D`` processes on 127.0.0.{first_octet+1..first_octet+N} (or in
    ``subnet``)."""

    def __init__(
        self,
        base: Path,
        n: int,
        port: int | None = None,
        first_octet: int = 40,
        extra_config: dict[int, list[str]] | None = None,
        *,
        isolate_home: bool = True,
        env: dict[str, str] | None = None,
        subnet: str | None = None,
    ) -> None:
        addrs = host_addresses(n, first_octet, subnet)
        unknown = set(extra_config or {}) - set(range(1, n + 1))
        if unknown:
            raise ValueError(f"extra_config names hosts outside 1..{n}: {sorted(unknown)}")
        self.base = Path(base).resolve()
        port = port or free_common_port(addrs)
        self.port = port
        self.hosts = [SshHost(i, f"h{i}", addr, port) for i, addr in enumerate(addrs, start=1)]
        self.extra_config = {i: list(lines) for i, lines in (extra_config or {}).items()}
        self.isolate_home = isolate_home
        self.env = dict(env or {})  #: variables every host's sessions get (``SetEnv``)
        self.user = getpass.getuser()
        self.ssh_config = self.base / "ssh_config"
        self.known_hosts = self.base / "known_hosts"
        self.client_key = self.base / "client_ed25519"
        self.wrong_client_key = self.base / "wrong_client_ed25519"
        self.authorized_keys = self.base / "authorized_keys"
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._prepared = False

    # ----------------------------------------------------------------- paths
    def host(self, i: int) -> SshHost:
        """Host ``i`` (1-based)."""
        if not 1 <= i <= len(self.hosts):
            raise IndexError(f"no host {i}; the cluster has hosts 1..{len(self.hosts)}")
        return self.hosts[i - 1]

    def host_dir(self, i: int) -> Path:
        return self.base / self.host(i).alias

    def host_key(self, i: int) -> Path:
        return self.host_dir(i) / "host_ed25519"

    def home(self, i: int) -> Path:
        """``HOME`` of remote commands on host ``i`` (when ``isolate_home``)."""
        return self.host_dir(i) / "home"

    def log(self, i: int) -> Path:
        """sshd's stderr (``-e``) for host ``i``."""
        return self.host_dir(i) / "sshd.log"

    def sshd_pid(self, i: int) -> int | None:
        """Pid of host ``i``'s listening sshd, or None while it is stopped."""
        proc = self._procs.get(i)
        return proc.pid if proc is not None and proc.poll() is None else None

    # ----------------------------------------------------------------- setup
    def _prepare(self) -> None:
        """Generate keys and write every config file, once."""
        if self._prepared:
            return
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.base.mkdir(parents=True, exist_ok=True)
        for h in self.hosts:
            self.home(h.index).mkdir(parents=True, exist_ok=True)
        keys = [self.client_key, self.wrong_client_key]
        keys += [self.host_key(h.index) for h in self.hosts]
        _keygen_all([k for k in keys if not k.exists()])
        self.authorized_keys.write_text(_pub(self.client_key) + "\n")
        for h in self.hosts:
            self._write_sshd_config(h.index)
        self._write_known_hosts(self.known_hosts, self.hosts)
        self._write_ssh_config(self.ssh_config, self.client_key, self.known_hosts)
        self._prepared = True

    def _write_sshd_config(self, i: int) -> None:
        h = self.host(i)
        defaults = [
            f"ListenAddress {h.addr}:{h.port}",
            f"HostKey {self.host_key(i)}",
            "PidFile none",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 200",
            "MaxSessions 64",
            "LogLevel ERROR",
            "PrintMotd no",
            "Subsystem sftp internal-sftp",
        ]
        setenv = {"HOME": str(self.home(i))} if self.isolate_home else {}
        setenv.update(self.env)
        text = render_sshd_config(defaults, self.extra_config.get(i, []), setenv)
        (self.host_dir(i) / "sshd_config").write_text(text)

    def _write_known_hosts(self, path: Path, hosts: list[SshHost]) -> None:
        lines = []
        for h in hosts:
            key_type, blob = _pub(self.host_key(h.index)).split()[:2]
            lines.append(f"[{h.addr}]:{h.port} {key_type} {blob}")
        path.write_text("".join(line + "\n" for line in lines))

    def _write_ssh_config(self, path: Path, identity: Path, known_hosts: Path) -> None:
        blocks = []
        for h in self.hosts:
            blocks.append(
                f"Host {h.alias}\n"
                f"    HostName {h.addr}\n"
                f"    Port {h.port}\n"
                f"    User {self.user}\n"
                f"    IdentityFile {identity}\n"
                "    IdentitiesOnly yes\n"
                f"    UserKnownHostsFile {known_hosts}\n"
                "    StrictHostKeyChecking yes\n"
                # For OpenSSH clients (pdsh, manual debugging): never prompt, never
                # consult the machine-wide known hosts.
                "    GlobalKnownHostsFile /dev/null\n"
                "    BatchMode yes\n"
            )
        path.write_text("\n".join(blocks))

    def wrong_key_config(self) -> Path:
        """An ssh_config like ``ssh_config`` whose IdentityFile is not authorized."""
        self._prepare()
        path = self.base / "ssh_config.wrong_key"
        self._write_ssh_config(path, self.wrong_client_key, self.known_hosts)
        return path

    def config_without_known_host(self, i: int) -> tuple[Path, Path]:
        """(ssh_config, known_hosts) where known_hosts lacks host ``i``."""
        self._prepare()
        alias = self.host(i).alias
        known = self.base / f"known_hosts.no_{alias}"
        self._write_known_hosts(known, [h for h in self.hosts if h.index != i])
        config = self.base / f"ssh_config.no_{alias}"
        self._write_ssh_config(config, self.client_key, known)
        return config, known

    # ----------------------------------------------------------- processes
    def start(self) -> None:
        """Start every stopped sshd and wait until each one sends its SSH banner."""
        self._prepare()
        with _LIVE_LOCK:
            _LIVE.add(self)
        todo = [h.index for h in self.hosts if self.sshd_pid(h.index) is None]
        try:
            for i in todo:
                self._spawn(i)
            deadline = time.monotonic() + START_TIMEOUT_S
            for i in todo:
                self._wait_ready(i, deadline)
        except BaseException:
            self.close()
            raise

    def start_host(self, i: int) -> None:
        """Start host ``i``'s sshd (if stopped) and wait for its banner."""
        self._prepare()
        if self.sshd_pid(i) is not None:
            return
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._spawn(i)
        self._wait_ready(i, time.monotonic() + START_TIMEOUT_S)

    def stop_host(self, i: int) -> None:
        """SIGTERM host ``i``'s listening sshd and wait for it.

        Established connections are served by their own sshd processes and survive,
        as on a real machine whose sshd is restarted.
        """
        proc = self._procs.pop(i, None)
        if proc is not None:
            _terminate(proc)

    def change_host_key(self, i: int) -> None:
        """Give host ``i`` a new host key (known_hosts now mismatches) and restart it."""
        self._prepare()
        key = self.host_key(i)
        original = key.with_name(key.name + ".orig")
        if not original.exists():
            os.replace(key, original)
            os.replace(_pub_path(key), _pub_path(original))
        else:
            key.unlink()
            _pub_path(key).unlink()
        _keygen_all([key])
        self._restart_if_running(i)

    def restore_host_key(self, i: int) -> None:
        """Put host ``i``'s original key back and restart it."""
        key = self.host_key(i)
        original = key.with_name(key.name + ".orig")
        if not original.exists():
            return
        os.replace(original, key)
        os.replace(_pub_path(original), _pub_path(key))
        self._restart_if_running(i)

    def set_extra_config(self, i: int, lines: list[str]) -> None:
        """Give host ``i`` these extra sshd_config lines instead of its current ones (its
        own ``SetEnv``, say) and restart it if it runs. New sessions see the change."""
        self._prepare()
        self.host(i)
        self.extra_config[i] = list(lines)
        self._write_sshd_config(i)
        self._restart_if_running(i)

    def _restart_if_running(self, i: int) -> None:
        if self.sshd_pid(i) is not None:
            self.stop_host(i)
            self.start_host(i)

    def close(self) -> None:
        """Stop every sshd, connection handlers included; idempotent."""
        procs, self._procs = self._procs, {}
        for proc in procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            _terminate(proc)
        _terminate_recorded(_connection_handlers({(h.addr, h.port) for h in self.hosts}))
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> SshdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _command(self, i: int) -> list[str]:
        """The argv that runs host ``i``'s sshd in the foreground."""
        return [SSHD, "-D", "-e", "-f", str(self.host_dir(i) / "sshd_config")]

    def _spawn(self, i: int) -> None:
        cmd = self._command(i)
        with open(self.log(i), "ab") as log:
            self._procs[i] = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: a terminal's Ctrl-C reaches only the test process, whose
                # teardown then stops sshd in order.
                start_new_session=True,
                preexec_fn=_parent_death_signal(),
            )

    def _wait_ready(self, i: int, deadline: float) -> None:
        h = self.host(i)
        proc = self._procs[i]
        last_error = "no attempt"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._procs.pop(i, None)
                raise SshdClusterError(self._failure(i, f"exited with status {proc.returncode}"))
            try:
                if _read_banner(h.addr, h.port).startswith("SSH-2.0"):
                    return
                last_error = "unexpected banner"
            except OSError as e:
                last_error = str(e)
            time.sleep(0.02)
        raise SshdClusterError(
            self._failure(i, f"sent no SSH banner within {START_TIMEOUT_S:.0f}s ({last_error})")
        )

    def _failure(self, i: int, what: str) -> str:
        h = self.host(i)
        try:
            log = self.log(i).read_text(errors="replace").strip()
        except OSError:
            log = ""
        return (
            f"sshd for {h.alias} ({h.addr}:{h.port}) {what}\n"
            f"config: {self.host_dir(i) / 'sshd_config'}\n"
            f"stderr ({self.log(i)}):\n{log or '(empty)'}"
        )

    # ------------------------------------------------------------ inventory
    def inventory_yaml(
        self,
        hosts: list[int] | None = None,
        *,
        python: str | None = None,
        env: dict[str, str] | None = None,
        rdzv_port: int | None = None,
        nproc: int = 2,
        workdir: str | None = None,
    ) -> str:
        """Inventory YAML naming hosts by alias (resolved through ``ssh_config``)."""
        defaults: dict[str, Any] = {"python": python or sys.executable}
        if env:
            defaults["env"] = dict(env)
        if workdir is not None:
            defaults["workdir"] = workdir
        doc: dict[str, Any] = {"defaults": defaults}
        if rdzv_port is not None:
            doc["rendezvous"] = {"port": rdzv_port}
        indices = hosts if hosts is not None else [h.index for h in self.hosts]
        doc["hosts"] = [{"host": self.host(i).alias, "nproc": nproc} for i in indices]
        return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))


def host_addresses(n: int, first_octet: int = 40, subnet: str | None = None) -> list[str]:
    """The loopback addresses of a cluster's ``n`` hosts: ``127.0.0.{first_octet+i}``, or
    ``{subnet}.{(i-1)//250}.{(i-1)%250+1}`` (``subnet`` two octets: ``"127.1"``)."""
    if subnet is not None:
        if not 1 <= n <= MAX_SUBNET_HOSTS:
            raise ValueError(f"n must be between 1 and {MAX_SUBNET_HOSTS}, got {n}")
        if len(subnet.split(".")) != 2 or not subnet.startswith("127."):
            raise ValueError(f"subnet must be two octets of 127/8 (127.1), got {subnet!r}")
        per = _PER_SUBNET_OCTET
        return [f"{subnet}.{i // per}.{i % per + 1}" for i in range(n)]
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"n must be between 1 and {MAX_HOSTS}, got {n}")
    if first_octet < 0 or first_octet + n > 254:
        raise ValueError(f"addresses 127.0.0.{first_octet + 1}..{first_octet + n} invalid")
    return [f"127.0.0.{first_octet + i}" for i in range(1, n + 1)]


def render_sshd_config(defaults: list[str], extra: list[str], setenv: dict[str, str]) -> str:
    """sshd_config text: ``extra`` lines override same-keyword defaults.

    sshd keeps the first value of a keyword and the first ``SetEnv`` line only, so a
    default line whose keyword appears in ``extra`` is dropped and every ``SetEnv``
    (``setenv`` first, then ``extra``'s, later names winning) becomes one directive.
    """
    merged = dict(setenv)
    others: list[str] = []
    overridden: set[str] = set()
    for line in extra:
        keyword, _, rest = line.strip().partition(" ")
        if keyword.lower() == "setenv" and not _in_match(others):
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                merged[name] = value
        elif keyword:
            others.append(line.strip())
            if not _in_match(others):
                overridden.add(keyword.lower())
    lines = [line for line in defaults if line.split()[0].lower() not in overridden]
    # Match blocks must come last; keep the caller's lines, in order, after ours.
    lines += others
    if merged:
        pairs = " ".join(_sshd_quote(f"{k}={v}") for k, v in merged.items())
        lines.insert(len(lines) - len(others), f"SetEnv {pairs}")
    return "".join(line + "\n" for line in lines)


def _in_match(lines: list[str]) -> bool:
    return any(line.split()[0].lower() == "match" for line in lines)


def _sshd_quote(token: str) -> str:
    if not any(c.isspace() or c in "\"'\\" for c in token):
        return token
    return '"' + token.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pub_path(key: Path) -> Path:
    return key.with_name(key.name + ".pub")


def _pub(key: Path) -> str:
    return _pub_path(key).read_text().strip()


def _keygen_all(keys: list[Path]) -> None:
    """Generate ed25519 keys concurrently (one ssh-keygen each)."""
    procs = [
        (
            key,
            subprocess.Popen(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key.stem, "-f", str(key)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            ),
        )
        for key in keys
    ]
    failed = []
    for key, proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"{key}: {out.decode(errors='replace').strip()}")
    if failed:
        raise SshdClusterError("ssh-keygen failed:\n" + "\n".join(failed))


def _read_banner(addr: str, port: int) -> str:
    with socket.create_connection((addr, port), timeout=1.0) as sock:
        # Identify ourselves so sshd logs nothing at LogLevel ERROR for the probe.
        sock.sendall(b"SSH-2.0-sshd_cluster_probe\r\n")
        data = b""
        while b"\n" not in data and len(data) < 256:
            chunk = sock.recv(256)
            if not chunk:
                break
            data += chunk
    return data.decode("ascii", errors="replace")


def _parent_death_signal() -> Any | None:
    """A preexec_fn that SIGTERMs sshd if the test process dies without cleanup.

    The kernel sends the signal when the *thread* that forked exits, so it is only
    used from the main thread, which lives as long as the process.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    def set_pdeathsig() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return set_pdeathsig


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime); comm (field 2) may contain spaces, so split after ")".
    return stat.rpartition(")")[2].split()[19]


def _connection_handlers(listen: set[tuple[str, int]]) -> list[_Proc]:
    """Processes holding a connected TCP socket whose local end is in ``listen``.

    sshd's per-connection processes are not children of the listener (their parent is
    init), so they are found by the socket they serve, never by name.
    """
    inodes = set()
    with contextlib.suppress(OSError), open("/proc/net/tcp") as table:
        for row in list(table)[1:]:
            fields = row.split()
            ip_hex, port_hex = fields[1].split(":")
            local = (socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16))), int(port_hex, 16))
            if local in listen and fields[3] != _TCP_LISTEN:
                inodes.add(f"socket:[{fields[9]}]")
    found = []
    for pid in _pids():
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir()):
                start = _start_time(pid)
                if start is not None:
                    found.append(_Proc(pid, start))
    return found


def _pids() -> list[int]:
    me = os.getpid()
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and int(e.name) != me]


def _terminate_recorded(procs: list[_Proc]) -> None:
    """SIGTERM recorded processes still alive (same start time) and wait for them.

    A zombie counts as gone after a short grace: orphans are reaped by init, not us.
    """
    alive = [p for p in procs if _start_time(p.pid) == p.start_time]
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
    now = time.monotonic()
    deadline, reap_deadline = now + STOP_TIMEOUT_S, now + 1.0
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _start_time(p.pid) == p.start_time]
        if time.monotonic() > reap_deadline:
            alive = [p for p in alive if not _zombie(p.pid)]
        time.sleep(0.02)
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def processes_with_env(
    name: str, value: str, scope: tuple[str, str] | None = None
) -> list[tuple[int, str]]:
    """(pid, cmdline) of every process whose environment has ``name=value`` (and, with
    ``scope`` (NAME, VALUE), has NAME unset or set to VALUE: a process of another worker's
    lab, whose hosts set another ``TMPDIR``, is not this worker's even with the same run
    name).

    Reads ``/proc/*/environ`` (the environment at exec); the calling process is
    skipped, and zombies have an empty environ so they never match.
    """
    entry = f"{name}={value}".encode()
    found = []
    for pid in _pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        variables = environ.split(b"\0")
        if scope is not None and _set_elsewhere(variables, *scope):
            continue
        if entry in variables:
            found.append((pid, cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def _set_elsewhere(variables: list[bytes], name: str, value: str) -> bool:
    """``name`` is among ``variables`` with another value than ``value``."""
    prefix = f"{name}=".encode()
    given = [v[len(prefix) :] for v in variables if v.startswith(prefix)]
    return bool(given) and given[-1] != value.encode()


@atexit.register
def _close_all() -> None:
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        cluster.close()


if __name__ == "__main__":  # manual debugging: python -m sshddp_lab.sshd DIR N
    base_dir, count = Path(sys.argv[1]), int(sys.argv[2])
    with SshdCluster(base_dir, count) as c:
        print(f"{count} sshd running; try: ssh -F {c.ssh_config} h1 true  (Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


def free_common_port(addrs: list[str], start: int = 22000, stop: int = 28000) -> int:
    """A TCP port free on every address (several clusters may run at once on one machine)."""
    import random

    candidates = list(range(start, stop))
    random.shuffle(candidates)
    for port in candidates[:500]:
        socks = []
        try:
            for addr in addrs:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((addr, port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no TCP port free on all of {addrs}")

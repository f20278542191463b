"""Hosts in their own network namespaces, joined by a bridge: a network a test may cut.

``Netns`` makes one namespace per host, each with a veth pair whose inner end is ``eth0``
(address ``10.A.B.i/24``) and whose outer end is a port of a bridge in the root namespace
(``10.A.B.254``). So the test process (the coordinator) reaches every host, and the hosts
reach each other, through the bridge only. ``cut(i)`` / ``heal(i)`` take host ``i``'s outer
veth down and up: that host loses every peer and the coordinator at once, as with a pulled
cable. ``NetnsCluster`` is an ``SshdCluster`` whose sshd ``i`` runs inside namespace ``i``.

Only addresses of the test's own bridge are used: a free ``10.A.B.0/24`` is picked so no
route of the machine changes meaning. Needs root (CAP_NET_ADMIN) and iproute2.

This module imports only the standard library and ``sshddp_lab``'s ``sshd`` and ``workers``,
never pytest.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import time
from pathlib import Path

from sshddp_lab import workers
from sshddp_lab.sshd import SshdCluster, SshHost

INNER_IFNAME = "eth0"  # every host's interface, so one GLOO_SOCKET_IFNAME fits all
SSH_PORT = 2222
# Interface and namespace names carry this process's pid and a serial: two sets of
# namespaces alive in one process at once (the Slurm cluster's and a test's) never share
# a name (a random suffix did, once in a hundred).
_SERIAL = itertools.count()


class NetnsError(RuntimeError):
    """The namespaces could not be made (not root, no iproute2)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise NetnsError("iproute2's `ip` is not installed (.ci/run installs it)") from exc
    if check and proc.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def _tag() -> str:
    """Seven digits: this process's pid and a serial, both modulo what fits a name."""
    return f"{os.getpid() % 100000:05d}{next(_SERIAL) % 100:02d}"


def _free_subnet() -> str:
    """``10.A.B`` whose /24 no route or address of this machine uses."""
    routes = _ip("-4", "route", "show", "table", "all").stdout
    addrs = _ip("-4", "-o", "addr").stdout
    for _ in range(200):
        # Each xdist worker in its own 10.A range: two never pick one at the same time.
        first = 200 + 11 * workers.worker()
        prefix = f"10.{random.randrange(first, first + 11)}.{random.randrange(1, 250)}"
        if f"{prefix}." not in routes and f"{prefix}." not in addrs:
            return prefix
    raise NetnsError("no free 10.x.y.0/24 for the test bridge")


class Netns:
    """N namespaces on one bridge; ``close()`` removes all of it (idempotent)."""

    def __init__(self, n: int) -> None:
        if os.geteuid() != 0:
            raise NetnsError(
                "network-namespace tests need root (CAP_NET_ADMIN) to run `ip netns add`; "
                "CI runs as root. Run the suite as root, e.g. `sudo bash .ci/run`"
            )
        self.n = n
        self.subnet = _free_subnet()
        self._name(_tag())
        self._made_bridge = False
        self._made: list[int] = []

    def _name(self, tag: str) -> None:
        self.bridge = f"sdbr{tag}"
        self.names = [f"sshddp-test-{tag}-{i}" for i in range(1, self.n + 1)]
        self.outer = [f"sdv{tag}{i}" for i in range(1, self.n + 1)]

    def addr(self, i: int) -> str:
        """Host ``i``'s address (1-based)."""
        return f"{self.subnet}.{i}"

    def netns(self, i: int) -> str:
        return self.names[i - 1]

    def setup(self) -> None:
        try:
            for _ in range(100):  # a bridge of an earlier process with this pid, left over
                made = _ip("link", "add", self.bridge, "type", "bridge", check=False)
                if "File exists" not in made.stderr:
                    break
                self._name(_tag())
            if made.returncode != 0:
                raise NetnsError(
                    f"`ip link add {self.bridge} type bridge` failed: {made.stderr.strip()}"
                )
            self._made_bridge = True
            _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(1, len(self.names) + 1):
                self._add_host(i)
        except BaseException:
            self.close()
            raise

    def _add_host(self, i: int) -> None:
        ns, outer = self.netns(i), self.outer[i - 1]
        _ip("netns", "add", ns)
        self._made.append(i)
        _ip("link", "add", outer, "type", "veth", "peer", "name", INNER_IFNAME, "netns", ns)
        _ip("link", "set", outer, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", INNER_IFNAME)
        _ip("-n", ns, "link", "set", INNER_IFNAME, "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def cut(self, i: int) -> None:
        """Host ``i`` loses its link: no packet in or out, as with a pulled cable."""
        _ip("link", "set", self.outer[i - 1], "down")

    def heal(self, i: int) -> None:
        _ip("link", "set", self.outer[i - 1], "up")

    def pids(self, i: int) -> list[int]:
        """Every process inside namespace ``i`` (all were started by this test)."""
        out = _ip("netns", "pids", self.netns(i), check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def kill_all(self) -> None:
        """SIGKILL every process inside the namespaces (sshd, its sessions, leftovers)."""
        for _ in range(50):
            pids = [p for i in self._made for p in self.pids(i)]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def close(self) -> None:
        self.kill_all()
        for i in self._made:
            _ip("link", "del", self.outer[i - 1], check=False)
            _ip("netns", "del", self.netns(i), check=False)
        self._made = []
        if self._made_bridge:
            _ip("link", "del", self.bridge, check=False)
            self._made_bridge = False


class NetnsCluster(SshdCluster):
    """An ``SshdCluster`` whose host ``i`` is sshd inside ``net``'s namespace ``i``."""

    def __init__(self, base: Path, net: Netns) -> None:
        n = len(net.names)
        super().__init__(base, n, port=SSH_PORT)
        self.net = net
        self.hosts = [SshHost(i, f"h{i}", net.addr(i), SSH_PORT) for i in range(1, n + 1)]

    def _command(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.net.netns(i), *super()._command(i)]

    def close(self) -> None:
        super().close()
        # Connection handlers live in the namespaces, out of sight of the root
        # namespace's /proc/net/tcp that SshdCluster.close() reads.
        self.net.kill_all()

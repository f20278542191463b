"""20 launches in a row of a short run on 3 hosts: each one succeeds and leaves nothing.

The launches run in this process through the CLI entry point, so the coordinator's own file
descriptors, threads and sockets can be counted. Their counts after the last launch may not
exceed those after the warm-up (launch 5) by more than a tiny bound: 15 launches after it, so
a leak of even one fd or thread a launch shows many times over. On the hosts (a
private sshd cluster on this machine): no process of any run is left, nothing is bound to
the rendezvous ports (every launch reuses one pair, so each launch also proves the previous
one freed them), each host's runs directory holds every run and nothing else, and each
sshd serves as many connections as before the first launch. Locally: 20 registry entries,
each with every node succeeded, and 20 log directories with every node's output. 20, not
more: 15 launches past the warm-up show a leak of one a launch 7 times over its slack (30
launches cost CI 5 minutes of one worker for no leak a smaller count misses).
Retention past 50 runs is tests/integration/test_workspace.py's (61 runs, no torch).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Callable

import pytest
import yaml

from cli_helpers import sshddp
from sshddp_lab.sshd import SshdCluster, processes_with_env

LAUNCHES = 20
WARM_UP = 5
FD_SLACK = 2  # fds or sockets a long-lived library may open lazily once, after warm-up
THREAD_SLACK = 1
SETTLE_S = 10.0  # how long counts may take to return (a daemon thread ending, sshd exiting)
HOSTS = 3
SHORT = Path(__file__).parent / "payloads" / "short.py"
_TCP_LISTEN = "0A"
_TCP_TIME_WAIT = "06"


def coordinator_usage() -> dict[str, int]:
    """This process's open fds, sockets and threads (as Python and as the kernel sees it)."""
    fds = os.listdir("/proc/self/fd")
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # the fd of the listdir itself, closed by now
            pass
    return {
        "fds": len(fds),
        "sockets": sockets,
        "threads": threading.active_count(),
        "tasks": len(os.listdir("/proc/self/task")),
    }


def settled(measure: Callable[[], dict[str, int]], limit: dict[str, int]) -> dict[str, int]:
    """``measure()`` once it is within ``limit`` (or after SETTLE_S): what is left over."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = measure()
        if all(now[k] <= limit[k] for k in limit) or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def tcp_on_ports(ports: Iterable[int]) -> list[str]:
    """Sockets of any state but TIME_WAIT whose local port is in ``ports`` (IPv4 and IPv6)."""
    ports = set(ports)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port in ports and fields[3] != _TCP_TIME_WAIT:
                found.append(f"{table}: {row.strip()}")
    return found


def connection_handlers(cluster: SshdCluster) -> list[int]:
    """How many connections each sshd of ``cluster`` serves now (its handler processes)."""
    counts = []
    for h in cluster.hosts:
        inodes = set()
        for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = row.split()
            ip_hex, port_hex = fields[1].split(":")
            addr = socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16)))
            if (addr, int(port_hex, 16)) == (h.addr, h.port) and fields[3] != _TCP_LISTEN:
                inodes.add(f"socket:[{fields[9]}]")
        counts.append(sum(1 for pid in _pids() if _holds_any(pid, inodes)))
    return counts


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def _holds_any(pid: int, inodes: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def processes_of_runs(run_ids: set[str]) -> list[tuple[int, str]]:
    """Every process, on any host, carrying the marker of one of ``run_ids``."""
    found = []
    for run_id in sorted(run_ids):
        found += processes_with_env("SSHDDP_RUN_ID", run_id)
    return found


def write_inventory(cluster: SshdCluster, tmp: Path, port: int) -> tuple[Path, list[Path]]:
    """Three hosts, each with its own remote workdir (as on separate machines)."""
    workdirs = [tmp / "remote" / h.alias for h in cluster.hosts]
    doc = {
        "defaults": {"python": sys.executable, "nproc": 1},
        "rendezvous": {"port": port},
        "hosts": [{"host": h.alias, "workdir": str(w)} for h, w in zip(cluster.hosts, workdirs)],
    }
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    return inv, workdirs


def check_run(run_id: str, log_dir: Path) -> None:
    """Every node printed its line, locally logged."""
    for node in range(HOSTS):
        log = log_dir / run_id / f"node{node}-h{node + 1}.log"
        (line,) = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
        assert line == {
            "RANK": str(node),
            "WORLD_SIZE": str(HOSTS),
            "GROUP_RANK": str(node),
            "SSHDDP_RUN_ID": run_id,
        }


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 3 s a launch on 2 idle cores; more on a busy machine
def test_twenty_launches_in_a_row_leak_nothing(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    cluster = make_cluster(HOSTS)
    port = free_port()
    inv, workdirs = write_inventory(cluster, tmp_path, port)
    log_dir = tmp_path / "logs"
    handlers_before = connection_handlers(cluster)
    opts = ["--ssh-config", cluster.ssh_config, "--log-dir", log_dir]
    run_ids: list[str] = []
    warm: dict[str, int] = {}
    for i in range(1, LAUNCHES + 1):
        result = sshddp(["launch", *opts, inv, SHORT])
        assert result.code == 0, f"launch {i}: {result.explain()}"
        run_id = result.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
        run_ids.append(run_id)
        check_run(run_id, log_dir)
        run_no_leak(run_id)
        if i == WARM_UP:
            warm = coordinator_usage()
    slack = {"fds": FD_SLACK, "sockets": FD_SLACK, "threads": THREAD_SLACK, "tasks": THREAD_SLACK}
    limit = {k: warm[k] + slack[k] for k in slack}
    after = settled(coordinator_usage, limit)
    assert all(after[k] <= limit[k] for k in limit), f"after warm-up {warm}, at the end {after}"

    assert len(set(run_ids)) == LAUNCHES
    assert processes_of_runs(set(run_ids)) == []
    assert tcp_on_ports([port, port + 1]) == []
    for workdir in workdirs:
        assert sorted(os.listdir(workdir / "runs")) == sorted(run_ids), workdir
    handlers = settled(
        lambda: dict(enumerate(connection_handlers(cluster))), dict(enumerate(handlers_before))
    )
    assert list(handlers.values()) == handlers_before

    assert sorted(os.listdir(log_dir)) == sorted(run_ids)
    registry = Path(os.environ["XDG_STATE_HOME"]) / "sshddp" / "runs"
    entries = [json.loads(p.read_text()) for p in registry.glob("*.json")]
    assert sorted(e["run_id"] for e in entries) == sorted(run_ids)
    for entry in entries:
        assert [n["state"] for n in entry["result"]["nodes"]] == ["succeeded"] * HOSTS, entry

"""``sshddp smoke`` for real: gloo on CPU through real sshd hosts, and a host in its own
network namespace that cannot reach node 0 (a route to node 0 prohibited in its namespace).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import yaml
from launch_helpers import SSHDDP, cli_env

from sshddp.errors import ExitCode
from sshddp_lab.netns import INNER_IFNAME, NetnsCluster
from sshddp_lab.sshd import SshdCluster

FAST = ["--iters", "3", "--sizes", "4K,256K", "--p2p-size", "256K"]


def smoke(
    cluster: SshdCluster, tmp: Path, inv: Path, *opts: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SSHDDP, "smoke", *opts, str(inv)],
        cwd=tmp,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=300,
    )


def inventory(tmp: Path, port: int, hosts: list[dict[str, object]], ifname: str) -> Path:
    doc = {
        "defaults": {"python": sys.executable, "workdir": str(tmp / "remote"), "nproc": 2},
        "rendezvous": {"port": port},
        "hosts": hosts,
    }
    doc["defaults"]["env"] = {"GLOO_SOCKET_IFNAME": ifname}  # type: ignore[index]
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


@pytest.mark.slow
def test_smoke_reports_every_host_with_figures(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    hosts = [{"host": f"h{i}"} for i in (1, 2, 3)]
    inv = inventory(tmp_path, free_port(), hosts, "lo")
    proc = smoke(ssh_env, tmp_path, inv, "--json", *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert found["ok"] and found["backend"] == "gloo" and found["world_size"] == 6
    assert found["sum"] == found["expected_sum"] == 21
    assert sorted(j["rank"] for j in found["joined"]) == list(range(6))
    assert sorted({j["node"] for j in found["joined"]}) == [0, 1, 2]
    assert [r["bytes"] for r in found["allreduce"]] == [4096, 262144]
    for row in found["allreduce"]:  # bus bandwidth as nccl-tests define it, n = 6
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 5 / 6)
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_us"] / 1e3)
    assert [(link["node"], link["host"]) for link in found["links"]] == [(1, "h2"), (2, "h3")]
    assert [(n["node"], n["host"], n["joined"]) for n in found["nodes"]] == [
        (0, "h1", 2),
        (1, "h2", 2),
        (2, "h3", 2),
    ]
    assert all(link["gbps"] > 0 for link in found["links"])


@pytest.mark.slow
def test_smoke_table_on_the_terminal(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    inv = inventory(tmp_path, free_port(), [{"host": "h1"}, {"host": "h2"}], "lo")
    proc = smoke(ssh_env, tmp_path, inv, *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "all-reduce sum: 10 (expected 10): exact" in proc.stdout
    assert "busbw (GB/s)" in proc.stdout and "256 KiB" in proc.stdout
    assert "  node 1   h2 " in proc.stdout
    assert "  node 0   h1                   2/2" in proc.stdout  # node 0 is named too
    assert "ok: every rank joined, the sum is exact" in proc.stdout


@pytest.mark.slow
def test_smoke_names_a_host_that_cannot_reach_node_0(
    netns_cluster: NetnsCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """h3 reaches the coordinator (the bridge) but its route to node 0 is prohibited."""
    net = netns_cluster.net
    hosts = [{"host": f"h{i}", "addr": net.addr(i)} for i in (1, 2, 3)]
    inv = inventory(tmp_path, free_port(), hosts, INNER_IFNAME)
    subprocess.run(
        ["ip", "-n", net.netns(3), "route", "add", "prohibit", f"{net.addr(1)}/32"], check=True
    )
    proc = smoke(netns_cluster, tmp_path, inv, "--connect-timeout", "5", *FAST)
    assert proc.returncode == ExitCode.CHECK_FAILED, proc.stderr[-3000:]
    problems = [line for line in proc.stderr.splitlines() if line.startswith("FAIL")]
    # doctor's net check sees the missing route too; the rendezvous check names the port
    assert problems and all(line.startswith("FAIL h3 ") for line in problems), proc.stderr
    (rdzv,) = [line for line in problems if line.startswith("FAIL h3 rdzv")]
    assert f"{net.addr(1)}:" in rdzv

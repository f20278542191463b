"""Spares at launch, for real: a host whose sshd is down, then a quarantined host, then one
whose ``health:`` check fails, is replaced by the inventory's spare at the same node rank
(its ranks run there, the banner names the swap, ps and the local logs name the spare);
with the spare down (or unhealthy) too, the launch fails naming both. No process of a run
survives."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import yaml
from launch_helpers import JOB, sshddp

from sshddp_lab.sshd import SshdCluster

#: the inventory's health: command, failing where the host's env sets SCRATCH_FULL
CHECK = 'echo checking /scratch; test -z "$SCRATCH_FULL" || { echo "/scratch is full"; exit 4; }'


def _inventory(
    tmp: Path, port: int, name: str, spares: list[Any], sick: tuple[str, ...] = ()
) -> Path:
    """Hosts h1-h3 and ``spares``; with ``sick``, every host and spare runs CHECK and those
    named fail it."""
    doc: dict[str, Any] = {
        "defaults": {
            "python": sys.executable,
            "workdir": str(tmp / "remote"),
            "nproc": 1,
            "env": {"GLOO_SOCKET_IFNAME": "lo"},
        },
        "rendezvous": {"port": port},
        "hosts": ["h1", "h2", "h3"],
    }
    if spares:
        doc["spares"] = spares
    if sick:
        doc["defaults"]["health"] = CHECK
        full = {"SCRATCH_FULL": "1"}
        for key in ("hosts", "spares"):
            doc[key] = [{"host": h, "env": full} if h in sick else h for h in doc[key]]
    inv = tmp / name
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def _ran_on_h4(cluster: SshdCluster, tmp: Path, run: str, node: int = 2) -> None:
    """Node ``node`` ran on h4: its local log is named for h4 and holds its rank's lines;
    ps says so."""
    log = tmp / "sshddp-logs" / run / f"node{node}-h4.log"
    assert f"rank {node} line 49" in log.read_text(), log.read_text()
    listed = json.loads(sshddp(cluster, tmp, "ps", "--all", "--json", run).stdout)
    (row,) = listed["runs"]
    hosts = ["h1", "h2", "h3"]
    hosts[node] = "h4"
    assert [n["host"] for n in row["nodes"]] == hosts, row


def test_a_bad_host_is_replaced_by_the_spare(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    cluster = make_cluster(4)
    port = free_port()
    spared = _inventory(tmp_path, port, "spared.yaml", ["h4"])
    plain = _inventory(tmp_path, port, "plain.yaml", [])
    timeout = ["--connect-timeout", "3"]

    cluster.stop_host(3)  # unreachable: the spare takes node 2
    down = sshddp(cluster, tmp_path, "launch", *timeout, "--name", "sp1", spared, JOB, "ok")
    assert down.returncode == 0 and "Traceback" not in down.stderr, down.stderr
    (swap,) = [line for line in down.stderr.splitlines() if "takes its place" in line]
    assert swap.startswith("sshddp: node 2: h3 unreachable (") and "connection refused" in swap
    assert swap.endswith("; spare h4 takes its place"), swap
    # h3 is quarantined as the preflight would have: the next launch does not wait on it
    assert "sshddp: quarantined h3 until " in down.stderr, down.stderr
    assert ": unreachable at launch (h3: " in down.stderr, down.stderr
    _ran_on_h4(cluster, tmp_path, "sp1")
    run_no_leak("sp1")

    # without spares: the quarantine refuses the launch at once
    refused = sshddp(cluster, tmp_path, "launch", *timeout, "--name", "sp2", plain, JOB, "ok")
    assert refused.returncode == 3 and "h3 is quarantined until" in refused.stderr, refused.stderr

    cluster.start_host(3)  # reachable, but quarantined: the spare takes node 2
    quar = sshddp(cluster, tmp_path, "launch", "--no-check", "--name", "sp3", spared, JOB, "ok")
    assert quar.returncode == 0, quar.stderr
    (swap,) = [line for line in quar.stderr.splitlines() if "takes its place" in line]
    assert swap.startswith("sshddp: node 2: h3 quarantined until ") and "h4" in swap, swap
    _ran_on_h4(cluster, tmp_path, "sp3")
    run_no_leak("sp3")

    cluster.stop_host(4)  # no usable spare: the quarantine refuses, as without spares
    both = sshddp(cluster, tmp_path, "launch", *timeout, "--name", "sp4", spared, JOB, "ok")
    assert both.returncode == 3 and "Traceback" not in both.stderr, both.stderr
    lines = both.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("sshddp: node 2: h3 quarantined until "), lines
    assert "no spare can take its place (spare h4 unreachable (" in lines[0], lines
    assert "h3 is quarantined until" in lines[1] and "--ignore-quarantine" in lines[1], lines
    run_no_leak("sp4")


def test_a_host_failing_its_health_check_is_replaced_by_the_spare(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """h2's ``health:`` check fails: the spare takes node 1 before anything starts, the
    line says what the check said, and h2 is quarantined. With the spare failing its check
    too, the launch names both and fails as without spares (exit 3, nothing started)."""
    cluster = make_cluster(4)
    port = free_port()
    sick = _inventory(tmp_path, port, "sick.yaml", ["h4"], sick=("h2",))
    run = sshddp(cluster, tmp_path, "launch", "--name", "hs1", sick, JOB, "ok")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    (swap,) = [line for line in run.stderr.splitlines() if "takes its place" in line]
    assert swap == (
        f"sshddp: node 1: h2 unhealthy (`{CHECK}` exited 4: checking /scratch | "
        "/scratch is full); spare h4 takes its place"
    ), swap
    assert "sshddp: quarantined h2 until " in run.stderr, run.stderr
    assert ": failed its health check (`" in run.stderr, run.stderr
    _ran_on_h4(cluster, tmp_path, "hs1", node=1)
    run_no_leak("hs1")

    cleared = sshddp(cluster, tmp_path, "quarantine", "--clear", "h2")
    assert cleared.returncode == 0, cleared.stderr
    both = _inventory(tmp_path, port, "both.yaml", ["h4"], sick=("h2", "h4"))
    failed = sshddp(cluster, tmp_path, "launch", "--name", "hs2", both, JOB, "ok")
    assert failed.returncode == 3 and "Traceback" not in failed.stderr, failed.stderr
    (unfilled,) = [ln for ln in failed.stderr.splitlines() if "no spare can take" in ln]
    assert unfilled.startswith("sshddp: node 1: h2 unhealthy (`"), unfilled
    assert "(spare h4 unhealthy (`" in unfilled, unfilled
    assert "FAIL h2 health" in " ".join(failed.stderr.split()), failed.stderr
    assert "sshddp: run " not in failed.stderr, failed.stderr
    run_no_leak("hs2")

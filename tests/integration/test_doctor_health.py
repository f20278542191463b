"""``sshddp doctor --health`` against real sshd hosts: the inventory's own ``health:``
command runs on every host, and the one host where it fails is named, with its exit code
and the last lines of its output (exit 3)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from doctor_helpers import Port, doctor, table, write

from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

#: fails where the host's env sets SCRATCH_FULL, saying so on its last line
CHECK = 'echo checking /scratch; test -z "$SCRATCH_FULL" || { echo "/scratch is full"; exit 4; }'


def _inventory(cluster: SshdCluster, tmp_path: Path, port: int) -> Path:
    lines = [
        f"defaults: {{python: {sys.executable}, nproc: 1, health: '{CHECK}'}}",
        f"rendezvous: {{port: {port}}}",
        "hosts:",
        f"  - host: {cluster.host(1).alias}",
        f"  - host: {cluster.host(2).alias}",
        "    env: {SCRATCH_FULL: '1'}",
        f"  - host: {cluster.host(3).alias}",
    ]
    return write(tmp_path, "\n".join(lines) + "\n")


def test_a_health_command_failing_on_one_host(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    inv = _inventory(ssh_env, tmp_path, free_port())
    result = doctor(ssh_env, inv, "--health")
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    rows = table(result.out)
    assert {host: row["health"] for host, row in rows.items()} == {
        "h1": "ok",
        "h2": "FAIL",
        "h3": "ok",
    }, result.out
    assert all(row["gpu_health"] == "ok" for row in rows.values()), result.out
    flat = " ".join(result.out.split())
    assert f"FAIL h2 health: `{CHECK}` exited 4: checking /scratch | /scratch is full" in flat
    assert "1 failing check(s)" in flat, result.out


def test_health_in_json_and_not_without_the_option(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    inv = _inventory(ssh_env, tmp_path, free_port())
    result = doctor(ssh_env, inv, "--health", "--json")
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    hosts = json.loads(result.out)["hosts"]
    health = {h["host"]: h["facts"]["health"]["command"] for h in hosts}
    assert [health[h]["exit"] for h in ("h1", "h2", "h3")] == [0, 4, 0]
    assert health["h2"]["output"] == "checking /scratch\n/scratch is full\n"
    found = {h["host"]: {f["check"]: f for f in h["findings"]} for h in hosts}
    assert found["h2"]["health"]["status"] == "fail"
    assert found["h1"]["health"] == {
        "check": "health",
        "status": "ok",
        "message": f"`{CHECK}` passed",
        "fix": "",
    }
    plain = doctor(ssh_env, inv, "--json")  # without --health nothing of it runs
    assert plain.code == ExitCode.OK, plain.explain()
    for h in json.loads(plain.out)["hosts"]:
        assert "health" not in h["facts"]
        assert not {"health", "gpu_health"} & {f["check"] for f in h["findings"]}

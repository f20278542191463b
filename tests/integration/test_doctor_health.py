"""``sshddp doctor --health`` against real sshd hosts: the inventory's own ``health:``
command runs on every host, and the one host where it fails is named, with its exit code
and the last lines of its output (exit 3); a launch's preflight runs it too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from doctor_helpers import Port, doctor, table, write
from launch_helpers import JOB, SSHDDP, Run, cli_env, run_id_of, write_inventory

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


def test_health_in_json_and_the_command_alone_without_the_option(
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
    # without --health, doctor runs the health: command alone, as a launch does
    plain = doctor(ssh_env, inv, "--json")
    assert plain.code == ExitCode.CHECK_FAILED, plain.explain()
    for h in json.loads(plain.out)["hosts"]:
        assert list(h["facts"]["health"]) == ["command"]
        checks = {f["check"]: f["status"] for f in h["findings"]}
        assert checks["health"] == ("fail" if h["host"] == "h2" else "ok")
        assert not {"gpu_health", "xid", "ib", "dcgm"} & set(checks)


def _launch(cluster: SshdCluster, tmp_path: Path, port: int, broken: bool) -> Run:
    """A two-host launch whose inventory sets ``health: CHECK``, failing on h2 if
    ``broken``."""
    tmp_path.mkdir()
    inv, workdir = write_inventory(cluster, tmp_path, port, hosts=[1, 2], nproc=1)
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"]["health"] = CHECK
    if broken:
        doc["hosts"][1]["env"] = {"SCRATCH_FULL": "1"}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run(
        [*SSHDDP, "launch", str(inv), str(JOB), "ok"],
        cwd=tmp_path,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=180,
    )
    run_id = run_id_of(proc.stderr) if "sshddp: run " in proc.stderr else ""
    return Run(proc.returncode, proc.stdout, proc.stderr, run_id, tmp_path, workdir)


def test_a_launch_runs_the_health_command_in_its_preflight(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Port, run_no_leak: Any
) -> None:
    """A failing ``health:`` stops the launch before anything starts (exit 3, naming the
    host) and quarantines the host; the next launch is refused until the quarantine is
    cleared, and once the check passes, the run goes ahead."""
    run = _launch(ssh_env, tmp_path / "broken", free_port(), broken=True)
    assert run.rc == ExitCode.CHECK_FAILED, run.stderr
    flat = " ".join(run.stderr.split())
    assert f"FAIL h2 health: `{CHECK}` exited 4: checking /scratch | /scratch is full" in flat
    assert "FAIL h1" not in flat and "nothing was started" in flat
    assert run.run_id == ""
    runs = run.workdir / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
    assert "sshddp: quarantined h2 until " in run.stderr, run.stderr
    assert ": failed its health check (" in run.stderr, run.stderr
    run = _launch(ssh_env, tmp_path / "refused", free_port(), broken=False)
    assert run.rc == ExitCode.CHECK_FAILED and "h2 is quarantined" in run.stderr, run.stderr
    clear = subprocess.run(
        [*SSHDDP, "quarantine", "--clear", "h2"],
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert clear.returncode == 0, clear.stderr
    run = _launch(ssh_env, tmp_path / "fixed", free_port(), broken=False)
    assert run.rc == ExitCode.OK, run.stderr
    run_no_leak(run.run_id)

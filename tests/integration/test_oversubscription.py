"""A host given more processes than it has CPUs: doctor and launch both say so, with the
fix, and the launch still runs (it is a warning)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

from launch_helpers import SSHDDP, cli_env, run_id_of, write_inventory

from sshddp_lab.sshd import SshdCluster

SHORT = Path(__file__).parent / "payloads" / "short.py"


def test_more_processes_than_cpus_is_a_warning_at_doctor_and_launch(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    cpus = len(os.sched_getaffinity(0))  # every lab host is this machine
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1], nproc=cpus + 1)
    warning = f"h1 gpus: CPU host, {cpus + 1} processes on {cpus} CPUs"

    def sshddp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SSHDDP, *args],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            capture_output=True,
            text=True,
            timeout=180,
        )

    doctor = sshddp("doctor", str(inv))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"warn {warning}" in doctor.stdout and f"`nproc: {cpus}` or fewer" in doctor.stdout

    launch = sshddp("launch", str(inv), str(SHORT))
    assert launch.returncode == 0, launch.stderr
    assert f"sshddp: warning: {warning}" in launch.stderr
    assert f"fix: `nproc: {cpus}` or fewer for h1 in the inventory" in launch.stderr
    assert launch.stderr.index("warning") < launch.stderr.index("succeeded")
    run_no_leak(run_id_of(launch.stderr))

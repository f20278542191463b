"""``sshddp sync`` and ``launch --sync`` on a real Slurm job's nodes (``slurm_cluster``).

Each node is a network namespace with no route out: uv installs from the lab's local
indexes on the shared filesystem (``make_project``). Over SSH each node's sshd gives it its
own HOME, so each node has its own workdir and uv cache, as separate machines would.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import yaml
from launch_helpers import SSHDDP, run_id_of
from test_slurm_lab import assert_cluster_idle
from test_slurm_launch import GLOO, netns_of, run
from test_sync import make_project

from sshddp_lab.slurm import SlurmCluster

RANK_SCRIPT = """
import json, os, socket, sys
import six, torch
print(json.dumps({"rank": int(os.environ["RANK"]), "prefix": sys.prefix,
                  "netns": os.readlink("/proc/self/ns/net")}), flush=True)
"""
DEPS = ["torch==2.13.0", "six==1.17.0"]
BOUND = 600.0  # three cold installs of torch, one per node's own uv cache, on 2 busy cores


def ranks(output: str) -> dict[int, dict[str, Any]]:
    """rank -> what it printed, from the coordinator's ``[K host] {...}`` lines."""
    found = {}
    for line in output.splitlines():
        if '"prefix"' in line:
            record = json.loads(line[line.index("{") :])
            found[record["rank"]] = record
    return found


def allocate(cluster: SlurmCluster, cwd: Path) -> str:
    proc = run(cluster, ["salloc", "-N3", "--no-shell"], cwd, timeout=60)
    match = re.search(r"Granted job allocation (\d+)", proc.stderr)
    assert proc.returncode == 0 and match, proc.stderr
    return match.group(1)


def test_sync_then_launch_sync_over_ssh_on_a_jobs_nodes(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """``sshddp sync slurm:JOB`` builds each node's environment under its own workdir; then
    ``launch --sync`` finds it ready and runs every rank, in its node, in that env."""
    project = make_project(tmp_path / "proj", DEPS, tmp_path / "lock-cache")
    script = tmp_path / "where.py"
    script.write_text(RANK_SCRIPT)
    workdir = f"~/w-{tmp_path.name}"  # under each node's own HOME
    job = allocate(slurm_cluster, tmp_path)
    inv = tmp_path / "inv.yaml"
    doc = {"defaults": {"workdir": workdir}, "hosts": {"slurm": int(job)}}
    inv.write_text(yaml.safe_dump(doc))
    cfg = ["--ssh-config", str(slurm_cluster.ssh_config)]
    try:
        first = run(slurm_cluster, [*SSHDDP, "sync", *cfg, str(inv), str(project)], tmp_path, BOUND)
        assert first.returncode == 0, first.stdout + first.stderr
        built = [line.split()[:2] for line in first.stdout.splitlines()]
        assert built == [["node1:", "built"], ["node2:", "built"], ["node3:", "built"]], built
        argv = [*SSHDDP, "launch", "--sync", str(project), *cfg, "--port", str(free_port())]
        proc = run(slurm_cluster, [*argv, "--env", GLOO, str(inv), str(script)], tmp_path, BOUND)
    finally:
        slurm_cluster.run(["scancel", job])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sshddp: sync: env " in proc.stderr and "on all 3 host(s)" in proc.stderr
    seen = ranks(proc.stdout)
    assert sorted(seen) == [0, 1, 2], proc.stdout
    for rank, record in seen.items():
        home = slurm_cluster.ssh.home(rank + 1)
        assert Path(record["prefix"]).parent == home / workdir[2:] / "envs", record
        assert record["netns"] == netns_of(slurm_cluster, rank), record
    run_no_leak(run_id_of(proc.stderr), timeout=30)
    assert_cluster_idle(slurm_cluster)


def test_nodes_sharing_a_workdir_over_srun_build_the_env_once(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Over srun every node has this machine's HOME, as a cluster's nodes share their home
    directory: one node builds the environment, the others wait for it and use it; then
    ``launch --sync`` runs every rank, in its node, in that one env."""
    project = make_project(tmp_path / "proj", DEPS, tmp_path / "lock-cache")
    script = tmp_path / "where.py"
    script.write_text(RANK_SCRIPT)
    shared = tmp_path / "shared"
    job = allocate(slurm_cluster, tmp_path)
    inv = tmp_path / "inv.yaml"
    doc = {"defaults": {"workdir": str(shared), "transport": "srun"}, "hosts": {"slurm": int(job)}}
    inv.write_text(yaml.safe_dump(doc))
    try:
        first = run(slurm_cluster, [*SSHDDP, "sync", str(inv), str(project)], tmp_path, BOUND)
        assert first.returncode == 0, first.stdout + first.stderr
        said = sorted(line.split()[1] for line in first.stdout.splitlines())
        assert said == ["built", "ready", "ready"], first.stdout + first.stderr
        argv = [*SSHDDP, "launch", "--sync", str(project), "--port", str(free_port())]
        proc = run(slurm_cluster, [*argv, "--env", GLOO, str(inv), str(script)], tmp_path, BOUND)
    finally:
        slurm_cluster.run(["scancel", job])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = ranks(proc.stdout)
    assert sorted(seen) == [0, 1, 2], proc.stdout
    (env,) = [p for p in (shared / "envs").iterdir() if not p.name.startswith(".")]
    for rank, record in seen.items():
        assert Path(record["prefix"]) == env, record
        assert record["netns"] == netns_of(slurm_cluster, rank), record
    run_no_leak(run_id_of(proc.stderr), timeout=30)
    assert_cluster_idle(slurm_cluster)

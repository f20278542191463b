"""sshddp on a real Slurm cluster (``slurm_cluster``): allocations as inventories, launched
over SSH and over srun, torn down by failures, ``scancel``, ``stop`` and a vanished
coordinator, and doctor's Slurm checks.

Every node is a network namespace with its own slurmd and sshd: a rank proves where it ran
by its namespace. A run's processes are found by their run id (``run_no_leak``) and the
cluster's job processes by namespace (``job_processes``), so "nothing left in any step" is
checked, not assumed. Ranks import torch on a loaded 2-core machine: bounds are generous.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from launch_helpers import JOB, SSHDDP, run_id_of, wait_until
from test_slurm_lab import assert_cluster_idle

from cli_helpers import assert_clean_failure, sshddp
from sshddp.remote.node.bound import COORDINATOR_GONE
from sshddp_lab.slurm import SlurmCluster

BOUND = 180.0  # a launch of three nodes, each importing torch, on a busy 2-core machine
GLOO = "GLOO_SOCKET_IFNAME=eth0"  # every node's interface in its namespace
NoLeak = Callable[..., None]
WAIT = Path(__file__).parent / "payloads" / "wait.py"  # READY, then waits; no torch


def cli_env(cluster: SlurmCluster) -> dict[str, str]:
    """The test's environment for Slurm commands, with this venv's python3 first on PATH:
    srun passes PATH to the steps, so the nodes' ``python3`` has torch."""
    env = cluster.client_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(
    cluster: SlurmCluster, argv: list[str], cwd: Path, timeout: float = BOUND
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=cli_env(cluster),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(cluster: SlurmCluster, argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=cli_env(cluster),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def sbatch_and_wait(cluster: SlurmCluster, args: list[str], cwd: Path) -> tuple[str, str]:
    """Submit a batch job and wait for its end (sbatch --wait polls with a growing pause,
    up to 30 s late): its (JobState, ExitCode)."""
    proc = run(cluster, ["sbatch", "--parsable", *args], cwd, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    done: dict[str, str] = {}

    def ended() -> bool:
        shown = cluster.run(["scontrol", "-o", "show", "job", job]).stdout
        fields = dict(re.findall(r"(?:^|\s)(JobState|ExitCode)=(\S+)", shown))
        done.update(fields)
        return fields.get("JobState") not in (None, "PENDING", "RUNNING", "COMPLETING")

    wait_until(ended, BOUND, f"batch job {job} to end")
    return done["JobState"], done["ExitCode"]


def summaries(output: str) -> list[dict[str, Any]]:
    """The ranks' JSON summaries from the coordinator's ``[K host] {...}`` lines (a prefix
    padded to the widest, a node's ``[K-L host]``)."""
    rows = []
    for line in output.splitlines():
        text = line.partition("] ")[2].lstrip(" ")
        if text.startswith('{"rank"'):
            rows.append(json.loads(text))
    return sorted(rows, key=lambda row: row["rank"])


def netns_of(cluster: SlurmCluster, node_rank: int) -> str:
    return f"net:[{cluster.netns_inode(node_rank + 1)}]"


@pytest.fixture
def job(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[str]:
    """A running 3-node job with no step (``salloc --no-shell``), cancelled afterwards."""
    proc = run(slurm_cluster, ["salloc", "-N3", "--no-shell"], tmp_path, timeout=60)
    match = re.search(r"Granted job allocation (\d+)", proc.stderr)
    assert proc.returncode == 0 and match, proc.stderr
    try:
        yield match.group(1)
    finally:
        slurm_cluster.run(["scancel", match.group(1)])
        assert_cluster_idle(slurm_cluster)


def no_steps_left(cluster: SlurmCluster, job: str) -> None:
    """The job runs on, with no step and no process left in it."""
    wait_until(lambda: not cluster.job_processes(), 60, "the job's processes to end")
    steps = cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split()
    assert steps == [], steps
    assert cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() == "RUNNING"


def ready(tmp: Path, run_id: str, nodes: int = 3) -> bool:
    """Every node's local log has its rank's READY line."""
    logs = list((tmp / "sshddp-logs" / run_id).glob("node*.log"))
    return len(logs) == nodes and all(b"READY" in log.read_bytes() for log in logs)


def started_run(proc: subprocess.Popen[str], tmp: Path) -> str:
    """The run id from a running coordinator's banner, once every rank said READY."""
    assert proc.stderr is not None
    banner = proc.stderr.readline()
    run_id = run_id_of(banner)
    wait_until(lambda: ready(tmp, run_id) or proc.poll() is not None, BOUND, "READY")
    assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
    return run_id


def launch_wait(cluster: SlurmCluster, tmp: Path, port: int, job: str) -> subprocess.Popen[str]:
    """``sshddp launch`` over srun of a job that waits, from outside the allocation."""
    argv = [*SSHDDP, "launch", "--transport", "srun", "--port", str(port), "--env", GLOO]
    return start(cluster, [*argv, f"slurm:{job}", str(WAIT)], tmp)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


# ------------------------------------------------------------------------- launching


def test_launch_slurm_in_salloc_over_srun(
    slurm_cluster: SlurmCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak: NoLeak
) -> None:
    """``salloc -N3 --ntasks-per-node=2 sshddp launch --transport srun slurm job.py ...``:
    two ranks on each node, in that node's namespace, in nodelist order, the arguments
    verbatim and no SLURM_* variable in the ranks' environment."""
    argv = [*SSHDDP, "launch", "--transport", "srun", "--port", str(free_port()), "--env", GLOO]
    script = [str(JOB), "argv", "a b", "$x", "--flag=${local_rank}"]
    proc = run(
        slurm_cluster, ["salloc", "-N3", "--ntasks-per-node=2", *argv, "slurm", *script], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    rows = summaries(proc.stdout)
    assert [r["rank"] for r in rows] == list(range(6))
    for r in rows:
        assert (r["world"], r["sum"]) == (6, 15.0)
        assert r["node_rank"] == r["rank"] // 2 and r["local_rank"] == r["rank"] % 2
        assert r["netns"] == netns_of(slurm_cluster, r["node_rank"])
        assert r["argv"] == ["a b", "$x", "--flag=${local_rank}"]
        assert r["slurm_vars"] == []
    assert "node 1   node2                succeeded" in proc.stderr
    run_no_leak(run_id_of(proc.stderr), timeout=30)
    assert_cluster_idle(slurm_cluster)


def test_yaml_slurm_current_over_ssh_in_a_batch_script(
    slurm_cluster: SlurmCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak: NoLeak
) -> None:
    """A batch script (on node1) runs ``sshddp launch inv.yaml`` whose hosts are
    ``{slurm: current}``: the YAML's defaults apply, and SSH reaches each node's sshd."""
    inv = tmp_path / "inv.yaml"
    doc = {
        "defaults": {
            "python": sys.executable,
            "workdir": str(tmp_path / "remote"),
            "env": {"GLOO_SOCKET_IFNAME": "eth0"},
        },
        "rendezvous": {"port": free_port()},
        "hosts": {"slurm": "current"},
    }
    inv.write_text(yaml.safe_dump(doc))
    cfg = str(slurm_cluster.ssh_config)
    launch = [*SSHDDP, "launch", "--ssh-config", cfg, str(inv), str(JOB), "argv", "it's"]
    batch = tmp_path / "job.sh"
    batch.write_text("#!/bin/sh\nexec " + " ".join(map(repr, launch)) + "\n")
    state = sbatch_and_wait(slurm_cluster, ["-N3", "-o", "out.txt", str(batch)], tmp_path)
    out = (tmp_path / "out.txt").read_text()
    assert state == ("COMPLETED", "0:0"), out
    rows = summaries(out)
    assert [(r["rank"], r["node_rank"], r["sum"]) for r in rows] == [(k, k, 3.0) for k in range(3)]
    assert all(r["netns"] == netns_of(slurm_cluster, r["node_rank"]) for r in rows)
    assert all(r["argv"] == ["it's"] for r in rows)
    assert (tmp_path / "remote" / "runs").is_dir()  # the YAML's workdir, on every node
    run_no_leak(run_id_of(out), timeout=30)
    assert_cluster_idle(slurm_cluster)


def test_a_rank_failing_on_node2_tears_down_every_node(
    slurm_cluster: SlurmCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak: NoLeak
) -> None:
    argv = [*SSHDDP, "launch", "--transport", "srun", "--port", str(free_port()), "--env", GLOO]
    argv += ["--grace", "2"]
    proc = run(slurm_cluster, ["salloc", "-N3", *argv, "slurm", str(WAIT), "fail", "1"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    report = proc.stderr[proc.stderr.index("sshddp: run ") :]
    assert "node 1   node2                failed" in report, report
    assert re.search(r"node 0   node1 +stopped", report) and re.search(
        r"node 2   node3 +stopped", report
    )
    assert "root cause: node 1 on node2, global rank 1 (local rank 0)" in report
    assert "boom on rank 1" in report
    run_no_leak(run_id_of(proc.stderr), timeout=30)
    assert_cluster_idle(slurm_cluster)


# ------------------------------------------------------------------ ending from outside


def test_scancel_ends_a_run_over_srun_and_the_report_says_so(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: NoLeak,
    job: str,
) -> None:
    proc = launch_wait(slurm_cluster, tmp_path, free_port(), job)
    run_id = started_run(proc, tmp_path)
    assert slurm_cluster.run(["scancel", job]).returncode == 0
    rc, _, err = finish(proc)
    assert rc == 1, err
    assert f"root cause: the Slurm job {job} " in err, err
    assert "its Slurm job ended" in err
    ps = run(slurm_cluster, [*SSHDDP, "ps", "--all"], tmp_path)  # the registry keeps why
    assert ps.returncode == 0 and "Slurm job" in ps.stdout, ps.stdout
    run_no_leak(run_id, timeout=30)
    assert_cluster_idle(slurm_cluster)


def test_detached_over_ssh_reattached_then_scancel_stops_it(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: NoLeak,
    job: str,
) -> None:
    """Over SSH the run is not Slurm's, so it can be detached and reattached; the attached
    coordinator watches the job and stops the run when it is cancelled."""
    inv = tmp_path / "inv.yaml"
    doc = {
        "defaults": {"python": sys.executable, "workdir": str(tmp_path / "remote")},
        "hosts": {"slurm": int(job)},
    }
    inv.write_text(yaml.safe_dump(doc))
    cfg = ["--ssh-config", str(slurm_cluster.ssh_config)]
    opts = [*cfg, "--port", str(free_port()), "--env", GLOO, "--name", f"sd{job}"]
    det = run(slurm_cluster, [*SSHDDP, "launch", "--detach", *opts, str(inv), str(WAIT)], tmp_path)
    assert det.returncode == 0, det.stderr
    logs = [tmp_path / "remote" / "runs" / f"sd{job}" / f"n{k}" / "node.log" for k in range(3)]
    wait_until(lambda: all(p.exists() and b"READY" in p.read_bytes() for p in logs), BOUND, "READY")
    attach = start(slurm_cluster, [*SSHDDP, "attach", *cfg, f"sd{job}"], tmp_path)
    assert attach.stderr is not None
    assert "attached to run" in attach.stderr.readline(), attach.communicate()
    assert slurm_cluster.run(["scancel", job]).returncode == 0
    rc, _, err = finish(attach)
    assert rc == 1, err
    assert f"root cause: the Slurm job {job} " in err, err
    run_no_leak(f"sd{job}", timeout=30)


def test_stop_over_srun_leaves_nothing_in_any_step(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: NoLeak,
    job: str,
) -> None:
    """Ctrl-\\ cannot detach a run over srun (it says so and goes on following), nor can
    SIGHUP; ``ps`` and ``logs`` read every node through a step; ``stop`` from another
    terminal ends the run and nothing is left in the job."""
    proc = launch_wait(slurm_cluster, tmp_path, free_port(), job)
    run_id = started_run(proc, tmp_path)
    os.kill(proc.pid, signal.SIGQUIT)
    os.kill(proc.pid, signal.SIGHUP)
    ps = run(slurm_cluster, [*SSHDDP, "ps"], tmp_path)
    assert ps.returncode == 0 and re.search(rf"{run_id}.*running", ps.stdout), ps.stdout
    logs = run(slurm_cluster, [*SSHDDP, "logs", run_id], tmp_path)
    assert logs.returncode == 0 and logs.stdout.count("READY") == 3, logs.stdout
    assert proc.poll() is None, "Ctrl-\\ or SIGHUP detached from a run over srun"
    stop = run(slurm_cluster, [*SSHDDP, "stop", run_id], tmp_path)
    assert stop.returncode == 0, stop.stderr
    rc, out, err = finish(proc)
    nodes = [line for line in err.splitlines() if line.lstrip().startswith("node ")]
    assert rc == 1 and len(nodes) == 3, err
    for line in nodes:  # node K, host, state, reason
        assert line.split()[3] == "stopped" and line.endswith("stopped with `sshddp stop`"), err
    assert "a run over srun cannot be detached" in out
    run_no_leak(run_id, timeout=30)
    no_steps_left(slurm_cluster, job)


def test_a_vanished_coordinator_stops_a_run_over_srun(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: NoLeak,
    job: str,
) -> None:
    """kill -9 of the coordinator: its sruns' stdin closes, each launch session stops its
    node and waits for it, and the steps end; nothing of the run is left in the job."""
    proc = launch_wait(slurm_cluster, tmp_path, free_port(), job)
    run_id = started_run(proc, tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    run_no_leak(run_id, timeout=60)
    no_steps_left(slurm_cluster, job)
    home = Path(os.environ["HOME"])
    reasons = [
        json.loads(p.read_text()).get("reason")
        for p in sorted(home.glob(f".sshddp/runs/{run_id}/n*/exit.json"))
    ]
    assert len(reasons) == 3 and COORDINATOR_GONE in reasons, reasons


# ---------------------------------------------------------------------------- inputs


def test_detach_over_srun_is_refused_before_anything_starts(
    slurm_cluster: SlurmCluster, tmp_path: Path, job: str
) -> None:
    argv = ["launch", "--detach", "--transport", "srun", f"slurm:{job}", str(JOB), "ok"]
    result = sshddp(argv, cli_env(slurm_cluster))
    assert_clean_failure(result, 2)
    assert "--detach: a run over srun cannot outlive this sshddp" in result.err
    no_steps_left(slurm_cluster, job)


def test_a_job_that_does_not_exist_is_a_clear_error(slurm_cluster: SlurmCluster) -> None:
    for command in ("launch", "doctor"):
        args = [command, "slurm:4000000"] + ([str(JOB)] if command == "launch" else [])
        result = sshddp(args, cli_env(slurm_cluster))
        assert_clean_failure(result, 2)
        assert "slurm:4000000: Slurm has no job 4000000" in result.err


def test_outside_an_allocation_slurm_is_a_clear_error(slurm_cluster: SlurmCluster) -> None:
    result = sshddp(["launch", "slurm", str(JOB)], cli_env(slurm_cluster))
    assert_clean_failure(result, 2)
    assert "not inside a Slurm allocation (SLURM_JOB_ID is not set)" in result.err


def test_a_nodelist_that_needs_expansion_gives_nodes_in_order(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """``node[1,3]`` (and ``node[1-3]``): the dry-run plan lists the nodes in nodelist
    order with their NodeAddr, the rendezvous on the first."""
    for ask, names in (
        ("node[1,3]", ["node1", "node3"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
    ):
        proc = run(slurm_cluster, ["salloc", "-w", ask, "--no-shell"], tmp_path, timeout=60)
        job = re.search(r"Granted job allocation (\d+)", proc.stderr)
        assert job, proc.stderr
        try:
            shown = slurm_cluster.run(["scontrol", "show", "job", job.group(1)]).stdout
            assert f"NodeList={ask}" in shown
            result = sshddp(
                ["launch", "--dry-run", f"slurm:{job.group(1)}", str(JOB), "ok"],
                cli_env(slurm_cluster),
            )
            assert result.code == 0, result.explain()
            listed = re.findall(r"^node (\d+): (\S+)", result.out, re.M)
            assert listed == [(str(i), name) for i, name in enumerate(names)]
            first = slurm_cluster.node(int(names[0][-1])).addr
            assert f"rendezvous:  {first}:29500" in result.out
        finally:
            slurm_cluster.run(["scancel", job.group(1)])
    assert_cluster_idle(slurm_cluster)


def test_srun_sshddp_is_refused_in_every_task(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    argv = ["srun", "-N1", "-n2", *SSHDDP, "launch", "slurm", str(JOB), "ok"]
    proc = run(slurm_cluster, argv, tmp_path, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("`srun sshddp ...` starts one sshddp per task") == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert_cluster_idle(slurm_cluster)


# ---------------------------------------------------------------------------- doctor


def test_doctor_over_srun_sees_the_gpus_slurm_binds_to_each_step(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """GPUs as Slurm allocates them (GRES): each step sees its 2, which doctor holds against
    an inventory that says 4, a CUDA_VISIBLE_DEVICES set by hand, and 2 tasks per node."""
    proc = run(
        slurm_cluster,
        ["salloc", "-N3", "--gpus-per-node=2", "--ntasks-per-node=2", "--no-shell"],
        tmp_path,
        timeout=60,
    )
    job = re.search(r"Granted job allocation (\d+)", proc.stderr)
    assert job, proc.stderr
    inv = tmp_path / "inv.yaml"
    doc = {
        "defaults": {
            "python": sys.executable,
            "transport": "srun",
            "gpus": 4,
            "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        },
        "hosts": {"slurm": job.group(1)},
    }
    inv.write_text(yaml.safe_dump(doc))
    try:
        # A subprocess: srun runs with the process's own environment, as over SSH ssh does.
        doctor = run(slurm_cluster, [*SSHDDP, "doctor", "--json", str(inv)], tmp_path)
    finally:
        slurm_cluster.run(["scancel", job.group(1)])
    assert doctor.returncode == 3, doctor.stdout + doctor.stderr
    hosts = json.loads(doctor.stdout)["hosts"]
    assert [h["host"] for h in hosts] == ["node1", "node2", "node3"]
    for h in hosts:
        assert h["facts"]["cuda_visible_devices"] == "0,1"  # Slurm's binding, in the step
        slurm = next(f for f in h["findings"] if f["check"] == "slurm")
        assert slurm["status"] == "fail", slurm
        assert "CUDA_VISIBLE_DEVICES='0,1,2,3' is set by hand" in slurm["message"]
        assert "the job step sees 2 GPU(s), the inventory says 4" in slurm["message"]
    assert_cluster_idle(slurm_cluster)

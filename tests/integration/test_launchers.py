"""Every way users run jobs, for real: Lightning, mp.spawn, accelerate and PyTorch's DDP
tutorial, under torchrun and under ``--launcher node``, through real sshd hosts, gloo on CPU.

The third-party packages are the ones pinned in the ``test`` extra (installed with
``torch==2.13.0`` in one pip command); nothing of them is mocked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from launch_helpers import SSHDDP, Run, cli_env, launch_on, wait_until, write_inventory

from sshddp_lab.sshd import SshdCluster

PAYLOADS = Path(__file__).parent / "payloads"
HOSTS = [1, 2, 3]
WORLD = 6  # 3 hosts x 2 processes
#: A checkout of github.com/pytorch/examples, to run its DDP tutorial file (docs/development.md).
EXAMPLES_VAR = "PYTORCH_EXAMPLES_DIR"
TUTORIAL = Path("distributed/ddp-tutorial-series")


def sshddp_launch(
    cluster: SshdCluster,
    tmp: Path,
    port: int,
    args: list[str],
    opts: list[str] = (),  # type: ignore[assignment]
    timeout: float = 420,
) -> Run:
    return launch_on(cluster, tmp, port, args, opts, HOSTS, timeout=timeout)


#: torch's exit race: a rank that has done its work (and destroyed its process group) can
#: still abort while its interpreter finalizes, gloo's threads outliving it (what
#: pytorch/pytorch#179291 set out to fix). Not sshddp's, and rare; seen here in the
#: accelerate and DDP tutorial runs.
EXIT_ABORT = "terminate called without an active exception"


def launch_expecting_success(
    cluster: SshdCluster,
    tmp: Path,
    free_port: Callable[[], int],
    args: list[str],
    opts: list[str] = (),  # type: ignore[assignment]
) -> Run:
    """``sshddp_launch`` of a run that must succeed. One whose only fault was torch's exit
    race (``EXIT_ABORT`` in the report, a rank killed by SIGABRT) runs once more, in a
    directory of its own; any other failure, or that one twice, fails the test."""
    run = sshddp_launch(cluster, tmp, free_port(), args, opts)
    if run.rc != 0 and EXIT_ABORT in run.stderr and "killed by SIGABRT" in run.stderr:
        print(f"torch's exit race; running once more. The first run's report:\n{run.stderr}")
        again = tmp / "again"
        again.mkdir()
        run = sshddp_launch(cluster, again, free_port(), args, opts)
    assert "not distributed" not in run.stderr, run.stderr  # every way formed one world
    return run


def records(run: Run, key: str) -> list[tuple[int, dict[str, Any]]]:
    """(node, record) of every JSON line with ``key`` in the nodes' local logs."""
    return [(n, r) for n in range(len(HOSTS)) for r in run.json_lines(n) if key in r]


def assert_every_rank_trained(run: Run, key: str, rank_key: str = "rank") -> None:
    assert run.rc == 0, run.stderr[-4000:]
    found = records(run, key)
    ranks = sorted(r[rank_key] for _, r in found)
    assert ranks == list(range(WORLD)), found
    for node, r in found:
        assert r["world_size"] == WORLD and r["sum"] == WORLD * (WORLD + 1) / 2, r
        assert r["weights_agree"], r
        assert r[rank_key] // 2 == node, (node, r)  # global ranks 2k, 2k+1 on node k


# --------------------------------------------------------------------------- Lightning


@pytest.mark.slow
def test_lightning_trainer_as_node_launcher_spawns_its_workers(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run = launch_expecting_success(
        ssh_env,
        tmp_path,
        free_port,
        [str(PAYLOADS / "lightning_job.py"), "3"],
        opts=["--launcher", "node"],
    )
    assert_every_rank_trained(run, "lightning", "global_rank")
    for node, r in records(run, "lightning"):
        assert r["node_rank"] == node and r["steps"] > 0, r


@pytest.mark.slow
def test_lightning_trainer_under_torchrun(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run = launch_expecting_success(
        ssh_env, tmp_path, free_port, [str(PAYLOADS / "lightning_job.py"), "3"]
    )
    assert_every_rank_trained(run, "lightning", "global_rank")
    for node, r in records(run, "lightning"):
        assert r["node_rank"] == node and r["steps"] > 0, r


# ------------------------------------------------------------------------------ mp.spawn


@pytest.mark.slow
def test_spawn_trainer_computes_its_rank_from_node_rank(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run = launch_expecting_success(
        ssh_env, tmp_path, free_port, [str(PAYLOADS / "spawn_job.py")], ["--launcher", "node"]
    )
    assert_every_rank_trained(run, "spawn")
    for node, r in records(run, "spawn"):
        assert r["node_rank"] == node and r["rank"] == 2 * node + r["local_rank"], r
    # the workers have no RANK, yet each node's exit record says both joined the world
    for node in range(len(HOSTS)):
        path = run.workdir / "runs" / run.run_id / f"n{node}" / "exit.json"
        world = json.loads(path.read_text())["world"]
        assert (world["joined"], world["sizes"]) == (2, [2 * len(HOSTS)] * 2), world


@pytest.mark.slow
def test_node_launcher_teardown_when_a_worker_of_node_2_raises(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Node 2's mp.spawn worker 1 raises; every launcher, worker and setsid'd grandchild of
    every node goes; the report names node 2, the worker, and shows its traceback."""
    run = sshddp_launch(
        ssh_env,
        tmp_path,
        free_port(),
        [str(PAYLOADS / "spawn_job.py"), "--fail", "2:1", "--sleeper"],
        ["--launcher", "node", "--grace", "3"],
    )
    assert run.rc == 1, run.stderr[-4000:]
    assert re.search(r"root cause: node 2 on h3, local rank 1 \(as mp\.spawn says\)", run.stderr)
    assert "RuntimeError: worker 1 of node 2 failed on purpose" in run.stderr
    sleepers = [r["sleeper"] for _, r in records(run, "sleeper")]
    assert len(sleepers) == WORLD  # each worker started one, in its own session
    run_no_leak(run.run_id)
    assert not [pid for pid in sleepers if alive(pid)]


def alive(pid: int) -> bool:
    """A process that is there and not a zombie (its parent may not have reaped it yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


# ---------------------------------------------------------------------------- accelerate


@pytest.mark.slow
def test_accelerate_launch_multi_machine_through_placeholders(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    command = [
        "accelerate",
        "launch",
        "--multi_gpu",  # accelerate's torchrun launcher; on CPU it trains as MULTI_CPU
        "--num_machines",
        "{nnodes}",
        "--machine_rank",
        "{node_rank}",
        "--main_process_ip",
        "{master_addr}",
        "--main_process_port",
        "{master_port}",
        "--num_processes",
        "{world_size}",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "accelerate_job.py",
    ]
    opts = ["--launcher", "node", "--workdir", str(PAYLOADS)]
    run = launch_expecting_success(ssh_env, tmp_path, free_port, ["--", *command], opts)
    assert_every_rank_trained(run, "accelerate")
    for node, r in records(run, "accelerate"):
        assert r["machine_rank"] == node and r["distributed_type"].endswith("MULTI_CPU"), r


# ------------------------------------------------------------------ PyTorch's DDP tutorial


def assert_tutorial_trained(run: Run, epochs: int) -> None:
    """What the tutorial prints: every global rank, every epoch, 2048 / 6 ranks / 32 a batch
    = 11 steps; rank 0's snapshots."""
    assert run.rc == 0, run.stderr[-4000:]
    lines = [line for n in range(len(HOSTS)) for line in run.local_log(n).read_text().splitlines()]
    seen = {
        (int(m[1]), int(m[2]))
        for line in lines
        if (m := re.fullmatch(r"\[GPU(\d+)\] Epoch (\d+) \| Batchsize: 32 \| Steps: 11", line))
    }
    assert seen == {(r, e) for r in range(WORLD) for e in range(epochs)}, lines[-40:]
    saved = [line for line in lines if "Training snapshot saved at snapshot.pt" in line]
    assert len(saved) == epochs, saved  # save_every 1, rank 0 only


@pytest.mark.slow
def test_ddp_tutorial_contract_under_torchrun(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run = launch_expecting_success(
        ssh_env, tmp_path, free_port, [str(PAYLOADS / "ddp_tutorial.py"), "2", "1"]
    )
    assert_tutorial_trained(run, 2)


#: The smallest change that runs the tutorial on CPU: gloo for nccl, and no CUDA device.
#: Each edit must match exactly once, so a change upstream fails here rather than slipping by.
CPU_EDITS = (
    ('    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n', ""),
    ('init_process_group(backend="nccl")', 'init_process_group(backend="gloo")'),
    ("self.model = model.to(self.local_rank)", "self.model = model"),
    ("DDP(self.model, device_ids=[self.local_rank])", "DDP(self.model)"),
    ("source = source.to(self.local_rank)", "source = source"),
    ("targets = targets.to(self.local_rank)", "targets = targets"),
    ('loc = f"cuda:{self.local_rank}"', 'loc = "cpu"'),
)


def tutorial_on_cpu(examples: Path, dest: Path) -> Path:
    """The upstream tutorial's files, with ``CPU_EDITS`` applied, in ``dest``."""
    dest.mkdir()
    source = (examples / TUTORIAL / "multinode.py").read_text()
    for old, new in CPU_EDITS:
        assert source.count(old) == 1, f"upstream multinode.py changed: {old!r}"
        source = source.replace(old, new)
    (dest / "multinode.py").write_text(source)
    shutil.copy(examples / TUTORIAL / "datautils.py", dest / "datautils.py")
    return dest


@pytest.mark.slow
def test_pytorch_ddp_tutorial_multinode_py_under_torchrun(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """The real ``multinode.py`` of pytorch/examples (copied unchanged into
    payloads/pytorch_examples, or the checkout at $PYTORCH_EXAMPLES_DIR when set): its CPU
    edits are ``CPU_EDITS``, nothing else."""
    examples = Path(os.environ.get(EXAMPLES_VAR) or PAYLOADS / "pytorch_examples")
    code = tutorial_on_cpu(examples, tmp_path / "tutorial")
    args = ["multinode.py", "2", "1"]
    run = launch_expecting_success(ssh_env, tmp_path, free_port, args, ["--workdir", str(code)])
    assert_tutorial_trained(run, 2)


@pytest.mark.slow
def test_node_launcher_detach_ps_logs_stop(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """A detached node-launcher run: ps reads it live, logs fetches it, stop ends every
    launcher, worker and setsid'd grandchild on every host."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), HOSTS, nproc=2)
    job = [str(PAYLOADS / "spawn_job.py"), "--sleeper", "--hold", "600"]
    argv = ["launch", "--launcher", "node", "--detach", "--name", "nd", str(inv), *job]
    started = sshddp_cli(ssh_env, tmp_path, *argv)
    assert started.returncode == 0, started.stderr
    logs = [workdir / "runs" / "nd" / f"n{k}" / "node.log" for k in range(3)]
    wait_until(
        lambda: all(p.exists() and p.read_text().count('"spawn"') == 2 for p in logs),
        240,
        "every worker to train",
    )
    ps = sshddp_cli(ssh_env, tmp_path, "ps")
    running = [f"{k}:running(0/2 joined, quiet " for k in range(3)]  # no init_process_group
    assert "nd" in ps.stdout and all(r in ps.stdout for r in running), ps.stdout
    fetched = sshddp_cli(ssh_env, tmp_path, "logs", "nd", "--node", "2")
    assert fetched.stdout.count('"spawn": true') == 2, fetched.stdout
    sleepers = [int(m) for p in logs for m in re.findall(r'"sleeper": (\d+)', p.read_text())]
    assert len(sleepers) == WORLD
    stopped = sshddp_cli(ssh_env, tmp_path, "stop", "nd")
    assert stopped.returncode == 0 and stopped.stdout.count(": stopped") == 3, stopped.stdout
    run_no_leak("nd")
    assert not [pid for pid in sleepers if alive(pid)]


def sshddp_cli(cluster: SshdCluster, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SSHDDP, *args], cwd=cwd, env=cli_env(cluster), capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_lightning_node_launcher_teardown_when_a_worker_of_node_2_raises(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Lightning's worker 1 of node 2 raises as training starts: node 2 fails (Lightning's
    observer kills the node's processes), every Lightning process of every node goes, and
    the report names that worker and shows its traceback."""
    run = sshddp_launch(
        ssh_env,
        tmp_path,
        free_port(),
        [str(PAYLOADS / "lightning_job.py"), "3", "--fail", "2:1"],
        ["--launcher", "node", "--grace", "3"],
    )
    assert run.rc == 1, run.stderr[-4000:]
    # Lightning's observer names the worker; torch prefixes its traceback `[rank5]:`.
    cause = "root cause: node 2 on h3, local rank 1 (as Lightning says)"
    assert cause in run.stderr, run.stderr[-4000:]
    assert "[rank5]: RuntimeError: Lightning worker 2:1 failed on purpose\n---" in run.stderr
    run_no_leak(run.run_id)


# --------------------------------------------------------------------------------- -H


@pytest.mark.slow
def test_host_list_on_the_command_line_doctor_and_launch(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """`-H h1:2,h2:1 --python PY`: doctor checks those hosts, launch runs 3 ranks there,
    NODE_RANK set on each node of a torchrun launch."""
    port = free_port()
    hosts = ["-H", "h1:2,h2:1", "--python", sys.executable]
    doctor = sshddp_cli(ssh_env, tmp_path, "doctor", *hosts, "--port", str(port))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "All checks passed on 2 host(s)." in doctor.stdout
    job = [str(PAYLOADS / "env_job.py")]
    opts = ["--env", "GLOO_SOCKET_IFNAME=lo", "--port", str(port), "--name", "hl"]
    run = sshddp_cli(ssh_env, tmp_path, "launch", *hosts, *opts, *job)
    assert run.returncode == 0, run.stderr
    logs = sorted((tmp_path / "sshddp-logs" / "hl").glob("node*.log"))
    lines = [line for p in logs for line in p.read_text().splitlines()]
    found = [json.loads(line) for line in lines if line.startswith("{")]
    assert sorted((r["RANK"], r["WORLD_SIZE"], r["GROUP_RANK"]) for r in found) == [
        ("0", "3", "0"),
        ("1", "3", "0"),
        ("2", "3", "1"),
    ]
    assert all(r["NODE_RANK"] == r["GROUP_RANK"] for r in found)

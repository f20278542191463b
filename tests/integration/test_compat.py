"""Third-party programs as their own docs write them, on real sshd hosts with real torchrun
and gloo: the verdict sshddp gives must be what happened (distributed for real, the right
rank blamed, every rank's lines in the local logs, nothing left running).

The README's *Works with* table lists these programs and their commands. Lightning,
``mp.spawn``, accelerate's command-line flags and PyTorch's DDP tutorial run in
test_launchers.py; a ``torch.distributed.launch``-era script in test_torchrun_options.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import pytest
from launch_helpers import (
    Run,
    assert_one_failure_one_traceback,
    launch_on,
    sshddp,
    write_inventory,
)
from test_watchdogs import wait_finished

from sshddp_lab.sshd import SshdCluster

PAYLOADS = Path(__file__).parent / "payloads"
HOSTS = [1, 2]
WORLD = 4  # 2 hosts x 2 processes
NOT_DISTRIBUTED = "not distributed"


def launch(
    cluster: SshdCluster, tmp: Path, port: int, args: list[str], opts: Sequence[str] = ()
) -> Run:
    return launch_on(cluster, tmp, port, args, opts, HOSTS)


def records(run: Run, key: str) -> list[tuple[int, dict[str, Any]]]:
    """(node, record) of every JSON line with ``key`` in the nodes' local logs (the
    Trainer's own log lines are Python dicts, not JSON: ``{'loss': ...}``)."""
    found = []
    for node in range(len(HOSTS)):
        for line in run.local_log(node).read_text(encoding="utf-8").splitlines():
            if line.startswith('{"') and key in (record := json.loads(line)):
                found.append((node, record))
    return found


def assert_distributed(run: Run, key: str) -> list[dict[str, Any]]:
    """Every global rank reported once, from its own node, and all of them trained as one
    job: the all-reduce of rank + 1 is 1 + ... + WORLD and the weights agree."""
    assert run.rc == 0, run.stderr[-4000:]
    assert NOT_DISTRIBUTED not in run.stderr, run.stderr[-4000:]
    found = records(run, key)
    assert sorted(r["rank"] for _, r in found) == list(range(WORLD)), found
    for node, r in found:
        assert r["rank"] // 2 == node, (node, r)
        assert r["sum"] == WORLD * (WORLD + 1) / 2 and r["weights_agree"], r
    return [r for _, r in found]


def assert_reported_alone(run: Run, key: str) -> list[dict[str, Any]]:
    """Every process ran to its end, alone: the report must say so, not just "succeeded"."""
    found = records(run, key)
    assert sorted(r["rank"] for _, r in found) == list(range(WORLD)), found
    assert NOT_DISTRIBUTED in run.stderr, run.stderr[-4000:]
    return [r for _, r in found]


# ------------------------------------------------------------------------- transformers


@pytest.mark.slow
def test_transformers_trainer_trains_across_nodes(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    run = launch(ssh_env, tmp_path, free_port(), [str(PAYLOADS / "hf_trainer.py"), "--use-cpu"])
    for r in assert_distributed(run, "trainer"):
        assert r["world_size"] == WORLD and r["parallel_mode"].endswith("DISTRIBUTED"), r
        assert r["steps"] == 4, r
    run_no_leak(run.run_id)


@pytest.mark.slow
def test_transformers_trainer_on_cpu_hosts_without_use_cpu_is_reported_not_distributed(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Without ``use_cpu=True`` a Trainer on CPU hosts trains one copy per process (its
    ``world_size`` is 1), though torchrun started them together."""
    run = launch(ssh_env, tmp_path, free_port(), [str(PAYLOADS / "hf_trainer.py")])
    for r in assert_reported_alone(run, "trainer"):
        assert r["world_size"] == 1 and r["parallel_mode"].endswith("NOT_PARALLEL"), r
    run_no_leak(run.run_id)


@pytest.mark.slow
def test_transformers_trainer_failing_rank_is_blamed(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Global rank 3 (node 1, local rank 1) raises at step 2: the report blames it and
    shows its error; every process of the run goes."""
    args = [str(PAYLOADS / "hf_trainer.py"), "--use-cpu", "--fail", "3"]
    run = launch(ssh_env, tmp_path, free_port(), args, ("--grace", "3"))
    assert run.rc == 1, run.stderr[-4000:]
    assert "root cause: node 1 on h2" in run.stderr, run.stderr[-4000:]
    assert "RuntimeError: Trainer rank 3 failed on purpose" in run.stderr, run.stderr[-4000:]
    assert "Trainer rank 3 failed on purpose" in run.local_log(1).read_text()
    run_no_leak(run.run_id)


# --------------------------------------------------------------------------- accelerate

#: The multi-machine config file of accelerate's launch tutorial ("Launching your
#: distributed code"), as `accelerate config` writes it, with this lab's numbers. The
#: values that differ by machine come from the command line, through sshddp's placeholders.
ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
machine_rank: 0
main_process_ip: 127.0.0.1
main_process_port: 29500
main_training_function: main
mixed_precision: 'no'
num_machines: 2
num_processes: 4
rdzv_backend: static
same_network: true
use_cpu: false
"""

ACCELERATE_COMMAND = [
    "--",
    "accelerate",
    "launch",
    "--config_file",
    "accelerate.yaml",
    "--machine_rank",
    "{node_rank}",
    "--main_process_ip",
    "{master_addr}",
    "--main_process_port",
    "{master_port}",
    "accelerate_docs.py",
]


def accelerate_code(tmp: Path) -> Path:
    code = tmp / "code"
    code.mkdir()
    shutil.copy(PAYLOADS / "accelerate_docs.py", code)
    (code / "accelerate.yaml").write_text(ACCELERATE_CONFIG)
    return code


@pytest.mark.slow
def test_accelerate_launch_with_its_config_file_and_use_cpu(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """The fix the report gives for CPU hosts, ``--env ACCELERATE_USE_CPU=1``, makes the
    same config file and script one job of 4 processes."""
    code = accelerate_code(tmp_path)
    opts = ["--launcher", "node", "--workdir", str(code), "--env", "ACCELERATE_USE_CPU=1"]
    run = launch(ssh_env, tmp_path, free_port(), ACCELERATE_COMMAND, opts)
    for r in assert_distributed(run, "accelerate"):
        assert r["num_processes"] == WORLD and r["distributed_type"].endswith("MULTI_CPU"), r
        assert r["machine_rank"] == r["rank"] // 2, r
    run_no_leak(run.run_id)


@pytest.mark.slow
def test_accelerate_config_for_gpus_on_cpu_hosts_is_reported_not_distributed(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """accelerate's GPU config on CPU hosts: every process trains alone
    (``DistributedType.NO``, one process), and the report says so, with the fix."""
    code = accelerate_code(tmp_path)
    opts = ["--launcher", "node", "--workdir", str(code)]
    run = launch(ssh_env, tmp_path, free_port(), ACCELERATE_COMMAND, opts)
    for r in assert_reported_alone(run, "accelerate"):
        assert r["num_processes"] == 1 and r["distributed_type"].endswith(".NO"), r
    assert "ACCELERATE_USE_CPU=1" in run.stderr, run.stderr[-4000:]
    run_no_leak(run.run_id)


# ------------------------------------------------------------- Lightning, a failing rank


@pytest.mark.slow
def test_lightning_failing_rank_console_shows_one_traceback(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Under torchrun, Lightning's rank 3 raises in its third step while the others
    all-reduce their gradients: they die of its death, each with Lightning's long traceback
    (87 lines a victim, 620 console lines before). The console shows rank 3's whole and one
    line per victim; the logs keep every byte."""
    job = [str(PAYLOADS / "lightning_job.py"), "2", "--fail-in-step", "1:1"]
    run = launch(ssh_env, tmp_path, free_port(), job, ["--name", "lfail"])
    assert run.rc == 1, run.stderr[-4000:]
    assert "root cause: node 1 on h2, global rank 3 " in run.stderr, run.stderr[-4000:]
    failed = "[rank3]: RuntimeError: Lightning worker 1:1 failed in a step on purpose"
    lines = run.stdout.splitlines()
    assert_one_failure_one_traceback(run, len(HOSTS), "rank 3")
    # Lightning's own traceback is long (about 90 lines); the rest of the console is short.
    start = lines.index("[3 h2]   [rank3]: Traceback (most recent call last):")
    end = next(i for i, line in enumerate(lines) if line.endswith(failed))
    assert start < end and len(lines) - (end + 1 - start) <= 35, run.stdout
    for node in range(len(HOSTS)):
        assert run.local_log(node).read_bytes() == run.remote_log(node).read_bytes(), node
    run_no_leak(run.run_id)


# ------------------------------------------------------------------ Lightning, detached


@pytest.mark.slow
def test_lightning_detached_with_no_terminal_is_quiet_not_stalled(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Detached, no terminal: Lightning's rich bar prints nothing while 2 hosts x 2 ranks
    train for 25 s, under --stall-timeout 8. The ranks work (their stacks and CPU time
    move), so the watchdog leaves the run alone; it succeeds."""
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), HOSTS)
    job = [str(PAYLOADS / "lightning_quiet.py"), "2", "25"]
    opts = ["--detach", "--name", "lq", "--stall-timeout", "8"]
    started = sshddp(ssh_env, tmp_path, "launch", *opts, str(inv), *job)
    assert started.returncode == 0, started.stderr
    row = wait_finished(ssh_env, tmp_path, "lq", 240)
    assert [n["state"] for n in row["nodes"]] == ["succeeded"] * 2, row
    done = sshddp(ssh_env, tmp_path, "logs", "lq")
    lines = [line for line in done.stdout.splitlines() if '{"quiet"' in line]
    steps = [json.loads(line[line.index("{") :]) for line in lines]
    assert sorted(r["rank"] for r in steps) == list(range(WORLD)), done.stdout
    run_no_leak("lq")

"""doctor's Slurm checks (model/checks.py ``_slurm``): hand-built facts of a job's nodes.

The mistakes our users made with Slurm: a GPU count the step sees that differs from the
inventory, CUDA_VISIBLE_DEVICES set by hand, and a job sized for one torchrun per GPU.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from test_checks import CTX, gpu_facts

from sshddp.model.checks import Finding, HostFacts, Status, evaluate, visible_gpus
from sshddp.model.inventory import Host, Transport


def slurm_finding(
    host: Host, facts: dict[str, Any], cvd: Optional[str] = None
) -> Optional[Finding]:
    facts = {**facts, "cuda_visible_devices": cvd}
    report = evaluate([HostFacts(host, facts)], CTX)[0]
    return report.get("slurm")


def node(
    gpus: Optional[int] = 2,
    tasks: int = 1,
    transport: Transport = "srun",
    env: Optional[dict[str, str]] = None,
) -> Host:
    return Host(
        "node1",
        0,
        gpus=gpus,
        nproc=tasks,
        slurm_job="42",
        transport=transport,
        env=env or {},
    )


def test_a_host_outside_slurm_has_no_slurm_check() -> None:
    assert slurm_finding(Host("gpu-a", 0, gpus=2), gpu_facts(gpus=2)) is None


def test_a_step_that_sees_its_gpus_passes() -> None:
    found = slurm_finding(node(gpus=2), gpu_facts(gpus=8), cvd="0,1")
    assert found == Finding("slurm", Status.OK, "job 42: 2 GPU(s) visible")


def test_a_cpu_node_passes() -> None:
    found = slurm_finding(node(gpus=None, tasks=3), gpu_facts(gpus=0, cuda=None))
    assert found == Finding("slurm", Status.OK, "job 42: CPU node, 3 process(es)")


def test_a_step_seeing_fewer_gpus_than_the_inventory_fails() -> None:
    found = slurm_finding(node(gpus=4), gpu_facts(gpus=8), cvd="0,1")
    assert found is not None and found.status is Status.FAIL
    assert found.message == "the job step sees 2 GPU(s), the inventory says 4"
    assert "--gpus-per-node=4" in found.fix


def test_an_ssh_session_seeing_the_whole_node_fails() -> None:
    found = slurm_finding(node(gpus=2, transport="ssh"), gpu_facts(gpus=8))
    assert found is not None and found.status is Status.FAIL
    assert found.message == "an SSH session sees 8 GPU(s), the inventory says 2"
    assert "use transport: srun" in found.fix


@pytest.mark.parametrize("where", ["inventory", "shell"])
def test_cuda_visible_devices_set_by_hand_fails(where: str) -> None:
    if where == "inventory":
        host = node(gpus=2, env={"CUDA_VISIBLE_DEVICES": "0,1"})
        found = slurm_finding(host, gpu_facts(gpus=8), cvd="2,3")  # Slurm's, in the step
    else:  # an SSH session that has one: the shell's startup files set it
        found = slurm_finding(node(gpus=2, transport="ssh"), gpu_facts(gpus=8), cvd="0,1")
    assert found is not None and found.status is Status.FAIL
    assert found.message.startswith("CUDA_VISIBLE_DEVICES='0,1' is set by hand")
    assert "remove CUDA_VISIBLE_DEVICES" in found.fix


def test_one_task_per_gpu_is_a_warning() -> None:
    found = slurm_finding(node(gpus=4, tasks=4), gpu_facts(gpus=8), cvd="0,1,2,3")
    assert found is not None and found.status is Status.WARN
    assert "would start 4 torchruns here, one per GPU" in found.message
    assert "--ntasks-per-node=1" in found.fix


def test_every_problem_is_named_at_once() -> None:
    host = node(gpus=4, tasks=4, env={"CUDA_VISIBLE_DEVICES": "0"})
    found = slurm_finding(host, gpu_facts(gpus=8), cvd="0,1")
    assert found is not None and found.status is Status.FAIL
    assert "set by hand" in found.message and "sees 2 GPU(s)" in found.message


@pytest.mark.parametrize(
    ("cvd", "count"), [(None, 8), ("", 0), ("NoDevFiles", 0), ("0", 1), ("GPU-a,GPU-b", 2)]
)
def test_visible_gpus(cvd: Optional[str], count: int) -> None:
    assert visible_gpus({**gpu_facts(gpus=8), "cuda_visible_devices": cvd}) == count

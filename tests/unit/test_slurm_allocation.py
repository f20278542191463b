"""A Slurm allocation as an inventory (model/allocation.py), from what Slurm prints.

The ``scontrol -o show job -d`` records below are verbatim output of Slurm 22.05 (the test
lab's cluster, ``sshddp_lab.slurm`` with ``gpus=4``) for the salloc options in each name;
the integration tests check the same parser against live jobs.
"""

from __future__ import annotations

import re
from typing import Optional

import pytest

from sshddp.errors import ExitCode, InventoryError, UsageError
from sshddp.model.allocation import (
    Allocation,
    AllocNode,
    allocation_hosts,
    check_not_in_step,
    current_job,
    gres_gpus,
    job_ended,
    parse_job,
    parse_node_addrs,
    refuse_detach,
    valid_job_id,
    with_transport,
)
from sshddp.model.inventory import Host, Inventory, Rendezvous, SlurmRequest

HEAD = (
    "JobId={job} JobName=no-shell UserId=root(0) GroupId=root(0) MCS_label=N/A "
    "Priority=4294901752 Nice=0 Account=(null) QOS=(null) JobState={state} Reason={reason} "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0 "
    "DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-23T22:44:26 EligibleTime=2026-11-23T22:44:26 AccrueTime=Unknown "
    "StartTime=2026-11-23T22:44:26 EndTime=Unknown Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-23T22:44:26 Scheduler=Main Partition=debug "
    "AllocNode:Sid=localhost:24895 ReqNodeList=(null) ExcNodeList=(null) "
)
TAIL = (
    " MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
    "WorkDir=/tmp/i14s Power= "
)


def record(body: str, job: str = "8", state: str = "RUNNING", reason: str = "None") -> str:
    return HEAD.format(job=job, state=state, reason=reason) + body + TAIL


# salloc -N3 --gpus=5: three GPUs on the first node, one on each of the others.
GPUS_5 = record(
    "NodeList=node[1-3] BatchHost=node1 NumNodes=3 NumCPUs=3 NumTasks=3 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=3,node=3,billing=3 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* JOB_GRES=gpu:5   Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:3(IDX:0-2)   "
    "Nodes=node[2-3] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)"
)
# salloc -N3 -n5: CPU tasks 3,1,1.
TASKS_5 = record(
    "NodeList=node[1-3] BatchHost=node1 NumNodes=3 NumCPUs=5 NumTasks=5 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=5,node=3,billing=5 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* JOB_GRES=(null)   Nodes=node1 CPU_IDs=0-2 Mem=0 GRES=   Nodes=node[2-3] "
    "CPU_IDs=0 Mem=0 GRES=",
    job="9",
)
# salloc -N3 --ntasks-per-node=2 --cpus-per-task=2
PER_NODE_2 = record(
    "NodeList=node[1-3] BatchHost=node1 NumNodes=3 NumCPUs=12 NumTasks=6 CPUs/Task=2 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=12,node=3,billing=12 Socks/Node=* NtasksPerN:B:S:C=2:0:*:* "
    "CoreSpec=* JOB_GRES=(null)   Nodes=node[1-3] CPU_IDs=0-3 Mem=0 GRES=",
    job="10",
)
# salloc -N2 --gpus-per-node=4 --ntasks-per-node=4 (one task per GPU)
TASK_PER_GPU = record(
    "NodeList=node[1-2] BatchHost=node1 NumNodes=2 NumCPUs=8 NumTasks=8 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=8,node=2,billing=8 Socks/Node=* NtasksPerN:B:S:C=4:0:*:* "
    "CoreSpec=* JOB_GRES=gpu:8   Nodes=node[1-2] CPU_IDs=0-3 Mem=0 GRES=gpu:4(IDX:0-3)",
    job="5",
)
NODES = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 "
    "CPULoad=11.44 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:4 "
    "NodeAddr=10.228.160.1 NodeHostName=node1 Version=22.05.8 State=IDLE\n"
    "NodeName=node3 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 "
    "CPULoad=11.06 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:4 "
    "NodeAddr=10.228.160.3 NodeHostName=node3 Version=22.05.8 State=IDLE\n"
)


def counts(alloc: Allocation) -> list[tuple[str, int, int]]:
    return [(n.name, n.gpus, n.tasks) for n in alloc.nodes]


@pytest.mark.parametrize(
    ("text", "job", "tasks", "expected", "per_node"),
    [
        (GPUS_5, "8", None, [("node1", 3, 1), ("node2", 1, 1), ("node3", 1, 1)], 0),
        (TASKS_5, "9", None, [("node1", 0, 3), ("node2", 0, 1), ("node3", 0, 1)], 0),
        (TASKS_5, "9", "3,1(x2)", [("node1", 0, 3), ("node2", 0, 1), ("node3", 0, 1)], 0),
        (PER_NODE_2, "10", None, [(f"node{i}", 0, 2) for i in (1, 2, 3)], 2),
        (TASK_PER_GPU, "5", "4(x2)", [("node1", 4, 4), ("node2", 4, 4)], 4),
    ],
    ids=["gpus-uneven", "tasks-from-cpus", "tasks-from-env", "ntasks-per-node", "task-per-gpu"],
)
def test_parse_job_gives_nodes_in_order_with_their_counts(
    text: str, job: str, tasks: Optional[str], expected: list[tuple[str, int, int]], per_node: int
) -> None:
    alloc = parse_job(text, job, tasks)
    assert alloc.job_id == job
    assert counts(alloc) == expected
    assert alloc.tasks_per_node == per_node


def test_the_multi_line_form_reads_the_same() -> None:
    multi = GPUS_5.replace("   Nodes=", "\n     Nodes=").replace(" MinCPUsNode", "\n   MinCPUsNode")
    assert counts(parse_job(multi, "8")) == counts(parse_job(GPUS_5, "8"))


def test_tasks_from_the_environment_must_match_the_node_count() -> None:
    with pytest.raises(InventoryError, match=r"SLURM_TASKS_PER_NODE='2\(x2\)' gives 2 counts"):
        parse_job(TASKS_5, "9", "2(x2)")


@pytest.mark.parametrize(
    ("state", "reason", "says"),
    [
        ("PENDING", "Resources", "is PENDING (Reason=Resources), not RUNNING"),
        ("COMPLETED", "None", "is COMPLETED, not RUNNING"),
        ("CANCELLED", "None", "is CANCELLED, not RUNNING"),
    ],
)
def test_a_job_that_does_not_run_is_refused(state: str, reason: str, says: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_job(record("NodeList=(null) NumNodes=1", "77", state, reason), "77")
    assert f"Slurm job 77 {says}" in info.value.message
    assert info.value.exit_code == ExitCode.BAD_INPUT


def test_a_node_without_a_detail_line_is_refused() -> None:
    text = GPUS_5.replace("Nodes=node[2-3] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)", "")
    with pytest.raises(InventoryError, match="no CPU/GRES line for node2, node3"):
        parse_job(text, "8")


def test_two_records_are_refused() -> None:
    with pytest.raises(InventoryError, match="described 2 jobs"):
        parse_job(GPUS_5 + "\n" + TASKS_5, "8")


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("", 0),
        ("(null)", 0),
        ("gpu:2(IDX:0-1)", 2),
        ("gpu:a100:2(IDX:0-1)", 2),
        ("gpu:a100:2(IDX:0-1),nic:1(IDX:0)", 2),
        ("nic:1,gpu:tesla:1(IDX:3),gpu:v100:2(IDX:0,2)", 3),
        ("gpu(IDX:0,2-3)", 3),
        ("gpu:0", 0),
        ("mps:100", 0),
    ],
)
def test_gres_gpus(text: str, gpus: int) -> None:
    assert gres_gpus(text) == gpus


def test_unreadable_gres_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"cannot read the GRES 'gpu:2:x:y'"):
        gres_gpus("gpu:2:x:y", "Slurm job 1")


def test_node_addresses() -> None:
    assert parse_node_addrs(NODES) == {"node1": "10.228.160.1", "node3": "10.228.160.3"}


# ------------------------------------------------------------------------ job ids


@pytest.mark.parametrize("job", ["1", "123456", "123456_7"])
def test_valid_job_ids(job: str) -> None:
    assert valid_job_id(job, "slurm:" + job) == job


@pytest.mark.parametrize("job", ["", "abc", "12a", "-1", "1 2", "123+0", "1;rm"])
def test_invalid_job_ids(job: str) -> None:
    with pytest.raises(InventoryError, match=re.escape(f"slurm:{job}: {job!r} is not a Slurm")):
        valid_job_id(job, f"slurm:{job}")


def test_current_job_needs_an_allocation() -> None:
    assert current_job({"SLURM_JOB_ID": "42"}, "slurm") == "42"
    assert current_job({"SLURM_JOBID": "43"}, "slurm") == "43"
    with pytest.raises(InventoryError, match=r"not inside a Slurm allocation \(SLURM_JOB_ID"):
        current_job({}, "slurm")


def test_running_as_one_of_many_step_tasks_is_refused() -> None:
    step = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8"}
    with pytest.raises(UsageError, match=r"task 3 of 8 of job step 7\.0: `srun sshddp"):
        check_not_in_step({**step, "SLURM_PROCID": "3"})
    check_not_in_step({**step, "SLURM_STEP_NUM_TASKS": "1"})  # one task: fine
    check_not_in_step({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "8"})  # a batch script: no step


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ("RUNNING", None),
        ("SUSPENDED", None),
        ("CANCELLED", "the Slurm job 5 was cancelled (scancel)"),
        ("CANCELLED+", "the Slurm job 5 was cancelled (scancel)"),
        ("TIMEOUT", "the Slurm job 5 reached its time limit"),
        ("COMPLETING", "the Slurm job 5 is ending (COMPLETING"),
        ("COMPLETED", "the Slurm job 5 has ended (COMPLETED)"),
        (None, "the Slurm job 5 has ended (the controller no longer knows it)"),
    ],
)
def test_job_ended(state: Optional[str], says: Optional[str]) -> None:
    cause = job_ended("5", state)
    assert (cause is None) if says is None else (cause is not None and cause.startswith(says))


# ------------------------------------------------------------------ as an inventory


def test_allocation_hosts_apply_the_defaults() -> None:
    alloc = Allocation(
        "8", (AllocNode("node1", 3, 1, "10.0.0.1"), AllocNode("node2", 0, 2, "10.0.0.2"))
    )
    request = SlurmRequest(
        "current",
        "inv.yaml",
        4,
        {"python": "/opt/venv/bin/python", "env": {"A": "1"}, "transport": "srun"},
    )
    hosts = allocation_hosts(alloc, request)
    assert [(h.host, h.index, h.gpus, h.nproc, h.procs, h.addr) for h in hosts] == [
        ("node1", 0, 3, 1, 3, "10.0.0.1"),
        ("node2", 1, None, 2, 2, "10.0.0.2"),
    ]
    assert {(h.python, h.transport, h.slurm_job, h.line) for h in hosts} == {
        ("/opt/venv/bin/python", "srun", "8", 4)
    }
    assert all(dict(h.env) == {"A": "1"} for h in hosts)
    gpus = allocation_hosts(alloc, SlurmRequest("8", "x", 0, {"gpus": 4}))
    assert [h.gpus for h in gpus] == [4, 4]  # the inventory's word wins; doctor checks it


def test_transport_srun_needs_slurm_hosts() -> None:
    plain = Inventory("inv.yaml", (Host("a", 0),), Rendezvous())
    assert with_transport(plain, None) is plain
    assert with_transport(plain, "ssh").hosts[0].transport == "ssh"
    with pytest.raises(UsageError, match="--transport srun: the hosts of inv.yaml are not"):
        with_transport(plain, "srun")
    slurm = Inventory("slurm", (Host("node1", 0, slurm_job="3"),), Rendezvous())
    assert with_transport(slurm, "srun").hosts[0].transport == "srun"


def test_detach_is_refused_over_srun() -> None:
    refuse_detach([Host("node1", 0, slurm_job="3")])
    with pytest.raises(UsageError, match="--detach: a run over srun cannot outlive"):
        refuse_detach([Host("node1", 0, slurm_job="3", transport="srun")])

"""A Slurm allocation as an inventory: which nodes, in which order, with how many processes.

Slurm describes a running job in two places: the environment of a shell inside it
(``SLURM_JOB_ID``, ``SLURM_TASKS_PER_NODE``) and the controller's ``scontrol -o show job -d
JOBID``, whose per-node lines carry the CPUs and GRES each node holds (``Nodes=gpu[01-02]
CPU_IDs=0-7 Mem=0 GRES=gpu:4(IDX:0-3)``). This module parses both, as text handed to it,
and decides each node's process count: its GPUs when the job has GPUs there, else its
tasks. The GPUs come from the GRES lines because they are the only source that holds for
every node, however the allocation was made: ``SLURM_GPUS_ON_NODE`` and ``SLURM_JOB_GPUS``
are set in a batch script and in job steps, for the one node they run on, and not at all
in an ``salloc`` shell (Slurm 22.05, measured). Node rank *i* is the *i*-th name of the
node list, so the rendezvous is on the first node. Anything unexpected is an
``InventoryError`` that names the job and the text; nothing falls back to localhost.

Pure: no I/O. ``hosts.slurm`` runs the commands, ``run.inputs`` puts the pieces together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from sshddp.errors import InventoryError, UsageError
from sshddp.model.inventory import Host, Inventory, Rendezvous, SlurmRequest, Transport
from sshddp.model.slurm import expand_hostlist, expand_tasks_per_node

__all__ = [
    "CURRENT",
    "Allocation",
    "AllocNode",
    "allocation_hosts",
    "check_not_in_step",
    "current_job",
    "job_ended",
    "parse_job",
    "parse_node_addrs",
    "refuse_detach",
    "slurm_inventory",
    "valid_job_id",
    "with_transport",
]

CURRENT = "current"  #: ``hosts: {slurm: current}``: the allocation this shell is in
_JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10})?")  # a job, or one task of a job array
_FIELD = r"(?:^|\s){}=(\S*)"
_NODE_LINE = re.compile(r"(?:^|\s)Nodes=(\S+)\s+CPU_IDs=(\S*)\s+Mem=\S*\s+GRES=(\S*)")
_GRES_ITEM = re.compile(r"([A-Za-z0-9_]+)(?::([A-Za-z0-9_.-]+))??(?::([0-9]+))?(?:\((.*)\))?")
_RUNNING = ("RUNNING",)
_LIVE = ("RUNNING", "SUSPENDED", "CONFIGURING")  # the job still holds its nodes
_ENDINGS = {
    "CANCELLED": "was cancelled (scancel)",
    "TIMEOUT": "reached its time limit",
    "PREEMPTED": "was preempted",
    "NODE_FAIL": "lost a node (NODE_FAIL)",
    "COMPLETING": "is ending (COMPLETING: cancelled, timed out or preempted)",
    "DEADLINE": "reached its deadline",
    "OUT_OF_MEMORY": "ran out of memory",
}


@dataclass(frozen=True)
class AllocNode:
    """One node of an allocation."""

    name: str  #: the Slurm node name (``srun -w NAME``; an ssh alias over SSH)
    gpus: int  #: GPUs the job holds on the node (GRES ``gpu``)
    tasks: int  #: tasks the job runs on the node
    addr: Optional[str] = None  #: ``NodeAddr``, where the other nodes reach it


@dataclass(frozen=True)
class Allocation:
    """A running job's nodes, in node-rank order."""

    job_id: str
    nodes: tuple[AllocNode, ...]
    tasks_per_node: int = 0  #: ``--ntasks-per-node`` as requested (0: not given)


# ----------------------------------------------------------------------- job ids


def valid_job_id(text: str, where: str) -> str:
    """``text`` if it is a job id (``123``, or ``123_4`` for an array task)."""
    if not _JOB_ID.fullmatch(text):
        raise InventoryError(
            f"{where}: {text!r} is not a Slurm job id; expected digits, as squeue prints "
            "them (e.g. slurm:123456, or 123456_7 for one task of a job array), or "
            f"'{CURRENT}' for the allocation you are in"
        )
    return text


def current_job(environ: Mapping[str, str], where: str) -> str:
    """The job id of the allocation this process runs in (``SLURM_JOB_ID``)."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        raise InventoryError(
            f"{where}: not inside a Slurm allocation (SLURM_JOB_ID is not set). Run sshddp "
            "from `salloc` or a batch script, or name a running job: slurm:JOBID "
            "(`squeue --me` lists yours)"
        )
    return valid_job_id(job, f"{where} (SLURM_JOB_ID)")


def check_not_in_step(environ: Mapping[str, str]) -> None:
    """Refuse to run as one of many tasks of a job step (``srun sshddp ...``): each task
    would launch the whole run again."""
    step = environ.get("SLURM_STEP_ID")
    tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or "1"
    if step is None or not tasks.isdigit() or int(tasks) < 2:
        return
    rank = environ.get("SLURM_PROCID", "?")
    raise UsageError(
        f"sshddp runs here as task {rank} of {tasks} of job step "
        f"{environ.get('SLURM_JOB_ID', '?')}.{step}: `srun sshddp ...` starts one sshddp "
        "per task, and each would launch the whole run. Run sshddp once, in the batch "
        "script itself or the salloc shell, not under srun: it starts one torchrun per "
        "node on its own"
    )


def job_ended(job: str, state: Optional[str]) -> Optional[str]:
    """Why a run's job no longer holds its nodes, in words; None while it does. ``state``
    is the job's ``JobState`` (None: the controller has forgotten the job)."""
    if state in _LIVE:
        return None
    if state is None:
        return f"the Slurm job {job} has ended (the controller no longer knows it)"
    how = _ENDINGS.get(state.split("+")[0], f"has ended ({state})")
    return f"the Slurm job {job} {how}"


# -------------------------------------------------------------- scontrol show job


def _field(text: str, name: str) -> Optional[str]:
    match = re.search(_FIELD.format(re.escape(name)), text)
    return match.group(1) if match else None


def _int_field(text: str, name: str, default: int = 0) -> int:
    value = _field(text, name) or ""
    head = value.split(":")[0]
    return int(head) if head.isdigit() else default


def parse_job(text: str, job_id: str, environ_tasks: Optional[str] = None) -> Allocation:
    """The allocation ``scontrol -o show job -d JOBID`` describes.

    ``environ_tasks`` is ``SLURM_TASKS_PER_NODE`` when this shell is inside the job: the
    exact task count of each node, which the controller's record only implies.
    """
    where = f"Slurm job {job_id}"
    if len(re.findall(r"(?:^|\s)JobId=", text)) != 1:
        raise InventoryError(
            f"{where}: `scontrol show job` described {text.count('JobId=')} jobs; expected "
            "exactly one (a heterogeneous job needs one of its components, e.g. slurm:123+0 "
            "is not supported: name the component's own job id)"
        )
    state = _field(text, "JobState") or "UNKNOWN"
    if state not in _RUNNING:
        reason = _field(text, "Reason")
        why = f" (Reason={reason})" if reason and reason != "None" else ""
        raise InventoryError(
            f"{where} is {state}{why}, not RUNNING: only a running job has nodes to launch "
            "on. Wait until `squeue -j " + job_id + "` shows R, or start one with salloc/sbatch"
        )
    names = expand_hostlist(_field(text, "NodeList") or "")
    per_node = _per_node(text, where)
    missing = [n for n in names if n not in per_node]
    if missing:
        raise InventoryError(
            f"{where}: `scontrol show job -d` gave no CPU/GRES line for {', '.join(missing)}; "
            "is this Slurm older than 20.11?"
        )
    tasks = _tasks(text, names, per_node, environ_tasks, where)
    nodes = tuple(AllocNode(name, per_node[name][1], count) for name, count in zip(names, tasks))
    return Allocation(job_id, nodes, _int_field(text, "NtasksPerN:B:S:C"))


def _per_node(text: str, where: str) -> dict[str, tuple[int, int]]:
    """``{node: (cpus, gpus)}`` from the ``Nodes=... CPU_IDs=... GRES=...`` lines."""
    found: dict[str, tuple[int, int]] = {}
    for match in _NODE_LINE.finditer(text):
        cpus = _count_ids(match.group(2))
        gpus = gres_gpus(match.group(3), where)
        for name in expand_hostlist(match.group(1)):
            found[name] = (cpus, gpus)
    return found


def _count_ids(text: str) -> int:
    """How many ids ``0-3,8`` names."""
    count = 0
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            count += int(high or low) - int(low) + 1
    return count


def gres_gpus(text: str, where: str = "Slurm") -> int:
    """GPUs in a GRES list as scontrol prints it: ``gpu:a100:2(IDX:0-1),nic:1`` -> 2."""
    total = 0
    for item in _split_top(text):
        match = _GRES_ITEM.fullmatch(item)
        if match is None:
            raise InventoryError(
                f"{where}: cannot read the GRES {item!r} (in {text!r}); expected "
                "name[:type]:count[(IDX:...)], as `scontrol show job -d` prints it"
            )
        name, kind, count, detail = match.groups()
        if kind is not None and count is None and kind.isdigit():
            kind, count = None, kind  # gpu:2 reads as name:count
        if name != "gpu":
            continue
        if count is not None:
            total += int(count)
        elif detail and detail.startswith("IDX:"):
            total += _count_ids(detail[4:])
    return total


def _split_top(text: str) -> list[str]:
    """Comma-separated items, ignoring commas inside parentheses."""
    items, depth, start = [], 0, 0
    for pos, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:pos])
            start = pos + 1
    items.append(text[start:])
    return [item for item in items if item and item != "(null)"]


def _tasks(
    text: str,
    names: Sequence[str],
    per_node: Mapping[str, tuple[int, int]],
    environ_tasks: Optional[str],
    where: str,
) -> list[int]:
    """Tasks per node: the environment's exact list, else what the job record implies."""
    if environ_tasks:
        counts = expand_tasks_per_node(environ_tasks)
        if len(counts) != len(names):
            raise InventoryError(
                f"{where}: SLURM_TASKS_PER_NODE={environ_tasks!r} gives {len(counts)} counts "
                f"for {len(names)} nodes; is this shell in another job than SLURM_JOB_ID?"
            )
        return counts
    per = _int_field(text, "NtasksPerN:B:S:C")
    if per > 0:
        return [per] * len(names)
    if _int_field(text, "NumTasks", len(names)) == len(names):
        return [1] * len(names)
    cpus_per_task = max(1, _int_field(text, "CPUs/Task", 1))
    return [max(1, per_node[n][0] // cpus_per_task) for n in names]


# -------------------------------------------------------------- scontrol show node


def parse_node_addrs(text: str) -> dict[str, str]:
    """``{NodeName: NodeAddr}`` from ``scontrol -o show node LIST`` (one node a line)."""
    addrs = {}
    for line in text.splitlines():
        name, addr = _field(line, "NodeName"), _field(line, "NodeAddr")
        if name and addr:
            addrs[name] = addr
    return addrs


# ---------------------------------------------------------------- as an inventory


def allocation_hosts(alloc: Allocation, request: SlurmRequest) -> tuple[Host, ...]:
    """One host per node in node-rank order, with the request's defaults applied.

    A node runs its GPUs' worth of processes when the job holds GPUs there, else one per
    task. ``gpus`` or ``nproc`` under ``defaults:`` override what the allocation says
    (doctor flags a GPU count the step cannot see).
    """
    hosts = []
    for index, node in enumerate(alloc.nodes):
        fields: dict[str, Any] = {
            "gpus": node.gpus or None,
            "nproc": node.tasks,
            "addr": node.addr,
            **request.defaults,
        }
        fields["env"] = dict(request.defaults.get("env", {}))
        fields.setdefault("transport", "ssh")
        hosts.append(Host(node.name, index, line=request.line, slurm_job=alloc.job_id, **fields))
    return tuple(hosts)


def slurm_inventory(alloc: Allocation, request: SlurmRequest, rendezvous: Rendezvous) -> Inventory:
    """The inventory of a resolved ``hosts: {slurm: ...}`` (or ``slurm`` / ``slurm:JOBID``)."""
    source = f"{request.source} (Slurm job {alloc.job_id})"
    return Inventory(source, allocation_hosts(alloc, request), rendezvous)


def refuse_detach(hosts: Sequence[Host]) -> None:
    """``--detach`` cannot work over srun: say why, before anything starts."""
    if any(h.transport == "srun" for h in hosts):
        raise UsageError(
            "--detach: a run over srun cannot outlive this sshddp. Each node's processes "
            "live in a Slurm job step whose srun runs here, and Slurm ends a step's "
            "processes when the step ends. Run without --detach (inside tmux or screen on "
            "a login node, or in a batch script), or use transport: ssh where the nodes "
            "take SSH"
        )


def with_transport(inv: Inventory, transport: Optional[Transport]) -> Inventory:
    """``inv`` with every host reached over ``transport`` (``--transport``); unchanged for
    None. srun reaches only the nodes of a Slurm job."""
    if transport is None:
        return inv
    if transport == "srun" and any(h.slurm_job is None for h in inv.hosts):
        raise UsageError(
            f"--transport srun: the hosts of {inv.source} are not a Slurm job's nodes; srun "
            "starts job steps, so it needs INVENTORY `slurm` (the allocation you are in), "
            "`slurm:JOBID`, or a file with `hosts: {slurm: JOBID}`"
        )
    return replace(inv, hosts=tuple(replace(h, transport=transport) for h in inv.hosts))

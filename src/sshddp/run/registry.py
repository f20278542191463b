"""The local run registry: what this user's runs were, for ps, attach, logs and stop.

One JSON file per run under ``$SSHDDP_STATE_DIR``, else ``$XDG_STATE_HOME/sshddp``, else
``~/.local/state/sshddp``. A ``RunRecord`` holds the hosts, the plan and the log directory,
never an environment value (secrets stay out of it), and, once someone saw the run end,
every node's final state.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Optional

from sshddp import defaults
from sshddp.errors import RunNotFound
from sshddp.model.inventory import Host
from sshddp.model.plan import CodeSpec, LaunchPlan, NodePlan
from sshddp.model.state import RunResult

VERSION = 1  #: of the file format; a record without it was written by version 1


@dataclass(frozen=True)
class NodeRecord:
    """One node of a recorded run: enough to reach it and find its run directory."""

    node_rank: int
    nproc: int
    rundir: str
    host: Host  #: as the inventory gave it, with the env's names only (values are not kept)
    cwd: str = ""  #: the ranks' working directory on the host ("" in older records)


@dataclass(frozen=True)
class NodeEnd:
    """How a node ended, as the coordinator that followed it saw."""

    node_rank: int
    state: str
    returncode: Optional[int]
    reason: str


@dataclass(frozen=True)
class RunRecord:
    """A run, as this machine recorded it at launch (and at its end)."""

    run_id: str
    created: float  #: when it was launched (epoch seconds)
    inventory: str  #: absolute path of the inventory file
    ssh_config: Optional[str]
    log_dir: str  #: absolute path of the run's local logs
    rdzv: tuple[str, int]
    world_size: int
    grace: float
    heartbeat_timeout: float
    code: str  #: what torchrun ran: a script path or a module
    args: tuple[str, ...]
    nodes: tuple[NodeRecord, ...]
    result: Optional[tuple[NodeEnd, ...]] = None  #: every node's end, once seen
    root_cause: Optional[int] = None  #: node rank of the first failure, once seen
    cause: Optional[str] = None  #: what ended the run from outside (its Slurm job), once seen

    @classmethod
    def of(cls, plan: LaunchPlan, inventory: str, ssh_config: Optional[str]) -> RunRecord:
        """The record of a run about to start."""
        nodes = tuple(NodeRecord(n.node_rank, n.nproc, n.rundir, n.host, n.cwd) for n in plan.nodes)
        return cls(
            run_id=plan.run_id,
            created=time.time(),
            inventory=os.path.abspath(inventory),
            ssh_config=os.path.abspath(ssh_config) if ssh_config else None,
            log_dir=os.path.abspath(plan.log_dir),
            rdzv=(plan.rdzv_addr, plan.rdzv_port),
            world_size=plan.world_size,
            grace=plan.grace,
            heartbeat_timeout=plan.heartbeat_timeout,
            code=plan.code.target,
            args=plan.script_args,
            nodes=nodes,
        )

    def ended(self, result: RunResult) -> RunRecord:
        """This record with the run's end as ``result`` saw it."""
        ends = tuple(
            NodeEnd(n.node_rank, n.state.value, n.returncode, n.reason) for n in result.nodes
        )
        return replace(self, result=ends, root_cause=result.root_cause, cause=result.cause)

    def plan(self) -> LaunchPlan:
        """Enough of the run's plan to follow, fetch and stop it."""
        nodes = tuple(
            NodePlan(
                host=n.host,
                node_rank=n.node_rank,
                nproc=n.nproc,
                first_rank=0,
                rundir=n.rundir,
                env={},
                argv=(),
                cwd=n.cwd,
            )
            for n in self.nodes
        )
        return LaunchPlan(
            run_id=self.run_id,
            nodes=nodes,
            rdzv_addr=self.rdzv[0],
            rdzv_port=self.rdzv[1],
            world_size=self.world_size,
            code=CodeSpec("none", self.code),
            script_args=self.args,
            grace=self.grace,
            log_dir=self.log_dir,
            heartbeat_timeout=self.heartbeat_timeout,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "run_id": self.run_id,
            "created": self.created,
            "inventory": self.inventory,
            "ssh_config": self.ssh_config,
            "log_dir": self.log_dir,
            "rdzv": list(self.rdzv),
            "world_size": self.world_size,
            "grace": self.grace,
            "heartbeat_timeout": self.heartbeat_timeout,
            "code": self.code,
            "args": list(self.args),
            "nodes": [_node_json(n) for n in self.nodes],
            "result": None if self.result is None else _result_json(self),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        result = data.get("result") or None
        return cls(
            run_id=data["run_id"],
            created=float(data.get("created", 0)),
            inventory=data.get("inventory", ""),
            ssh_config=data.get("ssh_config"),
            log_dir=data["log_dir"],
            rdzv=(data["rdzv"][0], int(data["rdzv"][1])),
            world_size=int(data["world_size"]),
            grace=float(data.get("grace", defaults.GRACE)),
            heartbeat_timeout=float(data.get("heartbeat_timeout", defaults.HEARTBEAT_TIMEOUT)),
            code=data["code"],
            args=tuple(data["args"]),
            nodes=tuple(_node_of(n) for n in data["nodes"]),
            result=None if result is None else tuple(NodeEnd(**n) for n in result["nodes"]),
            root_cause=None if result is None else result.get("root_cause"),
            cause=None if result is None else result.get("cause"),
        )


def _node_json(node: NodeRecord) -> dict[str, Any]:
    host = {f.name: getattr(node.host, f.name) for f in fields(node.host)}
    host["env"] = sorted(node.host.env)  # names only
    return {
        "node_rank": node.node_rank,
        "nproc": node.nproc,
        "rundir": node.rundir,
        "host": host,
        "cwd": node.cwd,
    }


def _node_of(data: Mapping[str, Any]) -> NodeRecord:
    host = Host(**{**data["host"], "env": {}})  # env values are not kept, nor needed
    return NodeRecord(data["node_rank"], data["nproc"], data["rundir"], host, data.get("cwd", ""))


def _result_json(record: RunRecord) -> dict[str, Any]:
    nodes = [
        {"node_rank": e.node_rank, "state": e.state, "returncode": e.returncode, "reason": e.reason}
        for e in record.result or ()
    ]
    return {"nodes": nodes, "root_cause": record.root_cause, "cause": record.cause}


def state_dir() -> Path:
    explicit = os.environ.get("SSHDDP_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(xdg) / "sshddp"


def runs_dir() -> Path:
    return state_dir() / "runs"


def exists(run_id: str) -> bool:
    return (runs_dir() / f"{run_id}.json").exists()


def save(record: RunRecord) -> None:
    """Write atomically, owner-only."""
    directory = runs_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{record.run_id}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(record.to_json(), fh, indent=1)
    os.replace(tmp, path)


def load(run_id: str) -> RunRecord:
    with open(runs_dir() / f"{run_id}.json") as fh:
        return RunRecord.from_json(json.load(fh))


def run_ids() -> list[str]:
    """Every recorded run id, newest first, from the file names alone (for completion)."""
    try:
        paths = [(p.stat().st_mtime, p.stem) for p in runs_dir().glob("*.json")]
    except OSError:
        return []
    return [stem for _, stem in sorted(paths, reverse=True)]


def all_runs() -> list[RunRecord]:
    """Every readable record, oldest first (an unreadable one is skipped)."""
    out = []
    for path in sorted(runs_dir().glob("*.json")):
        try:
            out.append(RunRecord.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
    return sorted(out, key=lambda r: r.created)


def resolve(prefix: str) -> RunRecord:
    """The run whose id is ``prefix`` or starts with it; exactly one, or RunNotFound."""
    ids = [p.stem for p in runs_dir().glob("*.json")] if runs_dir().is_dir() else []
    if prefix in ids:
        return load(prefix)
    matches = sorted(i for i in ids if i.startswith(prefix)) if prefix else []
    if len(matches) == 1:
        return load(matches[0])
    if not matches:
        raise RunNotFound(
            f"no run {prefix!r} in {runs_dir()}; `sshddp ps --all` lists the runs this "
            "machine knows"
        )
    raise RunNotFound(
        f"run id prefix {prefix!r} is ambiguous: it matches {', '.join(matches[:8])}; type more"
    )

"""The local run registry: what this user's runs were, for ps, attach, logs and stop.

One JSON file per run under ``$SSHDDP_STATE_DIR``, else ``$XDG_STATE_HOME/sshddp``, else
``~/.local/state/sshddp``. It holds the hosts, the plan and the log directory, never an
environment value (secrets stay out of it).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

from sshddp.errors import RunNotFound
from sshddp.inventory import Host
from sshddp.plan import CodeSpec, LaunchPlan, NodePlan

VERSION = 1


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


def _host_record(host: Host) -> dict[str, Any]:
    record = {f.name: getattr(host, f.name) for f in fields(host)}
    record["env"] = sorted(host.env)  # names only
    return record


def record(plan: LaunchPlan, inventory_path: str, ssh_config: Optional[str]) -> dict[str, Any]:
    """The registry entry of a new run (no environment values)."""
    return {
        "version": VERSION,
        "run_id": plan.run_id,
        "created": time.time(),
        "inventory": os.path.abspath(inventory_path),
        "ssh_config": os.path.abspath(ssh_config) if ssh_config else None,
        "log_dir": os.path.abspath(plan.log_dir),
        "rdzv": [plan.rdzv_addr, plan.rdzv_port],
        "world_size": plan.world_size,
        "grace": plan.grace,
        "heartbeat_timeout": plan.heartbeat_timeout,
        "code": plan.code.target,
        "args": list(plan.script_args),
        "nodes": [
            {
                "node_rank": n.node_rank,
                "nproc": n.nproc,
                "rundir": n.rundir,
                "host": _host_record(n.host),
            }
            for n in plan.nodes
        ],  # fmt: skip
        "result": None,
    }


def save(entry: dict[str, Any]) -> None:
    """Write atomically, owner-only."""
    directory = runs_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{entry['run_id']}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(entry, fh, indent=1)
    os.replace(tmp, path)


def load(run_id: str) -> dict[str, Any]:
    with open(runs_dir() / f"{run_id}.json") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def all_runs() -> list[dict[str, Any]]:
    out = []
    for path in sorted(runs_dir().glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: r.get("created", 0))


def resolve(prefix: str) -> dict[str, Any]:
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


def hosts_of(entry: dict[str, Any]) -> list[Host]:
    """The hosts of a recorded run (env values are not kept, and not needed to reach them)."""
    hosts = []
    for node in entry["nodes"]:
        h = dict(node["host"])
        h["env"] = {}
        hosts.append(Host(**h))
    return hosts


def plan_of(entry: dict[str, Any]) -> LaunchPlan:
    """Enough of a recorded run's plan to follow, fetch and stop it."""
    hosts = hosts_of(entry)
    nodes = tuple(
        NodePlan(host=h, node_rank=n["node_rank"], nproc=n["nproc"], first_rank=0,
                 rundir=n["rundir"], env={}, argv=(), cwd="")
        for h, n in zip(hosts, entry["nodes"])
    )  # fmt: skip
    addr, port = entry["rdzv"]
    return LaunchPlan(
        run_id=entry["run_id"], nodes=nodes, rdzv_addr=addr, rdzv_port=port,
        world_size=entry["world_size"], code=CodeSpec("none", entry["code"]),
        script_args=tuple(entry["args"]), grace=entry.get("grace", 10.0),
        log_dir=entry["log_dir"], heartbeat_timeout=entry.get("heartbeat_timeout", 30.0),
    )  # fmt: skip

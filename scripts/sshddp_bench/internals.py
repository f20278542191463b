"""The only module of the benchmarks that imports sshddp itself.

The cases drive sshddp as a user does, through its command line. A few places need more
than the command line: the doctor baseline sends each host exactly the probe header doctor
sends it, the launch baselines put sshddp's rank shim where the dry-run plan expects it,
and the report names the version measured and compiles the package's bytecode. Those reach
into sshddp's internal modules. Every such import is here, behind functions shaped for the
benchmarks, so a new layout changes this one file and nothing that calls it.
"""

from __future__ import annotations

import os
from pathlib import Path

import sshddp
from sshddp.hosts import shipped
from sshddp.hosts.pool import node_addr
from sshddp.hosts.transport import SshOptions
from sshddp.model import commands
from sshddp.model.checks import Context
from sshddp.remote import common
from sshddp.run.inputs import load_inventory
from sshddp.run.preflight import probe_args


def version() -> str:
    """sshddp's version string."""
    return sshddp.__version__


def package_dir() -> Path:
    """The directory of the sshddp package measured (its sources, in this checkout)."""
    return Path(sshddp.__file__).parent


def python_command(python: str) -> str:
    """The remote command line with which sshddp runs shipped code under ``python``."""
    return commands.python_command(python)


def rank_source() -> str:
    """The rank shim every rank's interpreter runs from the node's run directory."""
    return shipped.source("sshddp.remote.rankside.rank")


def probe_headers(inventory: Path, ssh_config: str, port: int) -> dict[str, bytes]:
    """The stdin header ``sshddp doctor`` sends each host of ``inventory`` for a deep probe
    with the rendezvous on ``port``, keyed by the host's ``host`` name. The first host
    also listens on the port, and every host connects to it, as in doctor."""
    inv = load_inventory(str(inventory))
    first = inv.hosts[0]
    rdzv_addr = node_addr(first, SshOptions(ssh_config=ssh_config))  # as doctor does
    ctx = Context(rdzv_addr=rdzv_addr, rdzv_port=port)
    return {
        host.host: shipped.header(
            "host_session",
            {"probe": probe_args(host, ctx, deep=True, listen=host is first, rdzv_ok=True)},
        )
        for host in inv.hosts
    }


def scan_every_process(mark: str) -> int:
    """The node's processes found as teardown finds them (every process of the host looked
    at), as the node's sampler found them before it walked its tree: how many."""
    return len(common.run_pids(None, mark))


def scan_own_tree(mark: str) -> int:
    """The node's processes found as the node's sampler finds them (this process's
    descendants looked at): how many."""
    return len(common.run_pids(None, mark, among=common.descendants(os.getpid())))

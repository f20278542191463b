"""The launch baselines: sshddp's own per-node commands, started by pdsh or an ssh loop.

``sshddp launch --dry-run`` prints each node's working directory, environment and
torchrun command. The baselines run exactly those, with the rank script and sshddp's rank
shim already in place on the hosts, so they differ from sshddp only in how the commands
reach the hosts: no preflight, no code copy, no supervisor. The command's agent shim is
plain torchrun there (``PLAIN_TORCHRUN``): the baselines run torchrun as it comes.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sshddp_bench import internals
from sshddp_bench.harness import Bench, BenchError, expect_rc

#: what the baselines put where a node's command names sshddp's agent shim: ``python -m
#: torch.distributed.run``, run from a file
PLAIN_TORCHRUN = (
    "import runpy\nrunpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)\n"
)


@dataclass(frozen=True)
class NodeCommand:
    """One node of a ``--dry-run`` plan."""

    host: str
    cwd: str
    env: str  #: ``K=V ...`` as --dry-run prints it (shell-quoted)
    command: str


def dry_run(b: Bench, name: str, port: int, inv: Path, *rank_args: str) -> list[NodeCommand]:
    """The per-node torchrun commands sshddp would run, from ``launch --dry-run``."""
    argv = b.launch_argv(name, port, inv, *rank_args)
    argv.insert(len(b.sshddp) + 1, "--dry-run")
    done = expect_rc(b.start(argv).finish(), 0, "sshddp launch --dry-run")
    blocks = "\n".join(t for _, t in done.lines).split("\n\n")
    nodes = [n for n in map(parse_node, blocks) if n is not None]
    if not nodes:
        raise BenchError(f"could not parse the --dry-run plan:\n{done.lines}")
    return nodes


def parse_node(block: str) -> Optional[NodeCommand]:
    """One ``node N: HOST`` block of the --dry-run text (its ``key: value`` lines)."""
    head = re.match(r"node \d+: (\S+)", block)
    if not head:
        return None
    fields = dict(re.findall(r"^  (\w[\w ]*):\s+(.*)$", block, re.M))
    env = fields.get("env", "-")
    return NodeCommand(head.group(1), fields["cwd"], "" if env == "-" else env, fields["command"])


def node_scripts(b: Bench, nodes: Sequence[NodeCommand], name: str, extra_env: str) -> Path:
    """A shell script per host that starts its torchrun as sshddp would (code pre-placed)."""
    out = b.tmp / "nodes" / name
    out.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        Path(node.cwd).mkdir(parents=True, exist_ok=True)
        shutil.copy(b.rank_script, node.cwd)
        # PYTHON RUNDIR/agent.py ... --no-python PYTHON RUNDIR/rank.py SCRIPT ...
        argv = shlex.split(node.command)
        shim = Path(os.path.expanduser(argv[argv.index("--no-python") + 2]))
        shim.parent.mkdir(parents=True, exist_ok=True)
        shim.write_text(internals.rank_source())
        Path(shim.parent, "agent.py").write_text(PLAIN_TORCHRUN)
        line = f"cd {shlex.quote(node.cwd)} && exec env {extra_env} {node.env} {node.command}\n"
        (out / f"node-{node.host}.sh").write_text(line)
    return out


def baseline_argv(b: Bench, how: str, n: int, scripts_dir: Path) -> list[str]:
    """pdsh, or a plain ``ssh host cmd &`` loop, running each host's node script."""
    d = shlex.quote(str(scripts_dir))
    if how == "pdsh":
        return b.pdsh(n, f"sh {d}/node-%h.sh")
    cfg = shlex.quote(b.ssh_config)
    loop = f'for h in {" ".join(b.aliases(n))}; do ssh -F {cfg} "$h" sh {d}/node-$h.sh & done; wait'
    return ["bash", "-c", loop]

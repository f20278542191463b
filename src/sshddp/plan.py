"""Pure planning: inventory + launch options -> a frozen ``LaunchPlan``.

Nothing here connects anywhere; the same plan drives ``--dry-run``, the launch and the run
registry, so what the user reviews is exactly what runs.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Literal, Optional

from sshddp.errors import UsageError
from sshddp.inventory import Host, Inventory

RUN_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_NAME_RE = re.compile(r"(TOKEN|SECRET|PASSW|PASSWD|API_?KEY|CREDENTIAL|AUTH|PRIVATE)", re.I)
MASK = "***"
RANK_SHIM = "rank.py"  #: written into every node's run directory by boot
CodeKind = Literal["file", "tar", "remote", "none"]


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked ``sshddp launch`` for (already parsed, not yet validated)."""

    script: Optional[str] = None  #: local path (shipped) or a path on the hosts
    module: Optional[str] = None  #: ``-m MODULE`` instead of a script
    script_args: tuple[str, ...] = ()  #: passed to the script verbatim
    nproc_per_node: Optional[int] = None  #: overrides every host's gpus / nproc
    port: Optional[int] = None  #: rendezvous port (overrides the inventory)
    env: tuple[tuple[str, str], ...] = ()  #: ``--env`` pairs, applied after the inventory's
    workdir: Optional[str] = None  #: local directory shipped whole (honours .gitignore)
    log_dir: str = "sshddp-logs"  #: local log root
    name: Optional[str] = None  #: run id chosen by the user
    max_restarts: int = 0  #: torchrun ``--max-restarts``
    grace: float = 10.0  #: seconds between SIGTERM and SIGKILL at teardown
    heartbeat_timeout: float = 30.0  #: seconds of silence after which a node counts as lost
    tty: bool = False  #: ranks write to a pty (isatty() true) instead of a pipe


@dataclass(frozen=True)
class CodeSpec:
    """What code every node runs and how it gets there."""

    kind: CodeKind  #: file: one local file; tar: a local directory; remote/none: nothing shipped
    target: str  #: what torchrun runs: a script path relative to the code dir, or a module
    local_path: Optional[str] = None  #: the local file or directory to ship


@dataclass(frozen=True)
class NodePlan:
    """One host's part of the run."""

    host: Host  #: the inventory host
    node_rank: int  #: torchrun ``--node-rank`` (= the host's index in the inventory)
    nproc: int  #: processes on this node
    first_rank: int  #: global rank of local rank 0
    rundir: str  #: remote run directory (``~`` expanded on the host)
    env: Mapping[str, str]  #: inventory env, then ``--env``; the supervisor adds SSHDDP_*
    argv: tuple[str, ...]  #: the torchrun command (argv[0] is the host's python)
    cwd: str  #: working directory of torchrun on the host

    @property
    def mark(self) -> str:
        """The run marker in every process of this node (teardown finds them by it)."""
        return f"{self.rundir.rsplit('/runs/', 1)[-1]}"


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch does, decided before anything connects."""

    run_id: str
    nodes: tuple[NodePlan, ...]
    rdzv_addr: str  #: address every node reaches node 0's rendezvous store at
    rdzv_port: int
    world_size: int
    code: CodeSpec
    script_args: tuple[str, ...]
    grace: float
    log_dir: str  #: local directory of this run's logs
    heartbeat_timeout: float = 30.0  #: supervisors stop the run after this much silence
    secret_names: frozenset[str] = field(default_factory=frozenset)  #: env names to mask
    tty: bool = False  #: ranks write to a pty instead of a pipe

    @property
    def peer_port(self) -> int:
        """Port of node 0's supervisor, which the other supervisors connect to."""
        return self.rdzv_port + 1

    def masked_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` as it may be shown: secret values replaced by ``***``."""
        return {k: (MASK if k in self.secret_names else v) for k, v in env.items()}


def new_run_id() -> str:
    """A short, typeable, random run id."""
    return "".join(secrets.choice(RUN_ID_ALPHABET) for _ in range(6))


def parse_env_pairs(
    items: tuple[str, ...], lookup: Callable[[str], Optional[str]]
) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    """``KEY=VALUE`` or ``KEY`` (value taken from the local environment, never from argv).

    Returns the pairs and the names whose values must never be shown: every ``--env``
    value is treated as a secret.
    """
    pairs: list[tuple[str, str]] = []
    for item in items:
        name, sep, value = item.partition("=")
        if not ENV_NAME_RE.match(name):
            raise UsageError(
                f"--env {item.split('=')[0][:40]!r}: expected KEY=VALUE or KEY with KEY made "
                "of letters, digits and underscores, not starting with a digit"
            )
        if not sep:
            found = lookup(name)
            if found is None:
                raise UsageError(f"--env {name}: no value given and {name} is not set locally")
            value = found
        pairs.append((name, value))
    return tuple(pairs), frozenset(name for name, _ in pairs)


def make_plan(
    inventory: Inventory,
    options: LaunchOptions,
    run_id: str,
    code: CodeSpec,
    addr_of: Callable[[Host], str],
    secret_names: frozenset[str] = frozenset(),
) -> LaunchPlan:
    """Decide node ranks, process counts, the rendezvous endpoint and every command."""
    validate_options(options, run_id)
    hosts = inventory.hosts
    rdzv_addr = inventory.rendezvous.host or addr_of(hosts[0])
    rdzv_port = options.port or inventory.rendezvous.port
    if rdzv_port > 65534:
        raise UsageError(
            f"rendezvous port {rdzv_port}: a run also uses port + 1, so the highest usable "
            f"port is 65534; set `rendezvous: {{port: N}}` in {inventory.source} or --port"
        )
    nprocs = [options.nproc_per_node or h.procs for h in hosts]
    starts = [sum(nprocs[:i]) for i in range(len(hosts))]
    extra_env = dict(options.env)
    secret = secret_names | {k for h in hosts for k in h.env if SECRET_NAME_RE.search(k)}
    rundirs = [run_dir(h.workdir, run_id, i) for i, h in enumerate(hosts)]
    nodes = tuple(
        NodePlan(
            host=h, node_rank=i, nproc=nprocs[i], first_rank=starts[i], rundir=rundirs[i],
            env=MappingProxyType({**h.env, **extra_env}),
            argv=torchrun_argv(h.python, i, len(hosts), nprocs[i], rdzv_addr, rdzv_port,
                               run_id, options, code, rundirs[i]),
            cwd=_cwd(code, rundirs[i]),
        )
        for i, h in enumerate(hosts)
    )  # fmt: skip
    return LaunchPlan(
        run_id=run_id, nodes=nodes, rdzv_addr=rdzv_addr, rdzv_port=rdzv_port,
        world_size=sum(nprocs), code=code, script_args=options.script_args,
        grace=options.grace, log_dir=f"{options.log_dir.rstrip('/')}/{run_id}",
        heartbeat_timeout=options.heartbeat_timeout,
        secret_names=frozenset(secret), tty=options.tty,
    )  # fmt: skip


def validate_options(options: LaunchOptions, run_id: str) -> None:
    """Reject option values no launch can use (the CLI already checked types)."""
    if not RUN_ID_RE.match(run_id):
        raise UsageError(
            f"--name {run_id!r}: expected 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if options.nproc_per_node is not None and options.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node {options.nproc_per_node}: expected at least 1")
    if options.port is not None and not 1 <= options.port <= 65534:
        raise UsageError(
            f"--port {options.port}: expected a TCP port, 1-65534 (a run also uses port + 1)"
        )
    if options.heartbeat_timeout <= 0:
        raise UsageError("--heartbeat-timeout must be positive")
    if options.grace < 0 or options.max_restarts < 0:
        raise UsageError("--grace and --max-restarts must not be negative")


def run_dir(workdir: str, run_id: str, node_rank: int) -> str:
    """Remote directory of one node of a run (per node: test hosts may share a disk)."""
    return f"{workdir.rstrip('/')}/runs/{run_id}/n{node_rank}"


def _cwd(code: CodeSpec, rundir: str) -> str:
    return f"{rundir}/code" if code.kind in ("file", "tar") else "~"


def endpoint(addr: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 address."""
    return f"[{addr}]:{port}" if ":" in addr and not addr.startswith("[") else f"{addr}:{port}"


def torchrun_argv(
    python: str,
    node_rank: int,
    nnodes: int,
    nproc: int,
    rdzv_addr: str,
    rdzv_port: int,
    run_id: str,
    options: LaunchOptions,
    code: CodeSpec,
    rundir: str,
) -> tuple[str, ...]:
    """torchrun with a static rendezvous, so host i gets node rank i deterministically.

    Ranks start through ``rank.py`` in the run directory rather than torchrun's default
    ``python -u``: it runs the script unchanged but line-buffers stdout and stderr, so each
    line is one write and lines of the ranks sharing the node's log pipe never mix.
    """
    argv = [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes),
        "--node-rank", str(node_rank),
        "--nproc-per-node", str(nproc),
        "--rdzv-backend", "static",
        "--rdzv-endpoint", endpoint(rdzv_addr, rdzv_port),
        "--rdzv-id", run_id,
        "--max-restarts", str(options.max_restarts),
        "--no-python", python, f"{rundir}/{RANK_SHIM}",
    ]  # fmt: skip
    program = ["-m", code.target] if options.module else [code.target]
    return (*argv, *(torchrun_literal(a) for a in (*program, *options.script_args)))


def torchrun_literal(arg: str) -> str:
    """``arg`` as torchrun must receive it for the script to get exactly ``arg``.

    torchrun passes every argument after the program through ``string.Template``
    (``safe_substitute(local_rank=...)``), so ``$$`` would arrive as ``$`` and
    ``${local_rank}`` as ``0``; with every ``$`` doubled it gives back the text unchanged.
    """
    return arg.replace("$", "$$")


def describe(plan: LaunchPlan) -> str:
    """The ``--dry-run`` text: stable, one block per node, secrets masked."""
    lines = [
        f"run id:      {plan.run_id}",
        f"rendezvous:  {endpoint(plan.rdzv_addr, plan.rdzv_port)} (static, node 0 hosts it)",
        f"world size:  {plan.world_size} processes on {len(plan.nodes)} nodes",
        f"code:        {plan.code.kind} {plan.code.local_path or plan.code.target}",
        f"logs:        {plan.log_dir}/",
        "output:      " + ("a terminal (--tty)" if plan.tty else "a pipe; ranks line-buffered"),
    ]
    for node in plan.nodes:
        last = node.first_rank + node.nproc - 1
        env = plan.masked_env(node.env)
        lines += [
            "",
            f"node {node.node_rank}: {node.host.host}  (global ranks {node.first_rank}-{last})",
            f"  run dir: {node.rundir}",
            f"  cwd:     {node.cwd}",
            "  env:     " + (" ".join(f"{k}={_shown(v)}" for k, v in env.items()) or "-"),
            "  command: " + shlex.join(node.argv),
        ]
    return "\n".join(lines) + "\n"


def _shown(value: str) -> str:
    return value if value == MASK else shlex.quote(value)

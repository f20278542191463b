"""Pure planning: inventory + launch options -> a frozen ``LaunchPlan``.

Nothing here connects anywhere or reads a file; the same plan drives ``--dry-run``, the
preflight, the launch and the run registry, so what the user reviews is exactly what runs.
Which code ships is decided here too (``decide_code``), from facts about local paths that
the caller supplies (``LocalPaths``).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Callable, Literal, Optional, Protocol

from sshddp import defaults
from sshddp.errors import UsageError
from sshddp.model import envvars
from sshddp.model.commands import Program, TorchrunOptions, endpoint
from sshddp.model.envvars import MASK, EnvPairs, hide_url_credentials
from sshddp.model.inventory import Host, Inventory
from sshddp.model.launchers import (
    Launcher,
    NodeFigures,
    expand,
    launcher_env,
    spec_launcher,
)
from sshddp.model.layout import NodeLayout, RunLayout
from sshddp.model.share import normalized, share_problem
from sshddp.model.torchrun import torchrun_args
from sshddp.protocol import compose, contract

#: what the ranks get when the user's console is a terminal: rich (Lightning's progress bar)
#: then redraws its live display over the ranks' pipe as it would on a terminal, and the
#: console redraws it in place (``model.bars``); unset, it prints only its final frame.
LIVE_ENV = MappingProxyType({"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"})
RUN_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  #: whole: fullmatch
CodeKind = Literal["file", "tar", "remote", "none"]
PathKind = Literal["file", "dir", "missing"]


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked ``sshddp launch`` for (already parsed, not yet validated)."""

    script: Optional[str] = None  #: local path (shipped) or a path on the hosts
    module: Optional[str] = None  #: ``-m MODULE`` instead of a script
    script_args: tuple[str, ...] = ()  #: passed to the script verbatim
    nproc_per_node: Optional[int] = None  #: overrides every host's gpus / nproc
    port: Optional[int] = None  #: rendezvous port (overrides the inventory); AUTO_PORT: picked
    env: EnvPairs = ()  #: ``--env`` pairs, applied after the inventory's
    workdir: Optional[str] = None  #: local directory shipped whole (honours .gitignore)
    log_dir: str = defaults.LOG_DIR  #: local log root
    name: Optional[str] = None  #: run id chosen by the user
    max_restarts: int = 0  #: times the whole run starts again after a failure (the supervisors')
    #: --min-nodes: the fewest nodes the run goes on with, no spare left (0: the inventory's)
    min_nodes: int = 0
    grace: float = defaults.GRACE  #: seconds between SIGTERM and SIGKILL at teardown
    heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT  #: silence that counts as lost
    tty: bool = False  #: ranks write to a pty (isatty() true) instead of a pipe
    tty_size: tuple[int, int] = defaults.TTY_SIZE  #: the pty's columns and rows (--tty)
    live: bool = False  #: the user's console is a terminal: the ranks' rich draws live (LIVE_ENV)
    launcher: Launcher = "torchrun"  #: torchrun, or one process per node (``node``)
    command: tuple[str, ...] = ()  #: ``--launcher node -- COMMAND``, placeholders unexpanded
    torchrun_args: tuple[str, ...] = ()  #: ``--torchrun-arg`` options, passed to torchrun
    local_rank_arg: bool = False  #: append ``--local_rank=N`` to the script's arguments
    fresh_cwd: bool = False  #: a new working directory per run instead of the workspace
    init_timeout: float = defaults.INIT_TIMEOUT  #: seconds for the world to form; 0: off
    stall_timeout: float = 0.0  #: seconds with no output from any rank that stall; 0: off
    on_stall: str = defaults.ON_STALL  #: "stop" or "report"
    share: tuple[str, ...] = ()  #: ``--share`` paths: node 0's copy goes to every node
    include: tuple[str, ...] = ()  #: ``--include`` patterns: ignored --workdir files that ship
    #: ``--quarantine-for``: seconds a host that ends the run stays out (None: the default)
    quarantine_for: Optional[float] = None
    #: the run ends when the caller's process does (the Python API; no CLI option)
    end_with_caller: bool = False


@dataclass(frozen=True)
class CodeSpec:
    """What code every node runs and how it gets there."""

    kind: CodeKind  #: file: one local file; tar: a local directory; remote/none: nothing shipped
    target: str  #: what torchrun runs: a script path relative to the code dir, or a module
    local_path: Optional[str] = None  #: the local file or directory to ship
    home: Optional[str] = None  #: the local directory (resolved) whose workspace the ranks use
    include: tuple[str, ...] = ()  #: --include: ignored files of a --workdir sent all the same


class LocalPaths(Protocol):
    """What the planner may know of this machine's files (given by the caller)."""

    def kind(self, path: str) -> PathKind: ...
    def resolve(self, path: str) -> str: ...  #: absolute, symlinks resolved


@dataclass(frozen=True)
class NodePlan(NodeLayout):
    """One host's part of the run: its layout, and how the launch starts it there."""

    env: Mapping[str, str]  #: inventory env, then ``--env``; the supervisor adds SSHDDP_*
    program: Program  #: what the node runs (through torchrun, or its own launcher)
    workspace: Optional[str] = None  #: the cwd when it outlives the run: code is linked in
    torchrun: Optional[TorchrunOptions] = None  #: torchrun's options; None: no torchrun
    #: a spare (``--max-restarts``): staged and started like a node, its supervisor waits in
    #: the run's mesh with no node rank (``node_rank`` is its slot there: N, N + 1, ...)
    #: until node 0 gives it a lost node's
    spare: bool = False

    @property
    def layout(self) -> NodeLayout:
        """The node's layout alone (what commands on a recorded run know of it too)."""
        return NodeLayout(
            self.host, self.node_rank, self.nproc, self.first_rank, self.rundir, self.cwd
        )


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch does, decided before anything connects."""

    run_id: str
    nodes: tuple[NodePlan, ...]
    rdzv_addr: str  #: address every node reaches node 0's rendezvous store at
    rdzv_port: int  #: defaults.AUTO_PORT until the preflight picks one (``with_port``)
    world_size: int
    code: CodeSpec
    script_args: tuple[str, ...]
    grace: float
    log_dir: str  #: local directory of this run's logs
    heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT  #: silence that stops the run
    secret_names: frozenset[str] = field(default_factory=frozenset)  #: env names to mask
    tty: bool = False  #: ranks write to a pty instead of a pipe
    tty_size: tuple[int, int] = defaults.TTY_SIZE  #: its columns and rows: the user's terminal's
    keep_runs: int = defaults.KEEP_RUNS  #: run directories a host keeps, this run included
    nproc_per_node: Optional[int] = None  #: the user's override of every host's count
    launcher: Launcher = "torchrun"  #: what each node starts: torchrun, or its own launcher
    command: tuple[str, ...] = ()  #: a node launcher's command (``-- COMMAND``), if any
    nonce: str = ""  #: random, one per launch: no two runs' node marks are ever the same
    watch: tuple[float, float, str] = (0.0, 0.0, defaults.ON_STALL)  #: init, stall, on-stall
    max_restarts: int = 0  #: times every node starts again together after a failure
    min_nodes: int = 0  #: the fewest nodes a restart goes on with, no spare left (0: all)
    share: tuple[str, ...] = ()  #: paths in the ranks' cwd made node 0's on every node first
    end_with_caller: bool = False  #: the nodes stop when the launch's sessions end (the API)

    @property
    def layout(self) -> RunLayout:
        """What commands on the run share with the launch: its nodes, logs and grace."""
        nodes = tuple(n.layout for n in self.nodes)
        spares = frozenset(n.node_rank for n in self.nodes if n.spare)
        return RunLayout(self.run_id, self.log_dir, nodes, self.grace, spares)

    def mark(self, node: NodePlan) -> str:
        """The marker in every process of ``node`` (teardown finds them by it): the run id
        and node rank for people, and this launch's nonce, so that stopping this run never
        touches another one, whatever its name or workdir."""
        return f"{self.run_id}/n{node.node_rank}/{self.nonce}"

    @property
    def peer_port(self) -> int:
        """Port of node 0's supervisor, which the other supervisors connect to."""
        return self.rdzv_port + 1

    def masked_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` as it may be shown: secret values replaced by ``***``."""
        return envvars.masked(env, self.secret_names)

    def argv(self, node: NodePlan) -> tuple[str, ...]:
        """The command line ``node``'s supervisor starts, composed from its spec.json as the
        host composes it (the host uses the interpreter the inventory's python resolves
        to, and the run directory with ``~`` expanded)."""
        return tuple(compose.node_argv(self.spec(node), node.host.python, node.rundir))

    @property
    def running(self) -> tuple[NodePlan, ...]:
        """The nodes that run from the start (the spares wait)."""
        return tuple(n for n in self.nodes if not n.spare)

    def spec(self, node: NodePlan) -> contract.SpecRecord:
        """What the node's spec.json holds (the host contract)."""
        running = self.running
        spec: contract.SpecRecord = {
            "schema": contract.SCHEMA,
            "run_id": self.run_id,
            "node_rank": node.node_rank,
            "program": node.program.record(),
            "cwd": node.cwd,
            "grace": self.grace,
            "mark": self.mark(node),
            "peers": {
                "nnodes": len(running),
                "addr": self.rdzv_addr,
                "port": self.peer_port,
                "timeout": self.heartbeat_timeout,
                "hosts": [n.host.host for n in running],
            },
            "tty": self.tty,
            "tty_size": list(self.tty_size),
            "launcher": spec_launcher(self.launcher, self.command),
            "watch": {
                "init_timeout": self.watch[0],
                "stall_timeout": self.watch[1],
                "on_stall": self.watch[2],
                "nprocs": [n.nproc for n in running],
            },
            "restarts": self.max_restarts,
        }
        if self.min_nodes:
            spec["min_nodes"] = self.min_nodes
        if self.share and self.max_restarts:
            spec["share"] = list(self.share)
        if len(running) < len(self.nodes):
            spec["peers"]["spares"] = [n.host.host for n in self.nodes if n.spare]
        if node.spare:
            spec["spare"] = True
        if node.spare:  # its look at its health when node 0 needs it
            spec["health"] = {
                "command": node.host.health,
                "timeout": defaults.HEALTH_TIMEOUT,
                "keep": defaults.HEALTH_OUTPUT,
                "gpus": node.host.gpus,
            }
        if node.torchrun is not None:
            spec["torchrun"] = node.torchrun.record()
        return spec


def new_run_id() -> str:
    """A short, typeable, random run id."""
    return "".join(secrets.choice(RUN_ID_ALPHABET) for _ in range(6))


def check_run_id(run_id: str) -> None:
    """Refuse a ``--name`` that cannot be a run id (before it names any file)."""
    if not RUN_ID_RE.fullmatch(run_id):
        shown = repr(run_id)
        if len(run_id) > 70:
            shown = f"{run_id[:64]!r}... ({len(run_id)} characters)"
        raise UsageError(
            f"--name {shown}: expected 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


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
    _check_fresh_cwd(options, code)
    hosts = inventory.hosts
    rdzv = (inventory.rendezvous.host or addr_of(hosts[0]), _rdzv_port(inventory, options))
    nprocs = [options.nproc_per_node or h.procs for h in hosts]
    nodes = []
    for i, h in enumerate(hosts):
        figures = NodeFigures(i, len(hosts), nprocs[i], sum(nprocs), *rdzv)
        nodes.append(_node(options, code, h, figures, sum(nprocs[:i]), run_id))
    nodes += _spares(inventory, options, code, run_id, rdzv, sum(nprocs))
    return LaunchPlan(
        run_id=run_id,
        nodes=tuple(nodes),
        rdzv_addr=rdzv[0],
        rdzv_port=rdzv[1],
        world_size=sum(nprocs),
        code=code,
        script_args=options.script_args,
        grace=options.grace,
        log_dir=f"{options.log_dir.rstrip('/')}/{run_id}",
        heartbeat_timeout=options.heartbeat_timeout,
        secret_names=envvars.secret_names(secret_names, [h.env for h in hosts]),
        tty=options.tty,
        tty_size=options.tty_size,
        nproc_per_node=options.nproc_per_node,
        launcher=options.launcher,
        command=options.command,
        nonce=secrets.token_hex(6),
        watch=(options.init_timeout, options.stall_timeout, options.on_stall),
        max_restarts=options.max_restarts,
        min_nodes=_least(inventory, options),
        share=normalized((*inventory.share, *options.share)),
        end_with_caller=options.end_with_caller,
    )


def _node(
    options: LaunchOptions,
    code: CodeSpec,
    host: Host,
    figures: NodeFigures,
    first_rank: int,
    run_id: str,
) -> NodePlan:
    """One host's part: where it runs, with what environment, and its command."""
    rundir = run_dir(host.workdir, run_id, figures.node_rank)
    space = None if options.fresh_cwd else workspace_dir(host.workdir, code)
    live = LIVE_ENV if options.live else {}
    env = {**live, **host.env, **dict(options.env), **launcher_env(options.launcher, figures)}
    return NodePlan(
        host=host,
        node_rank=figures.node_rank,
        nproc=figures.nproc,
        first_rank=first_rank,
        rundir=rundir,
        env=MappingProxyType(env),
        program=_program(options, code, figures),
        cwd=space or _cwd(code, rundir),
        workspace=space,
        torchrun=_torchrun(options, figures, run_id),
    )


def _least(inventory: Inventory, options: LaunchOptions) -> int:
    """``--min-nodes`` (else the inventory's ``min_nodes``), within the hosts' count."""
    least = options.min_nodes or inventory.min_nodes
    if not 0 <= least <= len(inventory.hosts):
        raise UsageError(
            f"--min-nodes {least}: expected a whole number of nodes from 1 to "
            f"{len(inventory.hosts)} (the inventory's hosts)"
        )
    return least


def stages_spares(options: LaunchOptions) -> bool:
    """Whether a launch with ``options`` stages the inventory's spares with the run (to
    take a lost node's place mid-run): with restarts, under torchrun."""
    return options.max_restarts > 0 and options.launcher == "torchrun"


def _spares(
    inventory: Inventory,
    options: LaunchOptions,
    code: CodeSpec,
    run_id: str,
    rdzv: tuple[str, int],
    world: int,
) -> list[NodePlan]:
    """The spares staged with the run, each waiting in slot N + i (with restarts only: a
    spare takes a lost node's place in the run's next attempt)."""
    if not stages_spares(options):
        return []
    count, out = len(inventory.hosts), []
    for i, spare in enumerate(inventory.spares):
        host = replace(spare, index=count + i)  # the pool keys its hosts by index
        figures = NodeFigures(count + i, count, options.nproc_per_node or host.procs, world, *rdzv)
        out.append(replace(_node(options, code, host, figures, world, run_id), spare=True))
    return out


def _program(options: LaunchOptions, code: CodeSpec, node: NodeFigures) -> Program:
    """What the node runs: the script or module, or a node launcher's command (its
    placeholders filled)."""
    if options.launcher == "node" and options.command:
        command = expand(options.command, node.placeholders())
        return Program("command", command[0], command[1:])
    return Program("module" if options.module else "script", code.target, options.script_args)


def _torchrun(options: LaunchOptions, node: NodeFigures, run_id: str) -> Optional[TorchrunOptions]:
    """torchrun's options for the node; None for a node launcher."""
    if options.launcher == "node":
        return None
    return TorchrunOptions(
        nnodes=node.nnodes,
        node_rank=node.node_rank,
        nproc=node.nproc,
        rdzv_endpoint=endpoint(node.master_addr, node.master_port),
        rdzv_id=run_id,
        options=options.torchrun_args,
        local_rank_arg=options.local_rank_arg,
    )


def _check_fresh_cwd(options: LaunchOptions, code: CodeSpec) -> None:
    if options.fresh_cwd and code.kind not in ("file", "tar"):
        raise UsageError(
            "--fresh-cwd: only for code sshddp ships (a local script or --workdir); a script "
            "or module already on the hosts runs in the home directory"
        )


def with_port(
    inventory: Inventory, options: LaunchOptions, plan: LaunchPlan, port: int
) -> LaunchPlan:
    """The plan again, with the rendezvous port node 0 picked (``--port auto``): torchrun's
    endpoint, the supervisors' port (``peer_port``), and a node launcher's MASTER_PORT and
    ``{master_port}`` all follow it."""
    picked = replace(options, port=port)
    addr = plan.rdzv_addr
    again = make_plan(inventory, picked, plan.run_id, plan.code, lambda h: addr, plan.secret_names)
    return replace(again, nonce=plan.nonce)  # the same launch: its nodes' marks stay


def _rdzv_port(inventory: Inventory, options: LaunchOptions) -> int:
    port = options.port or inventory.rendezvous.port
    if port > 65534:
        raise UsageError(
            f"rendezvous port {port}: a run also uses port + 1, so the highest usable "
            f"port is 65534; set `rendezvous: {{port: N}}` in {inventory.source} or --port"
        )
    return port


def validate_options(options: LaunchOptions, run_id: str) -> None:
    """Reject option values no launch can use (the CLI already checked types)."""
    check_run_id(run_id)
    if options.nproc_per_node is not None and options.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node {options.nproc_per_node}: expected at least 1")
    auto = options.port == defaults.AUTO_PORT
    if options.port is not None and not auto and not 1 <= options.port <= 65534:
        raise UsageError(
            f"--port {options.port}: expected a TCP port, 1-65534 (a run also uses port + 1), "
            "or auto"
        )
    if options.heartbeat_timeout <= 0:
        raise UsageError("--heartbeat-timeout must be positive")
    if min(options.init_timeout, options.stall_timeout) < 0:
        raise UsageError("--init-timeout and --stall-timeout must not be negative (0: off)")
    if options.grace < 0 or options.max_restarts < 0:
        raise UsageError("--grace and --max-restarts must not be negative")
    if options.launcher == "node" and options.max_restarts:
        raise UsageError(
            "--max-restarts is torchrun's: with --launcher node the node's own launcher "
            "decides about restarts"
        )
    if options.launcher == "node" and (options.torchrun_args or options.local_rank_arg):
        raise UsageError(
            "--torchrun-arg and --local-rank-arg are for torchrun launches; with --launcher "
            "node the node's own launcher starts the workers"
        )
    torchrun_args(options.torchrun_args)
    if options.include and not options.workdir:
        raise UsageError("--include picks ignored files of a --workdir: give --workdir DIR too")
    for path in options.share:
        problem = share_problem(path)
        if problem:
            raise UsageError(f"--share {path}: {problem}")


def run_dir(workdir: str, run_id: str, node_rank: int) -> str:
    """Remote directory of one node of a run (per node: test hosts may share a disk)."""
    return f"{workdir.rstrip('/')}/runs/{run_id}/n{node_rank}"


def _cwd(code: CodeSpec, rundir: str) -> str:
    return f"{rundir}/{contract.CODE}" if code.kind in ("file", "tar") else "~"


def workspace_dir(workdir: str, code: CodeSpec) -> Optional[str]:
    """The host directory that a shipped script's local directory (or a ``--workdir``) runs
    in, run after run: ``<workdir>/work/<name>-<hash>``, named after the local directory and
    keyed by its resolved path, so the same local directory always finds it again. None when
    nothing is shipped: a script or module already on the host runs in the home directory,
    which outlives every run anyway."""
    if code.kind not in ("file", "tar") or not code.home:
        return None
    name = re.sub(r"[^A-Za-z0-9._-]", "_", posixpath.basename(code.home.rstrip("/"))).lstrip(".")
    key = hashlib.sha256(code.home.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return f"{workdir.rstrip('/')}/{contract.WORKSPACES}/{name or 'root'}-{key}"


# --- which code ships ------------------------------------------------------------------------


def decide_code(options: LaunchOptions, paths: LocalPaths) -> CodeSpec:
    """Decide how the script or module reaches the hosts."""
    if options.command:  # a node launcher's own command: only a --workdir ships
        if not options.workdir:
            return CodeSpec("none", options.command[0])
        root = paths.resolve(options.workdir)
        if paths.kind(root) != "dir":
            raise UsageError(f"--workdir {options.workdir}: not a local directory")
        # it runs in the workspace
        return CodeSpec("tar", options.command[0], root, root, options.include)
    if options.workdir:
        return _workdir_code(options, options.workdir, paths)
    if options.module:
        return CodeSpec("none", options.module)
    assert options.script is not None
    kind = paths.kind(options.script)
    if kind == "dir":
        raise UsageError(f"{options.script}: is a directory; pass a script, or use --workdir")
    if kind == "file":
        local = PurePosixPath(options.script)
        return CodeSpec("file", local.name, str(local), paths.resolve(str(local.parent)))
    # Not here: taken as a path on the hosts, relative to the remote home directory.
    target = options.script[2:] if options.script.startswith("~/") else options.script
    return CodeSpec("remote", target)


def _workdir_code(options: LaunchOptions, workdir: str, paths: LocalPaths) -> CodeSpec:
    """The script (or module) inside a shipped --workdir, as a path relative to it."""
    root = paths.resolve(workdir)
    if paths.kind(root) != "dir":
        raise UsageError(f"--workdir {workdir}: not a local directory")
    if options.module:
        return CodeSpec("tar", options.module, root, root, options.include)
    assert options.script is not None
    script = options.script
    candidates = [script] if posixpath.isabs(script) else [posixpath.join(root, script), script]
    for candidate in (paths.resolve(c) for c in candidates):
        inside = candidate.startswith(root.rstrip("/") + "/")
        if inside and paths.kind(candidate) == "file":
            rel = posixpath.relpath(candidate, root)
            return CodeSpec("tar", rel, root, root, options.include)
    raise UsageError(
        f"{options.script}: not a file inside --workdir {workdir} (give the script "
        "relative to that directory)"
    )


# --- the --dry-run text ----------------------------------------------------------------------


def describe(plan: LaunchPlan) -> str:
    """The ``--dry-run`` text: stable, one block per node, secrets masked (and the
    credentials of any URL in a value or an argument)."""
    auto = plan.rdzv_port == defaults.AUTO_PORT
    where = _auto_endpoint(plan) if auto else endpoint(plan.rdzv_addr, plan.rdzv_port)
    picked = "; the preflight picks a free port pair there" if auto else ""
    lines = [
        f"run id:      {plan.run_id}",
        f"rendezvous:  {where} (static, node 0 hosts it{picked})",
        f"world size:  {plan.world_size} processes on {len(plan.nodes)} nodes",
        f"code:        {plan.code.kind} {plan.code.local_path or plan.code.target}",
        f"logs:        {plan.log_dir}/",
        "output:      " + ("a terminal (--tty)" if plan.tty else "a pipe; ranks line-buffered"),
        "launcher:    "
        + ("torchrun" if plan.launcher == "torchrun" else "node (one process per node)"),
    ]
    if plan.share:
        lines.append(f"share:       {' '.join(plan.share)} (node 0's copy, to every node first)")
    for node in plan.nodes:
        last = node.first_rank + node.nproc - 1
        env = plan.masked_env(node.env)
        lines += [
            "",
            f"node {node.node_rank}: {node.host.host}  (global ranks {node.first_rank}-{last})",
            f"  run dir: {node.rundir}",
            f"  cwd:     {node.cwd}",
            "  env:     " + (" ".join(f"{k}={_shown(v)}" for k, v in env.items()) or "-"),
            "  command: " + shlex.join(map(hide_url_credentials, _shown_argv(plan, node))),
        ]
    return "\n".join(lines) + "\n"


def _shown_argv(plan: LaunchPlan, node: NodePlan) -> list[str]:
    """The node's command as --dry-run shows it: the composer's (``compose.node_argv``),
    where an endpoint still to be picked reads ``addr:auto``."""
    spec = plan.spec(node)
    if plan.rdzv_port == defaults.AUTO_PORT:
        picked, auto = endpoint(plan.rdzv_addr, plan.rdzv_port), _auto_endpoint(plan)
        if "torchrun" in spec:
            spec["torchrun"]["rdzv_endpoint"] = auto
        args = spec["program"]["args"]
        spec["program"]["args"] = [auto if a == picked else a for a in args]
    return compose.node_argv(spec, node.host.python, node.rundir)


def _auto_endpoint(plan: LaunchPlan) -> str:
    """``addr:auto`` (``[addr]:auto`` for IPv6): the endpoint before the port is picked."""
    return endpoint(plan.rdzv_addr, 0)[:-1] + "auto"


def _shown(value: str) -> str:
    return value if value == MASK else shlex.quote(value)
